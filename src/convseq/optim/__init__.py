"""Optimisers (fairseq's NAG, SGD, Adam) and the per-epoch learning-rate annealing rules."""

from convseq.optim.anneal import STRATEGIES, Annealer
from convseq.optim.build import OptimConfigError, build_optimizer
from convseq.optim.config import OPTIMIZERS
from convseq.optim.nag import NAG

__all__ = [
    "NAG",
    "OPTIMIZERS",
    "STRATEGIES",
    "Annealer",
    "OptimConfigError",
    "build_optimizer",
]
