"""convseq's command line: `python run.py [task=...] [group=option ...] [key=value ...]`.

Examples:
    python run.py                                     # train fconv_toy on the embedded toy corpus
    python run.py task=preprocess data=multi30k       # binarise a corpus (CONVSEQ_DATA_ROOT=...)
    python run.py model=fconv optim=nag anneal=force
    python run.py -m optim=nag,sgd anneal=plateau,force,lua   # a sweep, one folder per job
"""

import hydra
from omegaconf import DictConfig

from convseq.tasks.dispatch import dispatch
from convseq.tasks.schema import register_configs

register_configs()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig):
    """Compose conf/, then run `cfg.task` on the resolved, plain config."""
    return dispatch(cfg)


if __name__ == "__main__":
    main()
