"""Benchmark: convseq against fairseq 0.12 on the identical model, dictionaries, data and settings.

fairseq is a benchmark peer only: it lives in bench/fairseq-venv (git-ignored, built by
`bash bench/make_fairseq_venv.sh`) and runs in its own processes; convseq never imports it.

**Training** (`train`): the Multi30k recipe's data (`experiment=multi30k_fconv`: joint BPE 8000,
one dictionary per language) is written as fairseq text with convseq's own dictionaries,
binarised by `fairseq-preprocess --srcdict --tgtdict`, and both toolkits train
`fconv_iwslt_de_en` (NAG lr 0.25 momentum 0.99, clip 0.1, dropout 0.2, label smoothing 0.1,
4000-token batches, seed 1) for `--warmup + --updates` updates, each in a fresh process,
alternating which goes first. Target tokens per second over the updates after the warmup:
fairseq's from its per-update log (`--log-interval 1`: wpb / wps is an update's time),
convseq's from its own Trainer loop (bench/bench_train.py's window). Also the first update's
loss (bits per token) of each, as a check that both train the same thing.

**Generation** (`generate`): a trained convseq checkpoint is exported with `save_fairseq`; the
first `--sentences` test sentences are batched once (length order, left-padded, `--batch` at a
time) and saved; each side translates those batches in its own process (convseq: `beam_search`;
fairseq: `SequenceGenerator`), alternating, at every beam x batch asked. Sentences per second
and whether the best hypotheses are identical, sentence by sentence.

    bash bench/make_fairseq_venv.sh
    CONVSEQ_DATA_ROOT=../shared/data python bench/bench_vs_fairseq.py train --repeats 5
    CONVSEQ_DATA_ROOT=../shared/data python bench/bench_vs_fairseq.py generate \
        --ckpt outputs/m30k/deen_main/checkpoints/best.ckpt --repeats 5
    python bench/bench_vs_fairseq.py train --dry-run      # the commands, nothing run

Medians of the repeats; the ratio is convseq / fairseq (above 1: convseq faster). Nothing
else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

# bench/, beside this script (on sys.path as a script)
from bench_vs_fairseq_gen import add_generate_args, generate_child, generate_main
from vs_fairseq_common import ROOT, VENV, WORK, fairseq_env, in_child, machine_of_run, report

if TYPE_CHECKING:
    from convseq.training.config import TrainConfig

DATA_ROOT = os.environ.get("CONVSEQ_DATA_ROOT", str(ROOT.parent / "shared" / "data"))
RECIPE = ["experiment=multi30k_fconv", f"paths.data_root={DATA_ROOT}"]
# fairseq-train's flags for the recipe (conf/experiment/multi30k_fconv.yaml)
FAIRSEQ_RECIPE = [
    "--arch", "fconv_iwslt_de_en", "--optimizer", "nag", "--lr", "0.25", "--momentum", "0.99",
    "--clip-norm", "0.1", "--dropout", "0.2", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--max-tokens", "4000", "--seed", "1",
]  # fmt: skip


# -- data ----------------------------------------------------------------------------------------
def compose(overrides: list[str], output_dir: str) -> TrainConfig:
    """The typed config of the Multi30k recipe plus `overrides`, as run.py hands it to train."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.cli.schema import register_configs
    from convseq.tasks.config import as_config

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=[*RECIPE, *overrides])
    GlobalHydra.instance().clear()
    cfg.paths.output_dir = output_dir
    return as_config(cfg)


def write_fairseq_text(databin, out: Path, splits: tuple[str, ...] = ("train", "valid")) -> Path:
    """Each split's binarised sentences as whitespace-separated dictionary symbols (EOS dropped),
    plus convseq's dict.<lang>.txt: what fairseq-preprocess --srcdict --tgtdict reads back into
    the same ids."""
    out.mkdir(parents=True, exist_ok=True)
    for side in ("src", "tgt"):
        lang, d = databin.lang(side), databin.dictionary(side)
        (out / f"dict.{lang}.txt").write_bytes((databin.path / f"dict.{lang}.txt").read_bytes())
        for split in splits:
            arr = databin.split(split)[0 if side == "src" else 1]
            with open(out / f"{split}.{lang}", "w", encoding="utf-8") as f:
                for i in range(len(arr)):
                    ids = arr[i][:-1]  # the EOS is fairseq-preprocess's to append
                    f.write(" ".join(d.symbols[int(t)] for t in ids) + "\n")
    return out


def fairseq_databin(databin, dry_run: bool = False) -> Path:
    """fairseq's binarisation of the recipe's data (built once under outputs/)."""
    dest = WORK / "fairseq-databin"
    if (dest / "train.de-en.de.bin").is_file() or dry_run:
        return dest
    src, tgt = databin.src_lang, databin.tgt_lang
    text = write_fairseq_text(databin, WORK / "fairseq-text")
    cmd = [
        str(VENV / "bin" / "fairseq-preprocess"), "--source-lang", src, "--target-lang", tgt,
        "--trainpref", str(text / "train"), "--validpref", str(text / "valid"),
        "--srcdict", str(text / f"dict.{src}.txt"), "--tgtdict", str(text / f"dict.{tgt}.txt"),
        "--destdir", str(dest), "--workers", "2",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env=fairseq_env(2))
    return dest


# -- training ------------------------------------------------------------------------------------
def parse_fairseq_log(lines: list[str], warmup: int) -> dict[str, float]:
    """Target tokens and seconds over the updates after `warmup`, from fairseq-train's JSON log
    at --log-interval 1 (each train_inner record is one update: its time is wpb / wps), and the
    first update's loss (bits per token)."""
    records = []
    for line in lines:
        if "train_inner" not in line or "{" not in line:
            continue
        rec = json.loads(line[line.index("{") :])
        records.append(rec)
    if len(records) <= warmup:
        raise SystemExit(f"fairseq-train logged {len(records)} updates, fewer than the warmup")
    timed = records[warmup:]
    tokens = sum(float(r["wpb"]) for r in timed)
    seconds = sum(float(r["wpb"]) / float(r["wps"]) for r in timed)
    return {
        "tokens": tokens,
        "seconds": seconds,
        "updates": len(timed),
        "first_loss": float(records[0]["loss"]),
    }


def fairseq_train_cmd(dest: Path, updates: int, save_dir: str) -> list[str]:
    return [
        str(VENV / "bin" / "fairseq-train"), str(dest), *FAIRSEQ_RECIPE,
        "--max-update", str(updates), "--cpu", "--num-workers", "0", "--no-save",
        "--save-dir", save_dir, "--disable-validation", "--log-format", "json",
        "--log-interval", "1", "--no-progress-bar",
    ]  # fmt: skip


def run_fairseq_train(dest: Path, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fairseq-bench-") as tmp:
        cmd = fairseq_train_cmd(dest, args.warmup + args.updates, tmp)
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=fairseq_env(args.threads), check=False
        )
    if proc.returncode != 0:
        raise SystemExit(f"fairseq-train failed:\n{proc.stderr[-3000:]}")
    return parse_fairseq_log((proc.stdout + proc.stderr).splitlines(), args.warmup)


def convseq_train_child(args: argparse.Namespace) -> dict[str, float]:
    """convseq's own Trainer loop over the same window (bench/bench_train.py's `run_lightning`)."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_train import run_lightning

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="convseq-bench-") as tmp:
        # checkpoints are written once an epoch, outside the timed window: none here
        quiet = ["trainer.enable_progress_bar=false", "checkpoint.keep_epochs=0"]
        cfg = compose([*quiet, "checkpoint.save_last=false", *args.convseq], tmp)
        first = first_update_loss(cfg)
        result = run_lightning(cfg, args.warmup, args.updates)
    return {**result, "first_loss": first}


def first_update_loss(cfg: TrainConfig) -> float:
    """The loss (bits per token) of the first batch with the seeded initial weights."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_train import build, first_batches

    module, dm = build(cfg)
    batch = first_batches(dm, 1)[0]
    module.model.train()
    torch.manual_seed(cfg.seed)
    with torch.no_grad():
        logits, _ = module.model(**batch["net_input"])
        out = module.criterion(logits, batch["target"])
    return float(out.loss) / float(out.ntokens) / math.log(2)


def train_main(args: argparse.Namespace, argv: list[str]) -> None:
    from convseq.data.databin import DataBin
    from convseq.data.preprocess import prepare_databin

    info = machine_of_run(args.threads)
    cfg = compose([], str(WORK))
    databin = DataBin(prepare_databin(cfg.data, cfg.paths.cache_dir, progress=False))
    dest = fairseq_databin(databin, args.dry_run)
    if args.dry_run:
        print(" ".join(fairseq_train_cmd(dest, args.warmup + args.updates, "SAVE_DIR")))
        print(" ".join([sys.executable, __file__, *argv, "--child", "convseq"]))
        return
    runs: dict[str, list[dict]] = {"convseq": [], "fairseq": []}
    for r in range(args.repeats):
        order = ("convseq", "fairseq") if r % 2 == 0 else ("fairseq", "convseq")
        for side in order:
            res = (
                in_child("convseq", args, argv)
                if side == "convseq"
                else run_fairseq_train(dest, args)
            )
            res["wps"] = res["tokens"] / res["seconds"]
            runs[side].append(res)
            print(
                f"repeat {r + 1} {side:8s} {res['wps']:8.0f} target tokens/s  first-update loss "
                f"{res['first_loss']:.3f}",
                flush=True,
            )
    figures = report("training: target tokens/s", runs, "wps", args)
    if args.json:
        result = {"machine": info, "convseq_overrides": args.convseq, **figures, "runs": runs}
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    train = sub.add_parser("train", help="training throughput")
    train.add_argument("--warmup", type=int, default=3)
    train.add_argument("--updates", type=int, default=30)
    train.add_argument("--json", help="also write the machine, the figures and every run here")
    gen = sub.add_parser("generate", help="generation throughput and identical hypotheses")
    add_generate_args(gen)
    for p in (train, gen):
        p.add_argument("--repeats", type=int, default=5)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
        p.add_argument("--convseq", nargs="*", default=[], help="extra convseq overrides")
        p.add_argument("--child", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    parent_argv = [a for a in argv if a != "--child"]
    if args.child:
        result = convseq_train_child(args) if args.what == "train" else generate_child(args)
        print(json.dumps(result))
    elif args.what == "train":
        train_main(args, parent_argv)
    else:
        generate_main(args, parent_argv)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
