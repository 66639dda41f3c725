"""convseq's command line: `python run.py [task=...] [group=option ...] [key=value ...]`.

Examples:
    python run.py                                     # train fconv_toy on the embedded toy corpus
    python run.py task=preprocess data=multi30k       # binarise a corpus (CONVSEQ_DATA_ROOT=...)
    python run.py model=fconv optim=nag anneal=force
    python run.py -m optim=nag,sgd anneal=plateau,force,lua   # a sweep, one folder per job
    python run.py --help                              # the tasks, the groups and every key
"""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from convseq.cli.command_line import compose_without_run_folder, main_guard, wants_no_run_folder
from convseq.cli.dispatch import dispatch
from convseq.cli.hydra_callbacks import job_errors
from convseq.cli.rank_args import rank_args
from convseq.cli.schema import register_configs

CONF_DIR = Path(__file__).resolve().parent / "conf"

register_configs()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig):
    """Compose conf/, then run `cfg.task` on the resolved, plain config."""
    with job_errors():  # a failed sweep job leaves its error for the sweep report
        return dispatch(cfg)


if __name__ == "__main__":
    main_guard(sys.argv[1:], CONF_DIR)  # a misspelt key fails here, with the closest known keys
    if wants_no_run_folder(sys.argv[1:]):  # task=preprocess: no run folder, no .hydra/
        dispatch(compose_without_run_folder(sys.argv[1:], CONF_DIR, "config"))
    else:
        # a rank other than the first of a torchrun / srun / multi-machine launch: no .hydra/
        # and a log of its own in the shared run folder (convseq.cli.rank_args)
        sys.argv[1:] = rank_args(sys.argv[1:], os.environ)
        main()
