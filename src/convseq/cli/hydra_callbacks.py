"""Hydra callbacks registered in conf/config.yaml (`hydra.callbacks`).

`SweepReport` writes the sweep's summary (`convseq.evaluation.report.write_report`) into `hydra.sweep.dir`
once every job of a multirun has returned (also when a job failed: Hydra then skips
`on_multirun_end`, so the report is written as the process exits), refuses an Optuna search that cannot start or would
optimise the wrong way (`convseq.cli.optuna_search.check_search`, exit status 2), and refuses to start a multi-process DDP job under a
local launcher (exit status 2; Lightning's DDP launcher re-executes the command line, `-m` and its sweep
included, in every extra process: each would start a sweep of its own; under submitit's local
executor the command line is submitit's job runner, which refuses Hydra's arguments).

`job_errors` (run.py's task function runs inside it) leaves a failed sweep job's one-line error in
its folder (`error.txt`, `convseq.common.run_record.write_error`), which the report shows as the
job's status.

This module imports only Hydra: every run instantiates its callbacks, so torch and matplotlib
are imported only when a report is written.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from convseq.common.config import DeviceConfig
from convseq.common.run_record import failed, owns_record, write_error

log = logging.getLogger(__name__)

# Strategies whose extra processes Lightning starts by re-running sys.argv.
_RELAUNCHING = ("ddp", "ddp_find_unused_parameters_true", "ddp_find_unused_parameters_false")
# Launchers that run jobs as local processes on this machine (one after another, in a pool, or
# as submitit's local jobs, whose command line is submitit's job runner)
_LOCAL_LAUNCHERS = ("BasicLauncher", "JoblibLauncher", "LocalLauncher")


def _devices(value: Any) -> int:
    """How many devices a Trainer's `devices` asks for (-1 and "auto" count as several)."""
    if not isinstance(value, (str, int)) and hasattr(value, "__len__"):  # a list of device ids
        return len(value)
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        n = int(text)
        return n if n >= 0 else 2
    if "," in text:
        return len([t for t in text.split(",") if t.strip()])
    return 2  # "auto": as many as there are


def relaunching_ddp(trainer: DeviceConfig | DictConfig) -> bool:
    """Whether these Trainer settings make Lightning re-run the command line in new processes."""
    processes = _devices(trainer.devices) * trainer.num_nodes
    return str(trainer.strategy) in _RELAUNCHING and processes > 1


class SweepReport(Callback):
    """After a multirun: write `sweep_report.{md,csv,json}` and `sweep_curves.png`.

    Args:
        enabled: write the report at the end of every multirun.
        test: also list test figures (see `convseq.evaluation.report.write_report`).
        x: what the curves are drawn against: epoch or updates (``report.x``).
    """

    def __init__(self, enabled: bool = True, test: bool = False, x: str = "epoch") -> None:
        self.enabled = bool(enabled)
        self.test = bool(test)
        self.x = str(x)
        self._pending: str | None = None  # the sweep folder while its report is unwritten

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra_cfg = config.hydra  # Hydra's own node: a multirun's callbacks receive it
        from convseq.cli.optuna_search import SearchError, check_search, is_optuna_sweeper

        if is_optuna_sweeper(hydra_cfg.sweeper):
            try:
                check_search(config)
            except SearchError as e:  # SystemExit: Hydra turns callback exceptions into warnings
                print(f"convseq: error: {e}", file=sys.stderr)
                raise SystemExit(2) from e
        if self.enabled:
            # Hydra's sweeper re-raises a failed job's error once the launcher returns (every
            # job of the batch has run by then) and skips on_multirun_end: the report of the
            # jobs that ran, the failed one included, is then written as the process exits.
            self._pending = str(hydra_cfg.sweep.dir)
            atexit.register(self._report_at_exit)

    def _report_at_exit(self) -> None:
        if self._pending is not None and any(Path(self._pending).glob("*/.hydra")):
            self._write(self._pending)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "hydra" not in config or str(config.hydra.mode) != "RunMode.MULTIRUN":
            return
        # the launcher plugin's own settings: its keys depend on the plugin
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        trainer = config.trainer
        if launcher.rsplit(".", 1)[-1] in _LOCAL_LAUNCHERS and relaunching_ddp(trainer):
            # SystemExit, not an Exception: Hydra turns a callback's exceptions into warnings.
            message = (
                f"trainer.strategy={trainer.strategy} with {trainer.devices} "
                "devices inside a local multirun (-m): Lightning would re-run the command line "
                "(the whole sweep, or submitit's job runner) in every extra process. Run each "
                "DDP job on its own (no -m), sweep on one device per job, or sweep through "
                "hydra/launcher=slurm, where SLURM starts the ranks; see docs/ddp.md"
            )
            print(f"convseq: error: {message}", file=sys.stderr)
            _record_error(SystemExit(message))
            raise SystemExit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled:
            return
        self._write(str(config.hydra.sweep.dir))

    def _write(self, sweep_dir: str) -> None:
        self._pending = None
        try:
            from convseq.evaluation.report import write_report

            files = write_report(sweep_dir, test=self.test, x=self.x)
        except Exception as e:  # the jobs' results are on disk either way; never fail the sweep
            log.warning(
                "convseq: could not write the sweep report of %s (%s: %s); retry with "
                "`python run.py task=report sweep_dir=%s`",
                sweep_dir,
                type(e).__name__,
                e,
                sweep_dir,
            )
            return
        print(f"convseq: sweep report: {files['markdown']}", flush=True)
        if "best" in files:  # an Optuna search: its best trial, ready to paste
            print(f"convseq: best trial: {files['best']}", flush=True)


@contextlib.contextmanager
def job_errors() -> Iterator[None]:
    """Inside a multirun job: leave the job's error in `<job folder>/error.txt`, then re-raise.

    convseq's one-line errors end a job with SystemExit (status 2), which neither Hydra's job
    record nor its `on_job_end` callbacks see; other errors are Exceptions. Either way the sweep
    report lists the job as `failed: <error>` rather than as possibly still running. A job whose
    folder already held a run (its record staged: `convseq.common.run_record`) writes nothing
    there. A single run's error is `run_record`'s.
    """
    try:
        yield
    except (Exception, SystemExit) as e:
        if failed(e):
            _record_error(e)
        raise


def _record_error(e: BaseException) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    if owns_record():
        write_error(HydraConfig.get().runtime.output_dir, e)
