"""Refusing a split that would leave nothing to train on, validate on or score.

Preprocessing calls these before any data-bin is finished: a split whose file holds no text at
all (only empty or whitespace-only lines), and a split none of whose pairs survives the filters
(train's empty and `drop_train_regex` pairs, then over-long pairs), are errors that name the
split's files, the config key that chose them and the counts that led there. Single empty lines
in valid/test are kept on purpose (translated as empty; see `data.eval_overlong`): only a file
with no non-empty line is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from convseq.data.config import DataConfig
from convseq.data.databin import SPLITS
from convseq.data.textio import SKIP_EMPTY, SKIP_REGEX, SKIP_TOO_LONG, TextInfo
from convseq.errors import DataError


def split_key(cfg: DataConfig, role: str) -> str:
    """The config key that names the input files of split `role` (e.g. `data.valid_split`)."""
    if role in SPLITS:
        return f"data.{role}_split"
    return f"data.test_sets.{role}"


def require_text(cfg: DataConfig, role: str, infos: tuple[TextInfo, TextInfo]) -> None:
    """Refuse a split one of whose files holds no text (every line empty after stripping).

    Raises:
        DataError: naming the file(s) without text, their line counts and what to do.
    """
    empty = [info for info in infos if not info.has_text]
    if not empty:
        return
    files = " and ".join(f"{info.path} ({len(info)} lines)" for info in empty)
    verb = "holds" if len(empty) == 1 else "hold"
    raise DataError(
        f"the {role} split is empty: {files} {verb} no text (no line but empty or whitespace-only "
        f"ones); every split needs at least one sentence pair: fill the file(s), or point "
        f"{split_key(cfg, role)} at the right files (data.dir={cfg.dir})"
    )


def require_pairs(
    cfg: DataConfig,
    role: str,
    paths: tuple[Path, Path],
    input_lines: int,
    kept: int,
    skipped: Mapping[str, int],
) -> None:
    """Refuse a split whose filters left no pair (`kept` of `input_lines` pairs, `skipped` why).

    Raises:
        DataError: naming the split's files, the pairs dropped per reason and the settings behind.
    """
    if kept > 0:
        return
    reasons = "; ".join(f"{n} {_why(cfg, reason)}" for reason, n in sorted(skipped.items()) if n)
    raise DataError(
        f"the {role} split keeps no sentence pair: none of the {input_lines} pairs of "
        f"{paths[0]} and {paths[1]} is left ({reasons or 'none skipped'}); every split needs at "
        f"least one: {_settings(skipped)}"
    )


def _why(cfg: DataConfig, reason: str) -> str:
    """Why pairs were dropped, in words that name the setting."""
    if reason == SKIP_EMPTY:
        return "with an empty side after stripping whitespace"
    if reason == SKIP_REGEX:
        return f"matching data.drop_train_regex={cfg.drop_train_regex!r}"
    if reason == SKIP_TOO_LONG:
        return f"longer than data.max_positions={cfg.max_positions} tokens, EOS included"
    return reason


def _settings(skipped: Mapping[str, int]) -> str:
    """What to change: the files, and the settings that dropped this split's pairs."""
    keys = {SKIP_REGEX: "data.drop_train_regex", SKIP_TOO_LONG: "data.max_positions"}
    named = [keys[r] for r in sorted(skipped) if skipped[r] and r in keys]
    return "fix the files" + "".join(f", or change {k}" for k in named)
