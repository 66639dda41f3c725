"""The test references of the study's paired bootstrap, when no reference file is given.

The baseline run's `.hydra/config.yaml` keeps its `data` settings unresolved; they are resolved
under the data root and cache folder that `python run.py` composes here (`run_paths`: the
primary config's `paths`, so ``CONVSEQ_DATA_ROOT``, ``CONVSEQ_CACHE`` and `conf/local/` apply as
for the runs), and the data-bin they name is found (or built) as training did.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from convseq.errors import DataError

from .bootstrap import ReferenceLoader

__all__ = ["CONF_DIR", "databin_references", "run_paths"]

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the project's primary config


def run_paths(conf_dir: str | Path = CONF_DIR) -> dict[str, str]:
    """``data_root`` and ``cache_dir`` as `python run.py` composes them (absolute paths)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.cli.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(Path(conf_dir).absolute()), version_base="1.3"):
            cfg = compose(config_name="train")
    finally:
        GlobalHydra.instance().clear()
    return {key: str(cfg.paths[key]) for key in ("data_root", "cache_dir")}


def databin_references(paths: Mapping[str, Any], split: str = "test") -> ReferenceLoader:
    """A loader of the `split` references from the data-bin of a run folder's own `data`.

    The run's `.hydra/config.yaml` keeps its settings unresolved; its `paths` are replaced by
    `paths` (data root and cache folder, e.g. `run_paths()`), then `data` is resolved and its
    data-bin found (or built) as training did.
    """

    def load(run_dir: Path) -> tuple[list[str], str]:
        from omegaconf import OmegaConf

        from convseq.data.databin import DataBin
        from convseq.data.preprocess import prepare_databin

        config = run_dir / ".hydra" / "config.yaml"
        if not config.is_file():
            raise DataError(
                "no saved config to find the run's data-bin; pass --refs FILE", str(config)
            )
        try:
            cfg = OmegaConf.load(config)
            cfg.paths = {k: str(paths[k]) for k in ("data_root", "cache_dir")}
            data = OmegaConf.to_container(cfg.data, resolve=True)
        except Exception as e:  # a broken file or an interpolation it cannot resolve here
            raise DataError(
                f"cannot read the run's data settings ({type(e).__name__}: {e}); pass --refs FILE",
                str(config),
            ) from e
        databin = DataBin(prepare_databin(data, str(paths["cache_dir"]), progress=False))
        return databin.text(split, "tgt"), f"{databin.path} ({split} references)"

    return load
