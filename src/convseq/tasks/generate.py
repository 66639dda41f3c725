"""`task=generate`: translate a split or a text file with trained checkpoints, write the
hypotheses, score BLEU.

    python run.py task=generate ckpt=outputs/.../checkpoints/best.ckpt gen.beam=5 gen.split=test
    python run.py task=generate ckpt=a.ckpt:b.ckpt            # an ensemble (fairseq's --path a:b)
    python run.py task=generate ckpt=wmt/checkpoint_best.pt   # a fairseq fconv or LightConv checkpoint
    python run.py task=generate ckpt=... gen.input=news.de [gen.reference=news.en]

``ckpt=`` a run folder (or its checkpoints folder) reads its best.ckpt, else its last.ckpt, and
the run prints which file and why (`convseq.inference.loading.folder_choice`): the mid-epoch
last.ckpt of a run interrupted before its first validation, or best.ckpt and a later last.ckpt.

Files written into ``gen.output`` (default: the run folder), for split ``S`` (or ``gen.input``'s
file stem):

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
never with references rebuilt from the binarised data. A fairseq data-bin (``data.format=
fairseq``) keeps no text: its references are the target ids joined back with ``data.remove_bpe``,
or the lines of ``gen.reference=FILE`` (line i translates sentence i of the split).

The data comes from the checkpoint (the ``data`` config it was trained on, kept in convseq's
checkpoints) unless ``data`` is given; data given is checked against the checkpoint's (language
pair, segmentation, dictionaries) and a mismatch is refused, naming both
(`convseq.inference.data_match`). A fairseq checkpoint records no data: name it with
``data=...`` to translate a split.

``gen.input=FILE`` translates the lines of a raw text file instead (segmented with the
checkpoint's own segmentation, as task=interactive does; no data-bin is read), batched and run
exactly as a split is; an empty line gets an empty hypothesis, as in task=interactive. With
``gen.reference=FILE`` (line i translates input line i) BLEU and chrF are computed against it and
the n-best file has ``T-`` lines; without, there are no scores.

With ``trainer.devices=N`` and ``trainer.strategy=ddp`` (N GPUs, or N processes on the CPU) the
ranks translate the one-process batches in turn (`convseq.inference.sharding`), the records are
gathered in input order, and rank 0 writes exactly the files of a one-process run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from pytorch_lightning.utilities import rank_zero_only

from convseq.common.config import DeviceConfig
from convseq.common.cpu_share import threads_line
from convseq.common.parallel_jobs import task_threads
from convseq.data.base_databin import TEXT_SPLITS
from convseq.data.preprocess import open_databin
from convseq.errors import DataError
from convseq.evaluation.scores import corpus_scores
from convseq.inference.cpu_share_callback import CpuShareCallback
from convseq.inference.data_match import check_databin, data_to_translate, split_given
from convseq.inference.errors import GenerationError
from convseq.inference.generation import (
    adopt_segmentation,
    checkpoint_paths,
    load_translator,
    predict_trainer,
    split_batches,
)
from convseq.inference.jobs import (
    Job,
    input_job,
    output_lines,
    read_input,
    split_reference,
    translate_job,
)
from convseq.inference.loading import folder_choice
from convseq.inference.options import GenConfig
from convseq.inference.profiler import GenerationProfiler
from convseq.inference.records import (
    generated_tokens,
    speed_line,
    write_hypotheses,
    write_nbest,
)
from convseq.tasks.config import GenerateTaskConfig
from convseq.viz.attention import write_attention_plots
from convseq.viz.time_breakdown import write_time_breakdown


def run_generate(cfg: GenerateTaskConfig) -> dict[str, Any]:
    """`python run.py task=generate ckpt=...`: see the module docstring. Returns the results.

    ``cfg.data``: empty, the checkpoint's own data; a data option (``data=NAME``), that corpus;
    keys alone (``data.dir=...``), the checkpoint's data with them changed
    (`convseq.tasks.config`).
    """
    share = cpu_share(cfg.trainer)
    gen = cfg.gen
    plot_attention = attention_plot_count(gen)
    if gen.input:
        given, _ = split_given(cfg.data)  # not read: a data option must still be the model's
        job = input_job(cfg.ckpt, gen, cfg.trainer.accelerator, given)
    else:
        job = split_job(cfg)
    say_checkpoint_files(cfg.ckpt)
    profiler = GenerationProfiler(job.translator.models) if gen.profile else None
    trainer = predict_trainer(cfg.trainer, callbacks=[share])

    if profiler is not None:
        profiler.start()
    t0 = time.perf_counter()
    records, per_rank = translate_job(job, trainer, profiler)
    seconds = time.perf_counter() - t0
    if not trainer.is_global_zero:
        return {**job.about, "sentences": len(records)}  # rank 0 writes and scores
    if profiler is not None:
        profiler.predict_done()
    with _phase(profiler, "detok"):
        hyps, records, listed = output_lines(job, records)
    with _phase(profiler, "scoring"):
        scores = None if job.refs is None else corpus_scores(hyps, job.refs, gen.tokenize)
    if profiler is not None:
        profiler.stop()

    out_dir = Path(gen.output or cfg.paths.output_dir)
    hyp_path, attention_pngs = write_outputs(out_dir, job, hyps, listed, records, plot_attention)
    tokens = generated_tokens(records)
    result = {
        **job.about,
        "checkpoints": checkpoint_paths(cfg.ckpt),
        "sentences": job.total,
        "tokens": tokens,
        "seconds": seconds,
        "scores": None if scores is None else scores.as_dict(),
        "options": gen.search_kwargs(),
        "max_tokens": gen.max_tokens,
        "batch_size": gen.batch_size,
        "precision": gen.precision,
        "devices": trainer.world_size,
        "sentences_per_rank": per_rank,
    }
    if attention_pngs:
        result["attention_plots"] = [str(p) for p in attention_pngs]
    profile_png = _profile(profiler, result, out_dir, job.name)
    (out_dir / f"generate-{job.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    _report(len(records), result, scores, profiler, profile_png, attention_pngs, hyp_path)
    return result


def cpu_share(trainer_cfg: DeviceConfig) -> CpuShareCallback:
    """This process's share of the CPUs, set and said (rank 0), and the callback that takes
    fewer threads while other work uses them (`convseq.common.cpu_share`)."""
    threads = task_threads(trainer_cfg)
    if rank_zero_only.rank == 0:
        print(f"convseq: {threads_line(threads.threads, threads.source)}", flush=True)
    return CpuShareCallback(threads, say=lambda line: print(f"convseq: {line}", flush=True))


@rank_zero_only
def say_checkpoint_files(ckpt: str | Sequence[str] | None) -> None:
    """For each run folder among ``ckpt``: which of its files was read, and why
    (`convseq.inference.loading.folder_choice`)."""
    for path in checkpoint_paths(ckpt):
        line = folder_choice(path)
        if line is not None:
            print(f"convseq: {line}", flush=True)


def _profile(
    profiler: GenerationProfiler | None, result: dict[str, Any], out_dir: Path, name: str
) -> Path | None:
    """With ``gen.profile``: the breakdown into ``result`` and its chart written (its path)."""
    if profiler is None:
        return None
    result["profile"] = profiler.report()
    png = write_time_breakdown(
        profiler.rows(),
        profiler.wall,
        out_dir / f"generate-{name}.profile.png",
        title=f"Where the time goes (generate {name})",
    )
    result["profile_chart"] = str(png)
    return png


def _report(
    translated: int,
    result: dict[str, Any],
    scores: Any,
    profiler: GenerationProfiler | None,
    profile_png: Path | None,
    attention_pngs: list[Path],
    hyp_path: Path,
) -> None:
    """What a generate run prints when it ends: speed, scores, profile, files."""
    print(speed_line(translated, result["tokens"], result["seconds"]))
    for line in scores.lines() if scores is not None else []:
        print(line)
    if profiler is not None:
        print(profiler.table())
        print(f"convseq: time breakdown chart written to {profile_png}")
    if attention_pngs:
        first = attention_pngs[0]  # attention-<split>-<i>.png: this run's split only
        print(
            f"convseq: {len(attention_pngs)} attention heatmap(s) written to "
            f"{first.parent}/{first.name.rsplit('-', 1)[0]}-*.png"
        )
    print(f"convseq: hypotheses written to {hyp_path}", flush=True)


def write_outputs(
    out_dir: Path,
    job: Job,
    hyps: Sequence[str],
    listed: Sequence[dict],
    records: Sequence[dict],
    plot_attention: int,
) -> tuple[Path, list[Path]]:
    """generate-<name>.txt and .nbest.txt, and the attention heatmaps; (hypotheses, PNGs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    hyp_path = write_hypotheses(out_dir / f"generate-{job.name}.txt", hyps)
    # no reference (gen.input alone): no T- lines
    write_nbest(out_dir / f"generate-{job.name}.nbest.txt", listed, job.refs)
    pngs = []
    if plot_attention:
        pngs = write_attention_plots(records, out_dir, job.name, plot_attention)
    return hyp_path, pngs


def attention_plot_count(gen: GenConfig) -> int:
    """``gen.plot_attention``, checked: a count >= 0, and attention on when it is above 0."""
    n = gen.plot_attention
    if n < 0:
        raise GenerationError(f"gen.plot_attention={n}: give a number of sentences >= 0 (0 = off)")
    if n > 0 and not gen.need_attn:
        raise GenerationError(
            f"gen.plot_attention={n} draws the search's attention, but gen.need_attn=false turns "
            "it off: set gen.need_attn=true (or gen.plot_attention=0)"
        )
    return n


# ---------------------------------------------------------------------------- what to translate


def split_job(cfg: GenerateTaskConfig) -> Job:
    """``gen.split`` of the data-bin of ``data``, scored against the split's raw reference text.

    ``cfg.data`` empty or keys alone: the data the checkpoint was trained on, with those keys
    changed; a data option: checked against the checkpoint's before and after its data-bin is
    built (`convseq.inference.data_match`).
    """
    gen = cfg.gen
    split = gen.split
    if split == "train":
        raise DataError(
            f"gen.split={split!r}: BLEU needs the split's reference text, kept for "
            f"{TEXT_SPLITS} and the extra test sets (data.test_sets)"
        )
    # read first: a wrong path fails before the checkpoint is loaded
    reference = read_input(gen.reference, "gen.reference") if gen.reference else None
    translator = load_translator(cfg.ckpt, gen, cfg.trainer.accelerator)
    cache_dir = cfg.paths.cache_dir
    chosen, changed = split_given(cfg.data)
    data = data_to_translate(translator.trained_on, chosen, changed)
    given = data if chosen is not None or changed else None
    databin = open_databin(data, cache_dir)
    if split not in databin.scored_splits():
        raise DataError(
            f"gen.split={split!r}: this data-bin's scored splits are {databin.scored_splits()} "
            "(add more with data.test_sets)",
            path=str(databin.path),
        )
    dicts = (translator.src_dict, translator.tgt_dict)
    check_databin(translator.trained_on, databin, dicts, given=given is not None)
    adopt_segmentation(translator, databin)
    refs = (
        list(databin.text(split, "tgt"))
        if reference is None
        else split_reference(reference, databin, split, gen.reference)
    )
    batches = split_batches(translator, databin, split, gen)
    about = (
        {"split": split}
        if reference is None
        else {"split": split, "reference": str(reference.path)}
    )
    return Job(split, translator, batches, len(refs), refs, about=about)


def _phase(profiler: GenerationProfiler | None, name: str) -> AbstractContextManager:
    return profiler.phase(name) if profiler is not None else nullcontext()
