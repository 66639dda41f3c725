"""convseq's command line: `python run.py [task=...] [group=option ...] [key=value ...]`.

Examples:
    python run.py                                     # train fconv_toy on the embedded toy corpus
    python run.py task=preprocess data=multi30k       # binarise a corpus (CONVSEQ_DATA_ROOT=...)
    python run.py model=fconv optim=nag anneal=force
    python run.py -m optim=nag,sgd anneal=plateau,force,lua   # a sweep, one folder per job
    python run.py task=generate ckpt=outputs/... --cfg job    # the keys a task uses, resolved
    python run.py --help                              # the tasks, the groups and every key

Each task composes its own primary config, conf/<task>.yaml (train's where no task= is given).
"""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from convseq.cli.command_line import (
    compose_without_run_folder,
    main_guard,
    task_of,
    wants_no_run_folder,
)
from convseq.cli.dispatch import dispatch
from convseq.cli.hydra_callbacks import job_errors
from convseq.cli.rank_args import rank_args
from convseq.cli.schema import open_node_args, register_configs
from convseq.common.run_record import run_record

CONF_DIR = Path(__file__).resolve().parent / "conf"

register_configs()


def main(cfg: DictConfig):
    """Run `cfg.task` on its composed config (see convseq.cli.dispatch)."""
    # the folder's record is this command's once it takes the folder (an existing run's stays as
    # it was when the command stops before: convseq.common.run_record); a failed job leaves its
    # error in its folder for the reports
    with run_record(), job_errors():
        return dispatch(cfg)


if __name__ == "__main__":
    argv = sys.argv[1:]
    main_guard(argv, CONF_DIR)  # a misspelt key fails here, with the closest known keys
    if wants_no_run_folder(argv):  # task=preprocess: no run folder, no .hydra/
        dispatch(compose_without_run_folder(argv, CONF_DIR))
    else:
        # a rank other than the first of a torchrun / srun / multi-machine launch: no .hydra/
        # and a log of its own in the shared run folder (convseq.cli.rank_args)
        # data.KEY=VALUE alone (a task that reads a checkpoint): added to its open data node
        sys.argv[1:] = rank_args(open_node_args(argv), os.environ)
        hydra.main(config_path="conf", config_name=task_of(argv), version_base="1.3")(main)()
