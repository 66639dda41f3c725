"""Speed of convseq's LightConv model against fairseq 0.12's on CPU, like for like.

One model (a preset of conf/model, `lightconv_iwslt_de_en` by default: 7 + 6 DynamicConv layers
of width 512, FFN 1024, 4 heads, 17.6M weights besides the embeddings) is built by convseq from a
seed; its state_dict is loaded with strict=True into fairseq's LightConvModel, built with
dictionaries of the same sizes (synthetic symbols, fairseq's numbering: pad 1, EOS 2, unk 3).
Both sides get the same batches of random sentences (lengths 8-32, EOS-terminated, sources
left-padded as fairseq batches them) and run in fresh processes (fairseq with
bench/fairseq-venv's Python: bench/lightconv_speed_fairseq_side.py), alternating which goes
first; fp32, each side's fastest path.

* **train**: per batch forward, label-smoothed cross entropy (0.1; each side's own), backward
  and a torch.optim.Adam step (the same optimizer on both sides: the models are compared), with
  dropout as the preset sets it; target tokens per second over the batches after the warmup.
  Also the first batch's loss in eval mode before training on each side (the same model).
* **generate**: beam search (beam 5, batches of 64, max_len_a 0, max_len_b 200, no attention
  returned): convseq's `beam_search` against fairseq's SequenceGenerator as fairseq-generate
  sets it up. The random model's EOS logit is raised by a constant (`--eos-bias`, through the
  last layer norm's bias) so that sentences end at various lengths. Output tokens per second and
  how many best hypotheses differ.

    python bench/bench_lightconv_vs_fairseq_speed.py [--repeats 5] [--json PATH]
    python bench/bench_lightconv_vs_fairseq_speed.py --dry-run   # convseq's side, tiny sizes

Medians of the repeats; the ratio is convseq / fairseq (above 1: convseq faster).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from convseq.models.lightconv import LightConvModel
from convseq.models.lightconv_config import LightConvConfig, preset

# bench/, beside this script (on sys.path as a script)
from vs_fairseq_common import ROOT, VENV, fairseq_env, machine_of_run

SIDE = ROOT / "bench" / "lightconv_speed_fairseq_side.py"
PAD, EOS = 1, 2
TINY = dict(  # --dry-run: a preset's structure at toy sizes
    encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_layers=2,
    encoder_kernel_size_list=(3, 7), decoder_embed_dim=32, decoder_ffn_embed_dim=64,
    decoder_layers=2, decoder_kernel_size_list=(3, 7), encoder_attention_heads=4,
    decoder_attention_heads=4,
)  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--what", nargs="+", choices=("train", "generate"), default=["train", "generate"]
    )
    p.add_argument("--arch", default="lightconv_iwslt_de_en", help="a fairseq LightConv preset")
    p.add_argument("--vocab", type=int, default=8000, help="symbols of each dictionary")
    p.add_argument("--train-batches", type=int, default=3, help="warmup included")
    p.add_argument("--train-sentences", type=int, default=16, help="sentences per batch")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--gen-sentences", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--max-len-b", type=int, default=20)
    p.add_argument("--eos-bias", type=float, default=4.5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--baseline-src", help="a convseq src/ of another version, run as a third side (before)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the machine, the figures and every run here")
    p.add_argument("--dry-run", action="store_true", help="convseq's side once, tiny sizes")
    p.add_argument("--child", nargs=2, metavar=("WHAT", "CASE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dry_run:
        args.vocab, args.train_batches, args.train_sentences = 40, 2, 3
        args.gen_sentences, args.batch, args.beam, args.max_len_b = 4, 2, 2, 10
    return args


# -- the case both sides read --------------------------------------------------------------------
def model_config(args: argparse.Namespace) -> LightConvConfig:
    return preset(args.arch, **(TINY if args.dry_run else {}))


def build_model(args: argparse.Namespace) -> LightConvModel:
    """convseq's model from the seed, its EOS logit raised by ``--eos-bias`` (see the module)."""
    torch.manual_seed(args.seed)
    model = LightConvModel.build(model_config(args), args.vocab, args.vocab, pad=PAD)
    dec = model.decoder
    norm = dec.layers[-1].final_layer_norm if dec.layer_norm is None else dec.layer_norm
    with torch.no_grad():
        bias = 0.1 * torch.randn_like(norm.bias)  # (E,): every output row gets it
        norm.bias.copy_(bias)
        # EOS's row gains a direction whose product with the bias is eos_bias
        dec.output_projection.weight[EOS] += args.eos_bias * bias / bias.dot(bias)
    return model


def sentences(n: int, gen: torch.Generator, vocab: int) -> list[torch.Tensor]:
    """``n`` random sentences of 8-32 tokens (EOS included), words from 4 .. vocab - 1."""
    lengths = torch.randint(8, 33, (n,), generator=gen).tolist()
    out = []
    for length in lengths:
        ids = torch.randint(4, vocab, (length,), generator=gen)
        ids[-1] = EOS
        out.append(ids)
    return out


def left_padded(batch: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) sources left-padded, and their (B,) lengths."""
    width = max(len(s) for s in batch)
    src = torch.full((len(batch), width), PAD)  # (B, S)
    for i, s in enumerate(batch):
        src[i, width - len(s) :] = s
    return src, torch.tensor([len(s) for s in batch])


def train_batch(src: list[torch.Tensor], tgt: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(src (B, S), lengths (B,), prev_output_tokens (B, T), target (B, T)): targets right-padded,
    the decoder input EOS then the target shifted right (fairseq's)."""
    src_tokens, lengths = left_padded(src)
    width = max(len(t) for t in tgt)
    target = torch.full((len(tgt), width), PAD)  # (B, T)
    prev = torch.full((len(tgt), width), PAD)  # (B, T)
    for i, t in enumerate(tgt):
        target[i, : len(t)] = t
        prev[i, 0], prev[i, 1 : len(t)] = EOS, t[:-1]
    return src_tokens, lengths, prev, target


def make_case(args: argparse.Namespace) -> dict[str, Any]:
    """Everything both sides read: the config, the weights, the batches."""
    gen = torch.Generator().manual_seed(args.seed)
    n = args.train_sentences
    train = [
        train_batch(sentences(n, gen, args.vocab), sentences(n, gen, args.vocab))
        for _ in range(args.train_batches)
    ]
    sources = sorted(sentences(args.gen_sentences, gen, args.vocab), key=len)  # length order
    batches = [left_padded(sources[i : i + args.batch]) for i in range(0, len(sources), args.batch)]
    cfg = dataclasses.asdict(model_config(args))
    overrides = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
    return {
        "arch": args.arch, "overrides": overrides, "vocab": (args.vocab, args.vocab),
        "state": build_model(args).state_dict(), "train": train, "generate": batches,
        "warmup": args.warmup, "beam": args.beam, "max_len_b": args.max_len_b,
        "smoothing": 0.1, "lr": 1e-4, "seed": args.seed,
    }  # fmt: skip


# -- convseq's side ------------------------------------------------------------------------------
def load_model(case: dict[str, Any], args: argparse.Namespace) -> LightConvModel:
    model = LightConvModel.build(model_config(args), *case["vocab"], pad=PAD)
    model.load_state_dict(case["state"], strict=True)
    return model


def convseq_train(model: LightConvModel, case: dict[str, Any]) -> dict[str, Any]:
    """Each batch: forward, label-smoothed loss, backward, Adam step; the first `warmup`
    untimed. Also the first batch's loss in eval mode before training."""
    import time

    from convseq.training.criterion import label_smoothed_cross_entropy

    def loss_of(batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        src, lengths, prev, target = batch
        logits, _ = model(src, lengths, prev)  # (B, T, V)
        return label_smoothed_cross_entropy(logits, target, case["smoothing"], PAD).loss

    model.eval()  # no dropout: both sides compute the same loss
    with torch.no_grad():
        first = float(loss_of(case["train"][0]).item())
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=case["lr"])
    tokens, seconds, cpu = 0, 0.0, 0.0
    for i, batch in enumerate(case["train"]):
        start, cpu_start = time.perf_counter(), time.process_time()
        opt.zero_grad()
        loss_of(batch).backward()
        opt.step()
        if i >= case["warmup"]:
            seconds += time.perf_counter() - start
            cpu += time.process_time() - cpu_start
            tokens += int(batch[3].ne(PAD).sum())
    return {"tokens": tokens, "seconds": seconds, "cpu_seconds": cpu, "first_loss": first}


def convseq_generate(model: LightConvModel, case: dict[str, Any]) -> dict[str, Any]:
    """The generation batches through convseq's beam search, timed."""
    import time

    from convseq.search import beam_search

    hyps, tokens = [], 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for src, lengths in case["generate"]:
        for nbest in beam_search(
            model, src, lengths, beam=case["beam"], max_len_a=0, max_len_b=case["max_len_b"],
            need_attn=False,
        ):  # fmt: skip
            best = nbest[0]["tokens"].tolist()
            hyps.append(best)
            tokens += len(best)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"tokens": tokens, "seconds": seconds, "cpu_seconds": cpu, "hyps": hyps}


def convseq_child(what: str, case_path: str, args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    case = torch.load(case_path, weights_only=False)
    torch.manual_seed(case["seed"])
    model = load_model(case, args)
    if what == "train":
        return convseq_train(model, case)
    return convseq_generate(model.eval(), case)


# -- the driver ----------------------------------------------------------------------------------
def run_side(side: str, what: str, case_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``side`` in a fresh process; its JSON result (an error as {"error": ...}).
    The baseline side is this script's convseq side with ``--baseline-src`` first on the path."""
    if side in ("convseq", "baseline"):
        cmd = [sys.executable, __file__, "--arch", args.arch, "--threads", str(args.threads)]
        cmd += ["--child", what, str(case_path)]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        if side == "baseline":
            env["PYTHONPATH"] = os.pathsep.join([args.baseline_src, env.get("PYTHONPATH", "")])
    else:
        cmd = [str(VENV / "bin" / "python"), str(SIDE), "--case", str(case_path)]
        cmd += ["--what", what, "--threads", str(args.threads)]
        env = fairseq_env(args.threads)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}"}
    return json.loads(lines[-1])


def compare(what: str, case_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every side ``--repeats`` times, each first in turn; the medians and ratios, by wall time
    and by CPU time (the process's own: less moved by other work on a shared machine)."""
    sides = ["convseq", "fairseq", *(["baseline"] if args.baseline_src else [])]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for r in range(args.repeats):
        # each side first in turn: a slow spell of a shared machine falls on all of them
        for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
            res = run_side(side, what, case_path, args)
            if "error" in res:
                raise SystemExit(f"{side} {what} failed: {res['error']}")
            res["tps"] = res["tokens"] / res["seconds"]
            res["tps_cpu"] = res["tokens"] / res["cpu_seconds"]
            runs[side].append(res)
            print(f"{what} repeat {r + 1} {side:8s} {res['tps']:8.1f} tokens/s "
                  f"({res['tps_cpu']:.1f} per CPU second)", flush=True)  # fmt: skip
    out: dict[str, Any] = {}
    for key in ("tps", "tps_cpu"):
        for side in sides:
            out[f"{side}_{key}"] = statistics.median(x[key] for x in runs[side])
            out[f"{side}_{key}_runs"] = [x[key] for x in runs[side]]
        out[f"ratio_{key}"] = out[f"convseq_{key}"] / out[f"fairseq_{key}"]
    if what == "train":
        out["first_loss"] = [runs[s][0]["first_loss"] for s in ("convseq", "fairseq")]
    else:
        pairs = zip(runs["convseq"][0]["hyps"], runs["fairseq"][0]["hyps"], strict=True)
        out["hyps_differing"] = sum(a != b for a, b in pairs)
        out["sentences"] = len(runs["convseq"][0]["hyps"])
    medians = {k: round(v, 2) for k, v in out.items() if isinstance(v, float)}
    print(f"{what}: " + json.dumps(medians), flush=True)
    return out


def dry_run(args: argparse.Namespace) -> None:
    """convseq's side in this process at tiny sizes: the case is made and both tasks run."""
    case = make_case(args)
    for what, run in (("train", convseq_train), ("generate", convseq_generate)):
        model = load_model(case, args)
        res = run(model if what == "train" else model.eval(), case)
        print(what, json.dumps({k: v for k, v in res.items() if k != "hyps"}))


def main() -> None:
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.child:
        print(json.dumps(convseq_child(*args.child, args)))
        return
    if args.dry_run:
        dry_run(args)
        return
    info = machine_of_run(args.threads)
    results: dict[str, Any] = {"machine": info, "command": " ".join(["python", *sys.argv])}
    with tempfile.TemporaryDirectory(prefix="lightconv-speed-") as tmp:
        case_path = Path(tmp) / "case.pt"
        torch.save(make_case(args), case_path)
        for what in args.what:
            results[what] = compare(what, case_path, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
