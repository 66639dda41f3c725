"""`ResumableOptunaSweeper`: hydra-optuna-sweeper's sweeper, made to continue a search.

A Hydra plugin lives in the `hydra_plugins` namespace (Hydra instantiates no other sweeper
class) and is imported by Hydra's plugin scan at every start: this module imports Hydra only;
Optuna, the plugin it wraps and convseq's part (`convseq.cli.optuna_search`) load when a
search starts. `conf/hparams_search/*.yaml` choose it with `hydra.sweeper._target_`.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class ResumableOptunaSweeper(Sweeper):
    """Optuna's sweeper (same settings as hydra.sweeper of `hydra/sweeper=optuna`) that:

    - runs only the trials the study in `storage` still lacks (`n_trials` counts them all),
    - records the command's fixed settings in the study, and refuses to continue it with others,
    - numbers the new job folders after the study's trials (folder N is trial N),
    - reseeds its sampler so that a continued search does not replay the first trials,
    - stops the search when a signal cut a trial short (the trial counts as failed).
    """

    def __init__(self, **settings: Any) -> None:
        from convseq.cli.optuna_search import INSTALL, SearchError

        try:
            from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl
        except ImportError as e:
            raise SearchError(f"the Optuna sweeper needs its packages: run `{INSTALL}`") from e
        self.impl = OptunaSweeperImpl(**settings)
        self.config: DictConfig | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.impl.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.config = config
        self.impl.launcher = _SignalAwareLauncher(self.impl.launcher)

    def sweep(self, arguments: list[str]) -> Any:
        from convseq.cli.optuna_search import (
            SearchError,
            SearchInterrupted,
            continue_sampler,
            resume_study,
            study_settings,
        )

        try:
            impl = self.impl  # the plugin's settings, as its own config typed and defaulted them
            state = resume_study(
                impl.storage,
                impl.study_name,
                impl.direction,
                int(impl.n_trials),
                settings=study_settings(self.config) if self.config is not None else None,
            )
        except SearchError as e:  # one line and exit status 2, as check_search's refusals
            print(f"convseq: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        continue_sampler(self.impl.sampler, state.trials)  # no replay of the first trials
        self.impl.n_trials = state.to_run
        self.impl.job_idx = state.trials  # job folder N holds trial N
        try:
            return self.impl.sweep(arguments)
        except SearchInterrupted as e:  # one line and the status of a run cut short, no traceback
            # imported here: it loads Lightning, which a search with nothing to run never needs
            from convseq.training.interruption import EX_TEMPFAIL

            print(f"convseq: {e}", file=sys.stderr, flush=True)
            raise SystemExit(EX_TEMPFAIL) from None


class _SignalAwareLauncher:
    """The launcher the sweeper was given; a job a signal cut short returns a failure
    (`SearchInterrupted`), which the Optuna sweeper records as a failed trial before it stops."""

    def __init__(self, launcher: Any) -> None:
        self.launcher = launcher
        self.interrupted: str | None = None  # why the search stops, once a signal cut a trial

    def __getattr__(self, name: str) -> Any:
        return getattr(self.launcher, name)

    def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:
        from hydra.core.utils import JobStatus
        from omegaconf import OmegaConf

        from convseq.cli.optuna_search import SearchInterrupted, cut_short

        if self.interrupted:  # the sweeper went on (max_failure_rate > 0): launch nothing more
            raise SearchInterrupted(self.interrupted)
        returns = self.launcher.launch(job_overrides, initial_job_idx=initial_job_idx)
        for ret in returns:
            hydra_cfg = ret.hydra_cfg
            output_dir = (
                OmegaConf.select(hydra_cfg, "hydra.runtime.output_dir") if hydra_cfg else None
            )
            signal = cut_short(output_dir) if output_dir else None
            if signal is not None and ret.status == JobStatus.COMPLETED:
                self.interrupted = (
                    f"{signal} ended the trial in {output_dir} early: the search stops here. "
                    "Run the same command again to continue it (the cut trial counts as failed "
                    "and a new one takes its place)"
                )
                ret.status = JobStatus.FAILED
                ret.return_value = SearchInterrupted(self.interrupted)
        return returns
