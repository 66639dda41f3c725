"""The generation half of bench/bench_vs_fairseq.py (see its docstring)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vs_fairseq_common import ROOT, VENV, WORK, fairseq_env, in_child, machine_of_run, report

PRECISIONS = ("fp32", "bf16", "int8")


def add_generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="a trained convseq checkpoint (.ckpt)")
    p.add_argument("--src-file", default=str(ROOT.parent / "shared/data/multi30k/test.de"))
    p.add_argument("--sentences", type=int, default=1000, help="the first N lines of --src-file")
    p.add_argument("--beams", type=int, nargs="+", default=[5, 1])
    p.add_argument("--batches", type=int, nargs="+", default=[64, 1])
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="convseq's side")
    p.add_argument("--src-lang", default="de")
    p.add_argument("--tgt-lang", default="en")
    p.add_argument("--beam", type=int, help=argparse.SUPPRESS)  # a child's
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)  # a child's


def batches_file(batch: int) -> Path:
    return WORK / f"batches-{batch}.pt"


def prepare(args: argparse.Namespace) -> Path:
    """Export the checkpoint for fairseq and save the batches of each size once."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from convseq.checkpoints.fairseq import save_fairseq
    from convseq.inference.translator import Translator
    from search_inputs import file_sources, make_batches

    translator = Translator.from_checkpoints(args.ckpt)
    model = translator.models[0]
    export = WORK / "export" / "checkpoint.pt"
    export.parent.mkdir(parents=True, exist_ok=True)
    save_fairseq(
        model, export, translator.src_dict, translator.tgt_dict, args.src_lang, args.tgt_lang
    )
    sources = file_sources(args.src_file, translator, args.sentences)
    for b in args.batches:
        torch.save(make_batches(sources, b, "cpu"), batches_file(b))
    return export


def fairseq_side(export: Path, beam: int, batch: int, threads: int) -> dict[str, Any]:
    cmd = [str(VENV / "bin" / "python"), str(ROOT / "bench" / "fairseq_side.py"),
           "--ckpt", str(export), "--batches", str(batches_file(batch)), "--beam", str(beam),
           "--threads", str(threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=fairseq_env(threads))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"}
    return json.loads(lines[-1])


def generate_child(args: argparse.Namespace) -> dict[str, Any]:
    """convseq's side: the same batches through `beam_search`, timed."""
    import torch

    from convseq.inference.translator import Translator
    from convseq.search import beam_search

    torch.set_num_threads(args.threads)
    model = Translator.from_checkpoints(args.ckpt).models[0].eval()
    model = reduced_precision(model, args.precision)
    batches = torch.load(batches_file(args.batch))
    hyps: list[list[int]] = []
    tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for src, lengths in batches:
        for nbest in beam_search(model, src, lengths, beam=args.beam, max_len_a=0, max_len_b=200):
            best = nbest[0]["tokens"].tolist()
            hyps.append(best)
            tokens += len(best)
    return {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
            "sentences": len(hyps), "tokens": tokens, "hyps": hyps}  # fmt: skip


def reduced_precision(model, precision: str):
    if precision == "fp32":
        return model
    from convseq.inference.precision import for_generation

    return for_generation(model, precision)


def cell_runs(
    args: argparse.Namespace, argv: list[str], export: Path, beam: int, batch: int
) -> tuple[dict[str, list[dict]], str | None]:
    """Both sides at one beam x batch, alternating which goes first; every run printed. The
    runs, and fairseq's error if it failed (it is then not run again)."""
    runs: dict[str, list[dict]] = {"convseq": [], "fairseq": []}
    failed = None
    for r in range(args.repeats):
        order = ("convseq", "fairseq") if r % 2 == 0 else ("fairseq", "convseq")
        for side in order:
            if side == "fairseq" and failed:
                continue
            if side == "convseq":
                res = in_child("convseq", args, [*argv, "--beam", str(beam), "--batch", str(batch)])
            else:
                res = fairseq_side(export, beam, batch, args.threads)
            if "error" in res:
                failed = res["error"]
                print(f"beam {beam} batch {batch}: fairseq failed: {failed}", flush=True)
                continue
            res["sents_per_s"] = res["sentences"] / res["seconds"]
            runs[side].append(res)
            print(f"beam {beam} batch {batch} repeat {r + 1} {side:8s} "
                  f"{res['sents_per_s']:7.1f} sentences/s", flush=True)  # fmt: skip
    return runs, failed


def cell_report(
    args: argparse.Namespace, key: str, beam: int, batch: int, runs: dict, failed: str | None
) -> dict[str, Any]:
    """One beam x batch's figures, printed: the speeds, and how many best hypotheses agree."""
    if failed or not runs["fairseq"]:
        c = statistics.median(x["sents_per_s"] for x in runs["convseq"])
        print(f"\n{key}: convseq {c:.1f} sentences/s; fairseq: {failed}")
        return {"convseq_median": c, "fairseq_error": failed}
    out = report(f"generation beam {beam} batch {batch}: sentences/s", runs, "sents_per_s", args)
    same = sum(a == b for a, b in zip(runs["convseq"][0]["hyps"], runs["fairseq"][0]["hyps"]))
    out["identical_best"] = f"{same}/{len(runs['convseq'][0]['hyps'])}"
    print(f"  identical best hypotheses: {out['identical_best']}")
    return out


def generate_main(args: argparse.Namespace, argv: list[str]) -> None:
    info = machine_of_run(args.threads)
    if args.dry_run:
        print("export", args.ckpt, "->", WORK / "export" / "checkpoint.pt")
        return
    export = prepare(args)
    results: dict[str, Any] = {"machine": info}  # and one entry per beam x batch
    for beam in args.beams:
        for batch in args.batches:
            runs, failed = cell_runs(args, argv, export, beam, batch)
            key = f"beam{beam}_batch{batch}"
            results[key] = cell_report(args, key, beam, batch, runs, failed)
    tag = "-".join(f"b{b}" for b in args.beams) + "_" + "-".join(f"n{n}" for n in args.batches)
    out_file = WORK / f"generate-{args.precision}-{tag}.json"
    out_file.write_text(json.dumps(results, indent=2))
    print(f"\nwritten {out_file}")


if __name__ == "__main__":
    raise SystemExit("run bench/bench_vs_fairseq.py generate")
