"""One run folder for all ranks: a process that is not the first of a multi-process launch
keeps Hydra's files out of it, except a log file of its own.

Every process that runs `python run.py` goes through Hydra, which writes `.hydra/` and `run.log`
into the run folder. When a launcher other than Lightning starts the processes (`torchrun`,
SLURM's `srun`, the same command on every machine with `NODE_RANK`), each process would write
them into the shared folder: the same `.hydra/` files rewritten by every node, and one `run.log`
with the lines of all processes interleaved. `rank_args` gives such a process the overrides that
Lightning gives the processes it starts itself (`hydra.output_subdir=null`, its own
`hydra.job.name`, so its log is `train_node{N}_process_{L}.log`); global rank 0 keeps `.hydra/`
and `run.log`, and convseq writes nothing else from the other ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["launch_position", "rank_args"]

# set by Lightning on the processes it starts itself (with its own hydra.* overrides)
_RELAUNCHED = "hydra.output_subdir="
_OURS = ("hydra.output_subdir=", "hydra.job.name=")


def launch_position(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(node rank, local rank) of this process as its launcher numbered it; None when no
    multi-process launcher started it.

    torchrun sets GROUP_RANK and LOCAL_RANK; SLURM sets SLURM_NODEID and SLURM_LOCALID (unless
    the job is named `bash` or `interactive`, which Lightning takes for no job); a machine of a
    multi-node run without a scheduler has NODE_RANK (and LOCAL_RANK on the processes Lightning
    starts).
    """
    if "TORCHELASTIC_RUN_ID" in environ and "GROUP_RANK" in environ:
        return int(environ["GROUP_RANK"]), int(environ.get("LOCAL_RANK", "0"))
    if "SLURM_NTASKS" in environ and environ.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return int(environ.get("SLURM_NODEID", "0")), int(environ.get("SLURM_LOCALID", "0"))
    if "NODE_RANK" in environ:
        return int(environ["NODE_RANK"]), int(environ.get("LOCAL_RANK", "0"))
    return None


def rank_args(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """run.py's arguments for this process: unchanged for the first process of node 0 (and for
    a process Lightning started on node 0, which Lightning already set up), otherwise with
    `hydra.output_subdir=null hydra.job.name=train_node{N}_process_{L}` replacing any given."""
    where = launch_position(environ)
    if where is None or where == (0, 0):
        return list(argv)
    node, local = where
    if node == 0 and any(a.startswith(_RELAUNCHED) for a in argv):
        return list(argv)  # Lightning's own: train_ddp_process_{L}.log
    kept = [a for a in argv if not a.startswith(_OURS)]
    return [*kept, "hydra.output_subdir=null", f"hydra.job.name=train_node{node}_process_{local}"]
