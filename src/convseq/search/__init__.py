"""Generation: the tensorized beam search, the reference per-hypothesis search, greedy decoding.

`beam_search` is the one to use; `reference_beam_search` (the Lua toolkit's loop structure) and
`greedy` (argmax over the full forward) exist to check it and to measure it.
"""

from convseq.search.beam import beam_search
from convseq.search.greedy import greedy
from convseq.search.interface import (
    Hypothesis,
    IncrementalDecoderModel,
    SearchModel,
    as_search_model,
)
from convseq.search.reference import reference_beam_search
from convseq.search.timing import PHASES, PhaseTimer, SearchTimer

__all__ = [
    "PHASES",
    "Hypothesis",
    "IncrementalDecoderModel",
    "PhaseTimer",
    "SearchModel",
    "SearchTimer",
    "as_search_model",
    "beam_search",
    "greedy",
    "reference_beam_search",
]
