"""Translation records in order, and what is written from them: the n-best file, the speed line.

A translation record is what `Translator.translate_batch` returns for one sentence (its layout is
in `convseq.inference.translator`'s docstring). Batches come back sorted by length;
`in_input_order` restores the input order, `best_texts` takes each sentence's best hypothesis.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from convseq.errors import DataError

LN2 = math.log(2.0)


def in_input_order(records: Iterable[Any]) -> list[dict[str, Any]]:
    """Records (or trainer.predict's list of per-batch lists) sorted by sentence id.

    Raises:
        ValueError: a sentence id appears twice (e.g. outputs of several DDP ranks mixed).
    """
    flat: list[dict[str, Any]] = []
    for item in records:
        if isinstance(item, Mapping):
            flat.append(dict(item))
        else:
            flat.extend(dict(r) for r in item)
    flat.sort(key=lambda r: r["id"])
    for a, b in zip(flat, flat[1:]):
        if a["id"] == b["id"]:
            raise ValueError(f"sentence {a['id']} was translated twice")
    return flat


def best_texts(records: Sequence[Mapping[str, Any]], total: int) -> list[str]:
    """The best hypothesis text of sentences 0..total-1 (records sorted by id, none missing)."""
    if [r["id"] for r in records] != list(range(total)):
        raise DataError(
            f"translated {len(records)} sentences but the split has {total}: some sentences were "
            "not translated"
        )
    return [r["hypotheses"][0]["text"] for r in records]


def write_nbest(
    path: Path, records: Sequence[Mapping[str, Any]], refs: Sequence[str] | None
) -> None:
    """fairseq-generate's S/T/H/D/P/A lines for every sentence; scores in base 2, as fairseq's.

    ``refs=None`` (no reference) writes no ``T-`` lines, as fairseq-interactive prints none.
    """
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            i = r["id"]
            f.write(f"S-{i}\t{' '.join(r['src_symbols'][:-1])}\n")
            if refs is not None:
                f.write(f"T-{i}\t{refs[i]}\n")
            for h in r["hypotheses"]:
                score = f"{h['score'] / LN2:.6f}"
                pieces = " ".join(h["symbols"][:-1])
                pos = " ".join(f"{x / LN2:.4f}" for x in h["positional_scores"].tolist())
                f.write(f"H-{i}\t{score}\t{pieces}\n")
                f.write(f"D-{i}\t{score}\t{h['text']}\n")
                f.write(f"P-{i}\t{pos}\n")
                if h["alignment"]:
                    f.write(f"A-{i}\t{' '.join(map(str, h['alignment']))}\n")


def write_hypotheses(path: Path, hypotheses: Sequence[str]) -> Path:
    """generate-<split>.txt: one detokenised hypothesis per line, in input order."""
    path.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    return path


def speed_line(sentences: int, tokens: int, seconds: float) -> str:
    """fairseq's speed report: ``Translated N sentences (M tokens) in Xs (Y sentences/s, Z tokens/s)``."""
    s = max(seconds, 1e-9)
    return (
        f"Translated {sentences} sentences ({tokens} tokens) in {seconds:.1f}s "
        f"({sentences / s:.2f} sentences/s, {tokens / s:.2f} tokens/s)"
    )


def generated_tokens(records: Sequence[Mapping[str, Any]]) -> int:
    """Tokens of the best hypotheses, EOS included (what fairseq's speed line counts)."""
    return sum(int(r["hypotheses"][0]["tokens"].numel()) for r in records)
