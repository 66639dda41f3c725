"""What `python run.py task=...` does: one function per task, over a plain (resolved) config dict.

run.py stays a thin `@hydra.main`; everything here takes plain values so that tests and notebooks
can call it without Hydra.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from convseq.errors import ConvseqError
from convseq.schema import TASKS


def to_plain(cfg: DictConfig | dict) -> dict[str, Any]:
    """Resolve every interpolation and return plain dicts/lists (never OmegaConf objects)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    return cfg


def run_preprocess(cfg: dict[str, Any]) -> Path:
    """Build (or reuse) the data-bin of `cfg["data"]` in the shared cache; return its folder."""
    from convseq.data.preprocess import prepare_databin

    path = prepare_databin(cfg["data"], cfg["paths"]["cache_dir"])
    print(f"data-bin ready: {path}")
    return path


def run_train(cfg: dict[str, Any]) -> float:
    """Train a model (see `convseq.train.train`); returns the best `optimized_metric` value."""
    from convseq.train import train

    return train(cfg)


def run_report(cfg: dict[str, Any]) -> dict[str, Path]:
    """Summarise the multirun in `sweep_dir` (see `convseq.report`); print the table."""
    from convseq.errors import DataError
    from convseq.report import write_report

    if not cfg.get("sweep_dir"):
        raise DataError(
            "task=report needs sweep_dir=PATH: the folder of a multirun (its hydra.sweep.dir)"
        )
    files = write_report(cfg["sweep_dir"], test=bool((cfg.get("report") or {}).get("test")))
    print(files["markdown"].read_text(), end="")
    print(f"convseq: sweep report written: {', '.join(str(p) for p in files.values())}")
    return files


def run_average(cfg: dict[str, Any]) -> Path:
    """Average checkpoints' parameters (see `convseq.average`); returns the file written."""
    from convseq.average import run_average as average

    return average(cfg)


def run_import_fairseq(cfg: dict[str, Any]) -> Path:
    """Convert the fairseq checkpoint `ckpt` to a convseq checkpoint (see convseq.import_fairseq)."""
    from convseq.errors import CheckpointError
    from convseq.import_fairseq import import_fairseq

    if not cfg.get("ckpt"):
        raise CheckpointError("task=import_fairseq needs ckpt=PATH: a fairseq fconv checkpoint")
    opts = cfg.get("import_fairseq") or {}
    output = opts.get("output") or str(Path(cfg["paths"]["output_dir"]) / "imported.ckpt")
    path = import_fairseq(
        cfg["ckpt"],
        output,
        opts.get("dict_dir"),
        optim=cfg.get("optim"),
        criterion=cfg.get("criterion"),
    )
    print(f"convseq checkpoint written: {path}")
    return path


def run_generate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Translate and score a split with `ckpt` (see `convseq.generate`)."""
    from convseq.generate import run_generate as generate

    return generate(cfg)


def run_interactive(cfg: dict[str, Any]) -> tuple[int, int]:
    """Translate stdin line by line with `ckpt` (see `convseq.interactive`)."""
    from convseq.interactive import run_interactive as interactive

    return interactive(cfg)


def run_compare(cfg: dict[str, Any]) -> list:
    """Paired bootstrap BLEU comparison of `compare.runs` (see `convseq.compare`)."""
    from convseq.compare import run_compare as compare

    return compare(cfg)


TASK_FUNCTIONS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "preprocess": run_preprocess,
    "train": run_train,
    "report": run_report,
    "average": run_average,
    "import_fairseq": run_import_fairseq,
    "generate": run_generate,
    "interactive": run_interactive,
    "compare": run_compare,
}
assert set(TASK_FUNCTIONS) == set(TASKS)


def dispatch(cfg: DictConfig | dict) -> Any:
    """Run `cfg.task`; a ConvseqError (bad input) is printed as one clear line, exit status 2."""
    plain = to_plain(cfg)
    task = plain["task"]
    if task not in TASK_FUNCTIONS:
        raise SystemExit(
            f"convseq: unknown task={task!r}; choose one of: {', '.join(sorted(TASK_FUNCTIONS))}"
        )
    try:
        return TASK_FUNCTIONS[task](plain)
    except ConvseqError as e:
        print(f"convseq: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
