"""`task=generate`: translate a split with trained checkpoints, write the hypotheses, score BLEU.

    python run.py task=generate ckpt=outputs/.../checkpoints/best.ckpt gen.beam=5 gen.split=test
    python run.py task=generate ckpt=a.ckpt:b.ckpt            # an ensemble (fairseq's --path a:b)
    python run.py task=generate ckpt=wmt/checkpoint_best.pt   # a fairseq fconv checkpoint

Files written into ``gen.output`` (default: the run folder), for split ``S``:

- ``generate-S.txt``: the best hypothesis of each sentence, detokenised, one per line, in the
  order of the split's input file;
- ``generate-S.nbest.txt``: fairseq-generate's layout, per sentence ``S-id`` (source pieces),
  ``T-id`` (reference), and per hypothesis ``H-id score pieces``, ``D-id score text``,
  ``P-id`` (per-token log-probs) and ``A-id`` (source position each token attends most); scores
  in base 2, as fairseq prints them;
- ``generate-S.json``: BLEU and chrF with their signatures, the speed figures and the settings;
- ``attention-S-i.png`` for the first ``gen.plot_attention`` sentences: the best hypothesis'
  attention over the source (`convseq.viz.attention`);
- ``generate-S.profile.png`` with ``gen.profile=true``: the time breakdown as a bar chart
  (`convseq.viz.time_breakdown`).

BLEU compares the detokenised hypotheses with the split's raw reference file (`DataBin.text`),
never with references rebuilt from the binarised data.

With ``trainer.devices=N`` and ``trainer.strategy=ddp`` (N GPUs, or N processes on the CPU) the
ranks translate the one-process batches in turn (`convseq.inference.sharding`), the records are
gathered in input order, and rank 0 writes exactly the files of a one-process run.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from convseq.data.databin import TEXT_SPLITS, DataBin
from convseq.data.preprocess import prepare_databin
from convseq.errors import DataError
from convseq.evaluation.scores import corpus_scores
from convseq.inference.generation import (
    GenerationModule,
    checkpoint_paths,
    load_translator,
    predict_trainer,
)
from convseq.inference.options import GenerationError
from convseq.inference.profiler import GenerationProfiler
from convseq.inference.records import (
    best_texts,
    generated_tokens,
    speed_line,
    write_nbest,
)
from convseq.viz.attention import write_attention_plots
from convseq.viz.time_breakdown import write_time_breakdown


def run_generate(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`python run.py task=generate ckpt=...`: see the module docstring. Returns the results."""
    gen = dict(cfg.get("gen") or {})
    split = str(gen.get("split", "test"))
    if split not in TEXT_SPLITS:
        raise DataError(
            f"gen.split={split!r}: BLEU needs the split's reference text, kept for {TEXT_SPLITS}"
        )
    plot_attention = attention_plot_count(gen)
    databin = DataBin(prepare_databin(cfg["data"], cfg["paths"]["cache_dir"]))
    translator = load_translator(cfg, databin)
    refs = databin.text(split, "tgt")
    profiler = GenerationProfiler(translator.models) if gen.get("profile") else None
    module = GenerationModule(translator, translator.options, databin, split, gen, profiler)
    trainer = predict_trainer(cfg.get("trainer"))
    # split_loader's sampler yields every index exactly once (shuffle off, nothing dropped)
    warnings.filterwarnings("ignore", message="You are using a custom batch sampler")

    if profiler is not None:
        profiler.start()
    t0 = time.perf_counter()
    # each rank translates its share; the module gathers every record, in input order
    trainer.predict(module, return_predictions=False)
    seconds = time.perf_counter() - t0
    if not trainer.is_global_zero:
        return {"split": split, "sentences": len(module.records)}  # rank 0 writes and scores
    if profiler is not None:
        profiler.predict_done()
    with profiler.phase("detok") if profiler is not None else _nothing():
        records = module.records
        hyps = best_texts(records, len(refs))
    with profiler.phase("scoring") if profiler is not None else _nothing():
        scores = corpus_scores(hyps, refs, tokenize=str(gen.get("tokenize", "13a")))
    if profiler is not None:
        profiler.stop()

    out_dir = Path(gen.get("output") or cfg["paths"]["output_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    hyp_path = out_dir / f"generate-{split}.txt"
    hyp_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    write_nbest(out_dir / f"generate-{split}.nbest.txt", records, refs)
    attention_pngs: list[Path] = []
    if plot_attention:
        attention_pngs = write_attention_plots(records, out_dir, split, plot_attention)
    tokens = generated_tokens(records)
    result = {
        "split": split,
        "checkpoints": checkpoint_paths(cfg.get("ckpt")),
        "sentences": len(records),
        "tokens": tokens,
        "seconds": seconds,
        "scores": scores.as_dict(),
        "options": translator.options.search_kwargs(),
        "max_tokens": gen.get("max_tokens"),
        "batch_size": gen.get("batch_size"),
        "devices": trainer.world_size,
        "sentences_per_rank": module.sentences_per_rank,
    }
    if attention_pngs:
        result["attention_plots"] = [str(p) for p in attention_pngs]
    profile_png = None
    if profiler is not None:
        result["profile"] = profiler.report()
        profile_png = write_time_breakdown(
            profiler.rows(),
            profiler.wall,
            out_dir / f"generate-{split}.profile.png",
            title=f"Where the time goes (generate {split})",
        )
        result["profile_chart"] = str(profile_png)
    (out_dir / f"generate-{split}.json").write_text(json.dumps(result, indent=2) + "\n")

    print(speed_line(len(records), tokens, seconds))
    for line in scores.lines():
        print(line)
    if profiler is not None:
        print(profiler.table())
        print(f"convseq: time breakdown chart written to {profile_png}")
    if attention_pngs:
        print(
            f"convseq: {len(attention_pngs)} attention heatmap(s) written to "
            f"{out_dir}/attention-{split}-*.png"
        )
    print(f"convseq: hypotheses written to {hyp_path}", flush=True)
    return result


def attention_plot_count(gen: Mapping[str, Any]) -> int:
    """``gen.plot_attention``, checked: a count >= 0, and attention on when it is above 0."""
    n = int(gen.get("plot_attention") or 0)
    if n < 0:
        raise GenerationError(f"gen.plot_attention={n}: give a number of sentences >= 0 (0 = off)")
    if n > 0 and not gen.get("need_attn", True):
        raise GenerationError(
            f"gen.plot_attention={n} draws the search's attention, but gen.need_attn=false turns "
            "it off: set gen.need_attn=true (or gen.plot_attention=0)"
        )
    return n


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
