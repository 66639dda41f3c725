"""The summary table preprocessing prints once it has built a data-bin (from its meta.json)."""

from __future__ import annotations

from pathlib import Path


def format_summary(path: Path, meta: dict) -> str:
    """A short table: sentences, tokens, unk % and skipped pairs per split."""
    src, tgt = meta["src_lang"], meta["tgt_lang"]
    lines = [
        f"data-bin {meta['name']} {src}->{tgt}: {path} (built in {meta['build_seconds']:.1f} s)",
        f"  {'split':<6}{'sentences':>10}{src + ' tok':>12}{tgt + ' tok':>12}"
        f"{src + ' unk%':>10}{tgt + ' unk%':>10}  skipped",
    ]
    for role, info in meta["splits"].items():
        skipped = sum(info["skipped"].values())
        reasons = ", ".join(f"{k} {n}" for k, n in info["skipped"].items())
        lines.append(
            f"  {role:<6}{info['sentences']:>10}{info['src']['tokens']:>12}{info['tgt']['tokens']:>12}"
            f"{100 * info['src']['unk_rate']:>10.2f}{100 * info['tgt']['unk_rate']:>10.2f}  "
            f"{skipped}" + (f" ({reasons})" if reasons else "")
        )
    vocab, sub = meta["vocab"], meta["subword"]
    seg = (
        "whitespace tokens"
        if sub["type"] == "none"
        else (
            f"sentencepiece {sub['type']} {'joint' if sub['joint'] else 'per language'}, pieces "
            + ", ".join(f"{k} {n}" for k, n in sub["pieces"].items())
        )
    )
    joined = " (joined)" if vocab["joined"] else ""
    lines.append(
        f"  dictionaries: {src} {vocab['src_size']}, {tgt} {vocab['tgt_size']} symbols{joined}; {seg}"
    )
    for side, given in vocab.get("given", {}).items():  # data.src_dict / data.tgt_dict
        lines.append(f"  {meta[side + '_lang']} dictionary as given: {given['path']}")
    return "\n".join(lines)
