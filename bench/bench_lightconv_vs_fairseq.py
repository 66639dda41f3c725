"""convseq's LightConv / DynamicConv model against fairseq 0.12's, end to end: checkpoints both
ways, teacher-forced log-probabilities, beam search.

1. convseq -> fairseq: for each setting below convseq builds a small model (parameters moved off
   their initial values), writes it with ``save_fairseq`` (args and cfg forms in turn) and
   fairseq reads it with ``checkpoint_utils.load_model_ensemble_and_task`` (strict).
   fairseq -> convseq: fairseq builds a model from fairseq-train's command line, writes it with
   its own ``Trainer.save_checkpoint``, and convseq reads it with ``load_fairseq`` (strict).
2. Each pair's teacher-forced log-probabilities of one batch (6 sentences, sources left-padded
   as fairseq's translation task pads them, targets right-padded, shorter and longer than the
   decoder kernels), fp32, eval mode (dropout off): the largest absolute difference and whether
   the two are bit-equal.
3. Beam 5: a trained convseq checkpoint (``--ckpt``; e.g. ``python run.py model=lightconv_toy
   max_update=300 final_test=false hydra.run.dir=DIR``, then DIR/checkpoints/last.ckpt) written
   with ``save_fairseq``, the first ``--sentences`` lines of the toy corpus' test split
   translated by convseq's ``beam_search`` and by fairseq's ``SequenceGenerator``, the best
   hypotheses compared token by token.

fairseq runs in its own process with bench/fairseq-venv's Python (bench/lightconv_fairseq_side.py).

    python bench/bench_lightconv_vs_fairseq.py --ckpt DIR/checkpoints/last.ckpt [--json PATH]
    python bench/bench_lightconv_vs_fairseq.py --dry-run   # convseq's side only, no fairseq
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from convseq.checkpoints.fairseq import load_fairseq, save_fairseq
from convseq.cli.schema import default_cache_dir
from convseq.data.corpus_dir import generated_dir
from convseq.data.dictionary import Dictionary
from convseq.models.lightconv import LightConvModel
from convseq.models.lightconv_config import LightConvConfig
from convseq.search import beam_search

# bench/, beside this script (on sys.path as a script)
from search_inputs import file_sources, make_batches
from vs_fairseq_common import ROOT, fairseq_cases, machine_of_run, max_diff

SIDE = ROOT / "bench" / "lightconv_fairseq_side.py"
WORK = ROOT / "outputs" / "bench_lightconv_vs_fairseq"
PAD, EOS = 1, 2
SMALL = dict(  # E 32, FFN 64, H 4; kernels up to 15 (targets of 3-14 tokens: T < K and T > K)
    encoder_embed_dim=32,
    encoder_ffn_embed_dim=64,
    encoder_layers=3,
    encoder_attention_heads=4,
    encoder_kernel_size_list=(3, 7, 15),
    decoder_layers=3,
    decoder_attention_heads=4,
    decoder_kernel_size_list=(3, 7, 15),
    max_source_positions=64,
    max_target_positions=64,
)
SETTINGS: dict[str, dict[str, Any]] = {
    "lightweight": dict(encoder_conv_type="lightweight", decoder_conv_type="lightweight"),
    "dynamic": dict(encoder_conv_type="dynamic", decoder_conv_type="dynamic"),
    "dynamic/lightweight, no GLU, pre-norm, learned pos, tied out": dict(
        encoder_conv_type="dynamic",
        decoder_conv_type="lightweight",
        encoder_glu=False,
        decoder_glu=False,
        encoder_normalize_before=True,
        decoder_normalize_before=True,
        encoder_learned_pos=True,
        decoder_learned_pos=True,
        share_decoder_input_output_embed=True,
    ),
    "dynamic, all embeddings shared": dict(share_all_embeddings=True),
}
VOCAB = {"src": 40, "tgt": 48}  # symbols, the 4 specials included


def dictionary(lang: str, size: int) -> Dictionary:
    """``size`` symbols in all, words named as the fairseq side names them (``<lang><i>``)."""
    return Dictionary.build([" ".join(f"{lang}{i}" for i in range(size - 4))])


def batch(seed: int) -> dict[str, torch.Tensor]:
    """6 sentences: sources left-padded, decoder inputs (EOS first) right-padded."""
    gen = torch.Generator().manual_seed(seed)
    src_lens, tgt_lens = [18, 15, 11, 7, 4, 2], [12, 9, 14, 5, 3, 8]
    src = torch.full((6, max(src_lens)), PAD)
    prev = torch.full((6, max(tgt_lens)), PAD)
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens, strict=True)):
        src[i, -s:] = torch.randint(4, VOCAB["src"], (s,), generator=gen)
        src[i, -1] = EOS
        prev[i, :t] = torch.randint(4, VOCAB["tgt"], (t,), generator=gen)
        prev[i, 0] = EOS
    return {"src_tokens": src, "src_lengths": torch.tensor(src_lens), "prev_output_tokens": prev}


def log_probs(model, data: dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        out = model(data["src_tokens"], data["src_lengths"], data["prev_output_tokens"])
        return model.get_normalized_probs(out, log_probs=True).float()  # (B, T, V)


def convseq_to_fairseq(seed: int) -> tuple[list[dict], list[dict]]:
    """convseq's models written for fairseq: (rows so far, fairseq's load cases)."""
    rows, cases = [], []
    for i, (name, extra) in enumerate(SETTINGS.items()):
        cfg = LightConvConfig(arch="lightconv", **SMALL, dropout=0.3, **extra)
        src_dict = dictionary("src", VOCAB["src"])
        tgt_dict = src_dict if cfg.share_all_embeddings else dictionary("tgt", VOCAB["tgt"])
        torch.manual_seed(seed + i)
        model = LightConvModel.build(cfg, len(src_dict), len(tgt_dict), PAD)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        style = ("args", "cfg")[i % 2]
        path = save_fairseq(model, WORK / "to_fairseq" / f"{i}" / "model.pt", src_dict,
                            tgt_dict, "src", "tgt", style)  # fmt: skip
        data = batch(seed + i)
        if cfg.share_all_embeddings:  # one dictionary: target ids below its size
            data["prev_output_tokens"].clamp_(max=len(src_dict) - 1)
        back, _, _ = load_fairseq(path)  # convseq reads its own file strictly too
        mine = log_probs(model, data)
        rows.append({"direction": f"convseq -> fairseq ({style})", "setting": name,
                     "mine": mine, "self": max_diff(mine, log_probs(back, data))})  # fmt: skip
        cases.append({"kind": "load", "ckpt": str(path), "batch": data})
    return rows, cases


def fairseq_argv(extra: dict[str, Any]) -> list[str]:
    """fairseq-train's model options for SMALL with ``extra`` (dropout 0)."""
    values = {**SMALL, **extra, "dropout": 0.0, "arch": "lightconv"}
    argv = []
    for key, value in values.items():
        if isinstance(value, tuple):
            value = "[" + ",".join(str(v) for v in value) + "]"
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def fairseq_to_convseq(seed: int) -> list[dict]:
    """fairseq's build cases (lightweight and dynamic)."""
    cases = []
    for i, name in enumerate(("lightweight", "dynamic")):
        cases.append({"kind": "build", "dir": str(WORK / "from_fairseq" / name), "seed": seed + i,
                      "dict_sizes": dict(VOCAB), "argv": fairseq_argv(SETTINGS[name]),
                      "batch": batch(seed + 10 + i), "setting": name})  # fmt: skip
    return cases


def compare_log_probs(args: argparse.Namespace) -> list[dict]:
    """Parts 1 and 2: both directions, each pair's log-probabilities."""
    rows, load_cases = convseq_to_fairseq(args.seed)
    build_cases = fairseq_to_convseq(args.seed)
    if args.dry_run:
        for r in rows:
            r["diff"] = r["self"]
        return rows
    theirs = fairseq_cases(SIDE, load_cases + build_cases, args.threads)
    for row, out in zip(rows, theirs, strict=False):
        row["diff"] = max_diff(row["mine"], out["log_probs"])
        row["bit_equal"] = torch.equal(row["mine"], out["log_probs"])
    for case, out in zip(build_cases, theirs[len(load_cases) :], strict=True):
        model, _, _ = load_fairseq(out["ckpt"])  # fairseq's own file, read strictly
        mine = log_probs(model, case["batch"])
        rows.append({"direction": "fairseq -> convseq (cfg)", "setting": case["setting"],
                     "diff": max_diff(mine, out["log_probs"]),
                     "bit_equal": torch.equal(mine, out["log_probs"])})  # fmt: skip
    return rows


def beam_hypotheses(model, batches: list, beam: int) -> list[list[int]]:
    hyps = []
    for src, lengths in batches:
        for nbest in beam_search(model, src, lengths, beam=beam, max_len_a=0, max_len_b=200):
            hyps.append(nbest[0]["tokens"].tolist())
    return hyps


def compare_beam(args: argparse.Namespace) -> dict[str, Any]:
    """Part 3: beam search on a trained model, convseq's against fairseq's, token by token."""
    if args.dry_run and not args.ckpt:  # a random small model, a few random sentences
        torch.manual_seed(args.seed)
        model = LightConvModel.build(LightConvConfig(**SMALL), VOCAB["src"], VOCAB["tgt"], PAD)
        src_dict, tgt_dict = dictionary("src", VOCAB["src"]), dictionary("tgt", VOCAB["tgt"])
        gen = torch.Generator().manual_seed(args.seed)
        sources = [torch.cat([torch.randint(4, VOCAB["src"], (n,), generator=gen),
                              torch.tensor([EOS])]).numpy() for n in (3, 6, 9, 12)]  # fmt: skip
    else:
        from convseq.inference.translator import Translator

        translator = Translator.from_checkpoints(args.ckpt)
        model, src_dict, tgt_dict = translator.models[0], translator.src_dict, translator.tgt_dict
        sources = file_sources(args.src_file, translator, args.sentences)
    model.eval()
    export = save_fairseq(model, WORK / "beam" / "checkpoint.pt", src_dict, tgt_dict, "src", "tgt")
    batches = make_batches(sources, args.batch, "cpu")
    mine = beam_hypotheses(model, batches, args.beam)
    if args.dry_run:  # convseq's search on the model read back from the file it wrote
        theirs = beam_hypotheses(load_fairseq(export)[0], batches, args.beam)
    else:
        case = {"kind": "beam", "ckpt": str(export), "batches": batches, "beam": args.beam}
        theirs = fairseq_cases(SIDE, [case], args.threads)[0]["hyps"]
    same_tokens = sum(a == b for m, t in zip(mine, theirs, strict=True) for a, b in zip(m, t))
    return {
        "sentences": len(mine),
        "identical": sum(m == t for m, t in zip(mine, theirs, strict=True)),
        "tokens_equal": same_tokens,
        "tokens": sum(max(len(m), len(t)) for m, t in zip(mine, theirs, strict=True)),
        "beam": args.beam,
    }


def print_report(rows: list[dict], beam: dict[str, Any], dry_run: bool) -> None:
    if dry_run:
        print("dry run: convseq against the model it read back from its own fairseq file")
    print(f"{'direction':<28}{'setting':<62}{'max abs diff':>14}{'bit-equal':>11}")
    for r in rows:
        equal = "-" if "bit_equal" not in r else ("yes" if r["bit_equal"] else "no")
        print(f"{r['direction']:<28}{r['setting']:<62}{r['diff']:>14.1e}{equal:>11}")
    print(f"beam {beam['beam']}: identical best hypotheses {beam['identical']}/"
          f"{beam['sentences']}, tokens equal {beam['tokens_equal']}/{beam['tokens']}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", help="a trained convseq LightConv checkpoint (part 3)")
    parser.add_argument("--src-file", help="default: the toy corpus' test.src in the cache")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--json", help="write the machine and the figures here")
    parser.add_argument("--dry-run", action="store_true", help="convseq's side only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not args.dry_run and not args.ckpt:
        parser.error("--ckpt (a trained LightConv checkpoint) is needed unless --dry-run")
    if args.src_file is None:  # the toy corpus as `data=toy` generates it into the cache
        args.src_file = str(generated_dir(default_cache_dir(), "toy", 1) / "test.src")
    info = machine_of_run(args.threads)
    rows = compare_log_probs(args)
    beam = compare_beam(args)
    print_report(rows, beam, args.dry_run)
    if args.json:
        keep = [{k: v for k, v in r.items() if k != "mine"} for r in rows]
        result = {"machine": info, "dry_run": args.dry_run, "log_probs": keep, "beam": beam}
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
