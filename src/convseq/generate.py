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
  attention over the source (`convseq.attention_plot`);
- ``generate-S.profile.png`` with ``gen.profile=true``: the time breakdown as a bar chart
  (`convseq.profile_plot`).

BLEU compares the detokenised hypotheses with the split's raw reference file (`DataBin.text`),
never with references rebuilt from the binarised data.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from convseq.bleu import Scores, corpus_scores
from convseq.data.batching import TokenBatchSampler
from convseq.data.databin import TEXT_SPLITS, DataBin
from convseq.data.dataset import LanguagePairDataset
from convseq.data.preprocess import prepare_databin
from convseq.errors import CheckpointError, DataError
from convseq.profile import GenerationProfiler
from convseq.translator import GenerationError, GenOptions, Translator, in_input_order

log = logging.getLogger(__name__)
LN2 = math.log(2.0)


def checkpoint_paths(ckpt: str | Sequence[str] | None) -> list[str]:
    """The checkpoints of ``ckpt``: one path, or several joined by ':' (an ensemble)."""
    if not ckpt:
        raise CheckpointError(
            "task=generate needs ckpt=PATH (a .ckpt, a run folder, or a fairseq checkpoint_*.pt; "
            "several joined by ':' for an ensemble)"
        )
    parts = [ckpt] if isinstance(ckpt, str) else list(ckpt)
    paths = [p for part in parts for p in str(part).split(":") if p]
    if not paths:
        raise CheckpointError(f"ckpt={ckpt!r} names no checkpoint")
    return paths


# ---------------------------------------------------------------------------- batches


def split_loader(
    translator: Translator, databin: DataBin, split: str, gen: Mapping[str, Any]
) -> DataLoader:
    """Batches of the split's sources, by ``gen.max_tokens`` and/or ``gen.batch_size``.

    With the data-bin's own dictionaries the binarised split is used as it is; other models (a
    fairseq checkpoint, another data-bin's model) get the split's raw source text encoded with
    their own segmentation and dictionary.
    """
    max_tokens, batch_size = gen.get("max_tokens"), gen.get("batch_size")
    if max_tokens is None and batch_size is None:
        raise DataError("gen.max_tokens and gen.batch_size are both null; set one")
    if translator.src_dict == databin.src_dict:
        src, _ = databin.split(split)
        dataset = LanguagePairDataset(src, None, pad=translator.src_dict.pad())
    else:
        encoded = []
        truncated = 0
        for line in databin.text(split, "src"):
            ids, cut = translator.encode(line)
            encoded.append(ids)
            truncated += cut
        if truncated:
            log.warning(
                "%s: %d source line(s) truncated to the model's positions", split, truncated
            )
        dataset = LanguagePairDataset(encoded, None, pad=translator.src_dict.pad())
    limit = translator.max_source_positions() or 1 << 30
    longest = int(dataset.src_sizes.max())
    if max_tokens is not None and longest > int(max_tokens):
        raise DataError(
            f"gen.max_tokens={max_tokens} is smaller than the longest source of {split} "
            f"({longest} tokens, EOS included): raise gen.max_tokens to at least {longest}"
        )
    sampler = TokenBatchSampler(
        dataset.src_sizes,
        dataset.tgt_sizes,
        max_tokens=None if max_tokens is None else int(max_tokens),
        max_sentences=None if batch_size is None else int(batch_size),
        shuffle=False,
        max_positions=(limit, 1 << 30),
        overlong="error",
        name=split,
    )
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=dataset.collater)


class GenerationModule(pl.LightningModule):
    """A Translator as a LightningModule, for ``trainer.predict`` (device placement, loops).

    Args:
        translator: the models (one, or an ensemble), dictionaries and segmentation.
        options: the search settings.
        profiler: optional `GenerationProfiler` (its timer is passed to the search).
    """

    def __init__(
        self,
        translator: Translator,
        options: GenOptions,
        profiler: GenerationProfiler | None = None,
    ):
        super().__init__()
        self.translator = translator
        self.members = nn.ModuleList(translator.models)  # registered: Lightning moves them
        self.options = options
        self.profiler_ = profiler

    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> list[dict]:
        if self.profiler_ is None:
            return self.translator.translate_batch(batch, self.options)
        with self.profiler_.step():
            return self.translator.translate_batch(batch, self.options, self.profiler_.timer)

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.profiler_ is not None:
            self.profiler_.batch_start()

    def on_predict_batch_end(
        self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.profiler_ is not None:
            self.profiler_.batch_end()


def predict_trainer(trainer_cfg: Mapping[str, Any] | None, progress: bool = False) -> pl.Trainer:
    """A one-device Trainer for trainer.predict (no logger, no checkpoints)."""
    tcfg = dict(trainer_cfg or {})
    return pl.Trainer(
        accelerator=tcfg.get("accelerator", "cpu"),
        devices=1,  # generation runs on one device: outputs never need gathering across ranks
        precision=tcfg.get("precision", "32-true"),
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
    )


# ---------------------------------------------------------------------------- results


def best_texts(records: Sequence[Mapping[str, Any]], total: int) -> list[str]:
    """The best hypothesis text of sentences 0..total-1 (records sorted by id, none missing)."""
    if [r["id"] for r in records] != list(range(total)):
        raise DataError(
            f"translated {len(records)} sentences but the split has {total}: some sentences were "
            "not translated"
        )
    return [r["hypotheses"][0]["text"] for r in records]


def write_nbest(path: Path, records: Sequence[Mapping[str, Any]], refs: Sequence[str]) -> None:
    """fairseq-generate's S/T/H/D/P/A lines for every sentence; scores in base 2, as fairseq's."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            i = r["id"]
            f.write(f"S-{i}\t{' '.join(r['src_symbols'][:-1])}\n")
            f.write(f"T-{i}\t{refs[i]}\n")
            for h in r["hypotheses"]:
                score = f"{h['score'] / LN2:.6f}"
                pieces = " ".join(h["symbols"][:-1])
                pos = " ".join(f"{x / LN2:.4f}" for x in h["positional_scores"].tolist())
                f.write(f"H-{i}\t{score}\t{pieces}\n")
                f.write(f"D-{i}\t{score}\t{h['text']}\n")
                f.write(f"P-{i}\t{pos}\n")
                if h["alignment"]:
                    f.write(f"A-{i}\t{' '.join(map(str, h['alignment']))}\n")


def speed_line(sentences: int, tokens: int, seconds: float) -> str:
    """fairseq's speed report: ``Translated N sentences (M tokens) in Xs (Y sentences/s, Z tokens/s)``."""
    s = max(seconds, 1e-9)
    return (
        f"Translated {sentences} sentences ({tokens} tokens) in {seconds:.1f}s "
        f"({sentences / s:.2f} sentences/s, {tokens / s:.2f} tokens/s)"
    )


def generated_tokens(records: Sequence[Mapping[str, Any]]) -> int:
    """Tokens of the best hypotheses, EOS included (what fairseq's speed line counts)."""
    return sum(int(r["hypotheses"][0]["tokens"].numel()) for r in records)


# ---------------------------------------------------------------------------- the task


def load_translator(cfg: Mapping[str, Any], databin: DataBin | None) -> Translator:
    """The Translator of ``cfg.ckpt`` with ``cfg.gen``'s search settings.

    A checkpoint without its own segmentation (a fairseq one, or an older convseq one) whose
    dictionaries are the data-bin's gets the data-bin's segmentation.
    """
    gen = cfg.get("gen") or {}
    translator = Translator.from_checkpoints(
        checkpoint_paths(cfg.get("ckpt")),
        dict_dir=gen.get("dict_dir"),
        options=GenOptions.from_mapping(gen),
    )
    if (
        databin is not None
        and translator.src_segmenter.model is None
        and translator.src_dict == databin.src_dict
        and translator.tgt_dict == databin.tgt_dict
    ):
        translator.src_segmenter = databin.segmenter("src")
        translator.tgt_segmenter = databin.segmenter("tgt")
    return translator


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
    loader = split_loader(translator, databin, split, gen)
    profiler = GenerationProfiler(translator.models) if gen.get("profile") else None
    module = GenerationModule(translator, translator.options, profiler)
    trainer = predict_trainer(cfg.get("trainer"))
    # split_loader's sampler yields every index exactly once (shuffle off, nothing dropped)
    warnings.filterwarnings("ignore", message="You are using a custom batch sampler")

    if profiler is not None:
        profiler.start()
    t0 = time.perf_counter()
    predictions = trainer.predict(module, dataloaders=loader)
    seconds = time.perf_counter() - t0
    if profiler is not None:
        profiler.predict_done()
    with profiler.phase("detok") if profiler is not None else _nothing():
        records = in_input_order(predictions or [])
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
        from convseq.attention_plot import write_attention_plots  # matplotlib only when asked

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
    }
    if attention_pngs:
        result["attention_plots"] = [str(p) for p in attention_pngs]
    profile_png = None
    if profiler is not None:
        from convseq.profile_plot import write_time_breakdown  # matplotlib only when asked

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


def split_scores(
    translator: Translator,
    databin: DataBin,
    split: str,
    gen: Mapping[str, Any],
    options: GenOptions | None = None,
) -> tuple[Scores, list[str]]:
    """BLEU/chrF of translating ``split`` (no Trainer: usable inside training callbacks)."""
    loader = split_loader(translator, databin, split, gen)
    records = []
    with torch.inference_mode():
        for batch in loader:
            records.extend(translator.translate_batch(batch, options))
    refs = databin.text(split, "tgt")
    hyps = best_texts(in_input_order(records), len(refs))
    return corpus_scores(hyps, refs, tokenize=str(gen.get("tokenize", "13a"))), hyps


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
