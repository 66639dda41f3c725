"""Attention heatmaps of translations: ``task=generate gen.plot_attention=N``.

One PNG per sentence, ``attention-<split>-<i>.png`` for the first N sentences of the split (in
corpus order): the source pieces (EOS included) along x, the best hypothesis' pieces (EOS
included) along y, and in each cell the decoder's layer-averaged attention the search returned
for that hypothesis, so each row is one output token's attention over the source (it sums to 1)
and its brightest cell is that token's ``A-`` alignment in the n-best file.

Building the data (`attention_map`) is kept apart from drawing it (`draw_attention`), which uses
matplotlib's object API with the Agg canvas, as every `convseq.viz` figure: no pyplot, no window.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from convseq.errors import ConvseqError
from convseq.viz.canvas import new_figure, save_png

__all__ = ["AttentionMap", "attention_map", "draw_attention", "write_attention_plots"]


@dataclass
class AttentionMap:
    """What one heatmap shows.

    Attributes:
        index: the sentence's index in the split.
        weights: (target len, source len) attention, EOS included on both sides.
        source: the source pieces (x tick labels), EOS included.
        target: the hypothesis pieces (y tick labels), EOS included.
    """

    index: int
    weights: np.ndarray
    source: list[str]
    target: list[str]


def attention_map(record: Mapping[str, Any]) -> AttentionMap:
    """The heatmap data of a translation record's best hypothesis (see `convseq.inference.translator`).

    Raises:
        ConvseqError: the record holds no attention (the search ran with ``need_attn`` off), or
            its attention does not match its pieces.
    """
    best = record["hypotheses"][0]
    attention = best.get("attention")
    if attention is None:
        raise ConvseqError(
            f"sentence {record['id']}: the search returned no attention; run with "
            "gen.need_attn=true to plot it"
        )
    weights = attention.float().cpu().numpy().T  # (src_len, L) -> (L, src_len)
    source, target = list(record["src_symbols"]), list(best["symbols"])
    if weights.shape != (len(target), len(source)):
        raise ConvseqError(
            f"sentence {record['id']}: attention of shape {tuple(weights.shape)} for "
            f"{len(target)} output and {len(source)} source pieces"
        )
    return AttentionMap(int(record["id"]), weights, source, target)


def draw_attention(amap: AttentionMap, title: str | None = None) -> Any:
    """A matplotlib Figure (Agg canvas) of the heatmap, with a colour bar."""
    rows, cols = amap.weights.shape
    # about 0.32 inch per piece so the labels stay legible, within sane bounds
    width = min(max(4.0, 0.32 * cols + 2.5), 30.0)
    height = min(max(3.5, 0.32 * rows + 1.8), 30.0)
    fig = new_figure(width, height)
    ax = fig.subplots()
    image = ax.imshow(amap.weights, cmap="viridis", vmin=0.0, aspect="auto", interpolation="none")
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    # parse_math off: a piece such as "$5" or "$x$" is shown as written, never as mathtext
    ax.set_xticklabels(amap.source, rotation=60, ha="right", fontsize="small", parse_math=False)
    ax.set_yticklabels(amap.target, fontsize="small", parse_math=False)
    ax.set_xlabel("source pieces")
    ax.set_ylabel("hypothesis pieces")
    ax.set_title(title or f"sentence {amap.index}: attention", fontsize="medium")
    fig.colorbar(image, ax=ax, label="attention (mean over decoder layers)")
    fig.tight_layout()
    return fig


def write_attention_plots(
    records: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike, split: str, n: int
) -> list[Path]:
    """``attention-<split>-<i>.png`` for the first ``n`` records (sorted by id); their paths."""
    paths = []
    for record in list(records)[: max(int(n), 0)]:
        amap = attention_map(record)
        fig = draw_attention(amap, title=f"{split} sentence {amap.index}: attention")
        paths.append(save_png(fig, Path(out_dir) / f"attention-{split}-{amap.index}.png"))
    return paths
