"""`task=report`: the table and curves of a sweep, or the report of a study folder.

    python run.py task=report sweep_dir=multirun/2026-12-03/10-00-00 [report.test=true]
    python run.py task=report sweep_dir=outputs/study report.study=true [report.refs=FILE]

A multirun writes the sweep report itself when it ends (`convseq.tasks.hydra_callbacks`); this
task re-makes it, e.g. for a sweep that is still running or was interrupted
(`convseq.evaluation.report`). With ``report.study=true`` the folder is a study's (one run folder
per arm, `examples/study.py`) and the report is the study's (`convseq.evaluation.study_report`):
the per-arm table, the paired bootstrap against the PyTorch-style end point, the decomposition
of the extra epochs, plots. Its test references are ``report.refs``, else the test references
in the data-bin of the baseline run's own ``data`` settings (its ``.hydra/config.yaml``), looked
up under this command's ``paths`` (``CONVSEQ_DATA_ROOT``, ``CONVSEQ_CACHE`` as for the runs); the
bootstrap's settings are task=compare's (``compare.n_samples``, ``compare.seed``,
``gen.tokenize``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from convseq.errors import DataError
from convseq.evaluation.report import write_report
from convseq.evaluation.study_bootstrap import ReferenceLoader, references_from_file

__all__ = ["databin_references", "run_report"]


def databin_references(paths: Mapping[str, Any], split: str = "test") -> ReferenceLoader:
    """A loader of the `split` references from the data-bin of a run folder's own `data`.

    The run's `.hydra/config.yaml` keeps its settings unresolved; its `paths` are replaced by
    this command's (data root and cache folder), then `data` is resolved and its data-bin found
    (or built) as training did.
    """

    def load(run_dir: Path) -> tuple[list[str], str]:
        from omegaconf import OmegaConf

        from convseq.data.databin import DataBin
        from convseq.data.preprocess import prepare_databin

        config = run_dir / ".hydra" / "config.yaml"
        if not config.is_file():
            raise DataError(
                "no saved config to find the run's data-bin; pass report.refs=FILE", str(config)
            )
        try:
            cfg = OmegaConf.load(config)
            cfg.paths = {k: str(paths[k]) for k in ("data_root", "cache_dir")}
            data = OmegaConf.to_container(cfg.data, resolve=True)
        except Exception as e:  # a broken file or an interpolation it cannot resolve here
            raise DataError(
                f"cannot read the run's data settings ({type(e).__name__}: {e}); pass "
                "report.refs=FILE",
                str(config),
            ) from e
        databin = DataBin(prepare_databin(data, str(paths["cache_dir"]), progress=False))
        return databin.text(split, "tgt"), f"{databin.path} ({split} references)"

    return load


def run_report(cfg: dict[str, Any]) -> dict[str, Path]:
    """Summarise the multirun (or, with report.study, the study) in `sweep_dir`; print it."""
    if not cfg.get("sweep_dir"):
        raise DataError(
            "task=report needs sweep_dir=PATH: the folder of a multirun (its hydra.sweep.dir), "
            "or of a study with report.study=true"
        )
    report = cfg.get("report") or {}
    if report.get("study"):
        from convseq.evaluation.study_report import write_study_report

        refs = report.get("refs")
        compare = cfg.get("compare") or {}
        files = write_study_report(
            cfg["sweep_dir"],
            references=references_from_file(str(refs))
            if refs
            else databin_references(cfg["paths"]),
            n_samples=int(compare.get("n_samples", 1000)),
            seed=int(compare.get("seed", 12345)),
            tokenize=str((cfg.get("gen") or {}).get("tokenize", "13a")),
        )
        kind = "study"
    else:
        files = write_report(
            cfg["sweep_dir"], test=bool(report.get("test")), x=str(report.get("x", "epoch"))
        )
        kind = "sweep"
    print(files["markdown"].read_text(), end="")
    print(f"convseq: {kind} report written: {', '.join(str(p) for p in files.values())}")
    return files
