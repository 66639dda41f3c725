"""The fairseq side of bench/bench_lightconv_vs_fairseq.py (runs in bench/fairseq-venv).

Standalone: it imports fairseq and torch only, never convseq. A case is one of:

* ``load``: read the checkpoint ``ckpt`` (written by convseq's save_fairseq) with fairseq's
  ``checkpoint_utils.load_model_ensemble_and_task`` (its strict load) and give the
  teacher-forced log-probabilities of the batch (eval mode, fp32);
* ``build``: let fairseq build a model from a command line (``fairseq-train``'s parser, the
  named arch), move its parameters off their initial values, write its checkpoint with
  fairseq's own Trainer.save_checkpoint (dictionaries beside it), and give its log-probabilities;
* ``beam``: read ``ckpt`` and translate the batches with SequenceGenerator as
  bench/fairseq_side.py does (beam ``beam``), giving each sentence's best hypothesis.

    bench/fairseq-venv/bin/python bench/lightconv_fairseq_side.py --cases IN.pt --out OUT.pt
"""

from __future__ import annotations

import argparse
import os

from fairseq_cases_side import serve  # bench/, beside this script


def log_probs(model, batch: dict):
    import torch

    model.eval()
    with torch.no_grad():
        out = model(batch["src_tokens"], batch["src_lengths"], batch["prev_output_tokens"])
        return model.get_normalized_probs(out, log_probs=True).float()  # (B, T, V)


def load(case: dict) -> dict:
    from fairseq import checkpoint_utils

    data = os.path.dirname(os.path.abspath(case["ckpt"]))
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [case["ckpt"]], arg_overrides={"data": data}
    )
    return {"log_probs": log_probs(models[0], case["batch"]), "arch": cfg.model._name}


def write_dicts(folder: str, sizes: dict) -> None:
    """dict.<lang>.txt with ``size`` symbols in all (4 specials + words), fairseq's format."""
    from fairseq.data import Dictionary

    for lang, size in sizes.items():
        d = Dictionary()
        for i in range(size - len(d)):
            d.add_symbol(f"{lang}{i}", n=1000 - i)
        d.save(os.path.join(folder, f"dict.{lang}.txt"))


def build(case: dict) -> dict:
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    folder = case["dir"]
    os.makedirs(folder, exist_ok=True)
    write_dicts(folder, case["dict_sizes"])
    parser = options.get_training_parser()
    argv = [folder, "--source-lang", "src", "--target-lang", "tgt", "--cpu", "--optimizer"]
    argv += ["adam", "--lr", "0.0005", "--save-dir", folder, *case["argv"]]
    args = options.parse_args_and_arch(parser, input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(case["seed"])
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    with torch.no_grad():  # off the initial values (zero biases, unit norms), as after training
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    path = os.path.join(folder, "checkpoint_last.pt")
    trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
    trainer.save_checkpoint(path, {"train_iterator": {"epoch": 1}, "val_loss": None})
    return {"log_probs": log_probs(model, case["batch"]), "ckpt": path}


def beam(case: dict) -> dict:
    from fairseq_side import load_generator, translate  # bench/, beside this script

    opts = argparse.Namespace(ckpt=case["ckpt"], beam=case["beam"], prepare="auto", max_len_b=200)
    models, generator = load_generator(opts)
    out = translate(models, generator, case["batches"])
    return {"hyps": out["hyps"], "seconds": out["seconds"]}


def run_case(case: dict) -> dict:
    return {"load": load, "build": build, "beam": beam}[case["kind"]](case)


if __name__ == "__main__":
    serve(run_case, __doc__.split("\n")[0])
