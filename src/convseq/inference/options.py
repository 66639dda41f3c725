"""The `gen` config group: search and generation settings (fairseq-generate's flags).

`GenConfig` is the group's schema and the search settings a `Translator` holds: one class, read
by task=generate / interactive, by BLEU during training and by the notebook API.
`search_kwargs()` gives the keys the beam search takes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_TOKENS = 4000  # source tokens per batch when translating raw text

# the keys of GenConfig that the search itself takes (convseq.search.beam.beam_search)
SEARCH_KEYS = (
    "beam",
    "lenpen",
    "unk_penalty",
    "min_len",
    "max_len_a",
    "max_len_b",
    "nbest",
    "normalize_scores",
    "need_attn",
)


@dataclass
class GenConfig:
    """Generation: task=generate / interactive, and BLEU in training (fairseq-generate's flags)."""

    beam: int = 5
    lenpen: float = 1.0  # scores divided by length ** lenpen
    unk_penalty: float = 0.0  # subtracted from the unknown word's log-prob
    min_len: int = 1  # EOS forbidden before this many tokens
    max_len_a: float = 0.0  # EOS forced after int(max_len_a * src_len + max_len_b) tokens
    max_len_b: int = 200
    nbest: int = 1  # hypotheses per sentence in the n-best file (and interactive output)
    normalize_scores: bool = True  # false: fairseq's --unnormalized (plain log-prob sums)
    need_attn: bool = True  # attention alignments in the n-best file (false: a little faster)
    precision: str = "fp32"  # fp32 | bf16 | int8: task=generate/interactive (docs/generation.md)
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # source tokens per batch, padding included
    batch_size: int | None = None  # sentences per batch (with or instead of max_tokens)
    split: str = "test"  # valid | test | a name of data.test_sets: what task=generate translates
    input: str | None = None  # task=generate: a raw text file to translate instead of a split
    reference: str | None = None  # task=generate with input: its reference file (BLEU, chrF)
    tokenize: str = "13a"  # sacreBLEU's tokenizer
    profile: bool = False  # task=generate: print where the time goes (+ a bar chart PNG)
    plot_attention: int = 0  # task=generate: attention heatmap PNGs of the first N sentences
    output: str | None = None  # folder of the generate files (default: the run folder)
    dict_dir: str | None = None  # fairseq checkpoints: folder of dict.<lang>.txt (default: beside)
    test_bleu: bool = True  # task=train: translate the test split with the best checkpoint

    def search_kwargs(self) -> dict[str, Any]:
        """The settings the beam search takes (`SEARCH_KEYS`), by name."""
        return {key: getattr(self, key) for key in SEARCH_KEYS}

    def updated(self, **overrides: Any) -> GenConfig:
        """A copy with `overrides` (``beam=5, nbest=3``); an unknown name is refused.

        Raises:
            TypeError: a name that is not a generation setting.
        """
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown generation option(s) {unknown}; valid: {sorted(names)}")
        return dataclasses.replace(self, **overrides) if overrides else self
