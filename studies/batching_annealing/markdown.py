"""The study report as markdown, rendered from its plain record (`report.study_record`).

Everything shown here is in `study_report.json` too; this module only formats (None: unknown).
"""

from __future__ import annotations

from typing import Any

from .effects import CLAIM

__all__ = ["to_markdown"]


def _num(x: Any, digits: int = 1, sign: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _hms(seconds: Any) -> str:
    if seconds is None:
        return "n/a"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def _p(row: dict[str, Any], alpha: float) -> str:
    if row["p_note"] == "baseline":
        return "(baseline)"
    if row["p_value"] is None:
        return f"n/a ({row['p_note']})" if row["p_note"] else "n/a"
    return f"{row['p_value']:.3f}" + (" *" if row["p_value"] < alpha else "")


def _arm_table(record: dict[str, Any]) -> list[str]:
    head = ["arm", "batching", "annealing", "optimiser", "seed", "status", "s/epoch",
            "time from", "epochs", "total time", "anneal start", "best valid BLEU (epoch)",
            "test BLEU", "p vs baseline", "stop reason"]  # fmt: skip
    alpha = record["bootstrap"]["alpha"]
    rows = []
    for r in record["rows"]:
        bleu = "n/a" if r["best_valid_bleu"] is None else f"{r['best_valid_bleu']:.2f}"
        rows.append([
            r["run"], r["batching"], r["annealing"], r["optimiser"], r["seed"], r["status"],
            _num(r["seconds_per_epoch"]), r["time_source"], r["epochs"],
            _hms(r["total_seconds"]), r["anneal_start"] or "none",
            f"{bleu} ({r['best_bleu_epoch'] or 'n/a'})", _num(r["test_bleu"], 2),
            _p(r, alpha), r["stop_reason"] or "n/a",
        ])  # fmt: skip
    return _table(head, rows)


def _sources(record: dict[str, Any]) -> str:
    used = sorted({r["time_source"] for r in record["rows"]})
    text = (
        "Seconds per epoch and total time: `timing.json` rows were measured apart, on a quiet "
        "machine (train + validation seconds per epoch; total = epochs x their sum); "
        "`summary.json` rows are the run's own figures (training time over epochs, on whatever "
        "else the machine was running); `csv/metrics.csv` rows are an unfinished run's epochs so "
        "far."
    )
    return text + f" Used here: {', '.join(f'`{u}`' for u in used)}."


def _bootstrap(record: dict[str, Any]) -> list[str]:
    b = record["bootstrap"]
    if b["note"]:
        return [f"Paired bootstrap of test BLEU: not computed ({b['note']})."]
    return [
        f"Paired bootstrap of test BLEU against `{b['baseline']}` (the PyTorch-style end point): "
        f"{b['n_samples']} resamples of the test sentences, references {b['references']}; "
        f"* p < {b['alpha']:g}. {b['signature']}"
    ]


def _factorial(record: dict[str, Any]) -> list[str]:
    e, h = record["factorial"]["epochs"], record["factorial"]["hours"]
    setting = record["nag_setting"]
    arms = ", ".join(f"{c} = `{e['runs'][c] or 'missing'}`" for c in ("tp", "tl", "sp", "sl"))
    what = f"{setting[0].upper()} {setting[1]:g}, lr {setting[2]:g}" if setting else "NAG"
    lines = [
        "## Where the extra epochs come from",
        "",
        f"Seed 1, {what}: {arms}. Annealing rule = ((tp - tl) + (sp - sl)) / 2, batching rule "
        "= ((tp - sp) + (tl - sl)) / 2; the two sum to tp - sl exactly. One-path versions beside "
        "them; the seed sd is that of one arm's epochs over seeds (pooled over the end points; the "
        "annealing and batching effects average two differences of two arms, so theirs is about "
        "the same), and for tp - sl that of the end points' difference paired by seed.",
        "",
    ]
    sd = record["seeds"]["pooled_epochs_sd"]
    sd_text = f"+- {sd:.1f}" if sd is not None else "n/a"
    diff_sd = record["seeds"]["difference"]["epochs"]["sd"]
    diff_text = f"+- {diff_sd:.1f} (paired seeds)" if diff_sd is not None else "n/a"
    rows = [
        ["epochs: tp, tl, sp, sl", " / ".join(_num(e["values"][c], 0) for c in e["values"]),
         "", "", ""],
        ["tp - sl (extra epochs)", _num(e["total"], sign=True), "", "", diff_text],
        ["annealing rule (plateau - lua)", _num(e["anneal"], sign=True),
         f"tokens {_num(e['anneal_paths']['tokens'], sign=True)}",
         f"sentences {_num(e['anneal_paths']['sentences'], sign=True)}", sd_text],
        ["batching rule (tokens - sentences)", _num(e["batching"], sign=True),
         f"plateau {_num(e['batching_paths']['plateau'], sign=True)}",
         f"lua {_num(e['batching_paths']['lua'], sign=True)}", sd_text],
        ["hours: tp - sl", _num(h["total"], 2, sign=True), "", "", ""],
        ["hours: annealing rule", _num(h["anneal"], 2, sign=True),
         f"tokens {_num(h['anneal_paths']['tokens'], 2, sign=True)}",
         f"sentences {_num(h['anneal_paths']['sentences'], 2, sign=True)}", ""],
        ["hours: batching rule", _num(h["batching"], 2, sign=True),
         f"plateau {_num(h['batching_paths']['plateau'], 2, sign=True)}",
         f"lua {_num(h['batching_paths']['lua'], 2, sign=True)}", ""],
    ]  # fmt: skip
    lines += _table(["part", "2x2", "one path", "other path", "seed sd (epochs)"], rows)
    sources = {r["run"]: r["time_source"] for r in record["rows"]}
    used = sorted({sources[n] for n in e["runs"].values() if n in sources})
    if len(used) > 1:
        lines += ["", f"The hours mix time sources ({', '.join(used)}): list every arm in "
                  "`timing.json` to compare them on one machine's figures."]  # fmt: skip
    if e["missing"]:
        lines += ["", "Not computable from: " + "; ".join(
            f"{c} ({why})" for c, why in e["missing"].items()) + "."]  # fmt: skip
    return lines


def _momentum(record: dict[str, Any]) -> list[str]:
    rows = record["momentum"]
    lines = ["## Momentum", ""]
    if not rows:
        return lines + ["No plain-SGD (momentum 0) arm in this folder: momentum not measured."]
    lines += [
        "Each NAG arm against its plain-SGD (momentum 0) counterparts, same rules, seed 1; "
        "NAG - SGD is the epochs momentum adds (negative: it saves them).",
        "",
    ]
    body = [
        [f"{r['batching']} + {r['anneal']}", r["run"] or "missing",
         r["optimiser"] or "n/a" if not r["lr_note"] else f"{r['optimiser']} ({r['lr_note']})",
         r["epochs_text"], _num(r["test_bleu"], 2), r["nag_minus_sgd_text"] or ""]
        for r in rows
    ]  # fmt: skip
    return lines + _table(["rules", "arm", "optimiser", "epochs", "test BLEU", "NAG - SGD"], body)


def _seeds(record: dict[str, Any]) -> list[str]:
    s = record["seeds"]
    lines = ["## Seed spread of the end points", ""]

    def stats(d: dict[str, Any], digits: int) -> list[str]:
        if not d["n"]:
            return ["n/a", "n/a", "n/a"]
        return [_num(d["mean"], digits), _num(d["sd"], digits),
                f"{_num(d['min'], digits)} - {_num(d['max'], digits)}"]  # fmt: skip

    rows = []
    for cell, name in (("tp", "tp (tokens + plateau)"), ("sl", "sl (sentences + lua)")):
        d = s["end_points"][cell]
        seeds = ", ".join(str(x) for x in d["seeds"]) or "none finished"
        rows.append([name, seeds, *stats(d["epochs"], 1), *stats(d["test_bleu"], 2)])
    d = s["difference"]
    seeds = ", ".join(str(x) for x in d["seeds"]) or "none in both"
    rows.append(
        ["tp - sl, paired by seed", seeds, *stats(d["epochs"], 1), *stats(d["test_bleu"], 2)]
    )
    head = ["end point", "seeds", "epochs mean", "sd", "min - max",
            "test BLEU mean", "sd", "min - max"]  # fmt: skip
    return lines + _table(head, rows)


def to_markdown(record: dict[str, Any]) -> str:
    """The whole report: table, sources, bootstrap, decomposition, momentum, seeds, verdict, plots."""
    lo, hi = CLAIM
    lines = [
        f"# Study report: {record['study_dir']}",
        "",
        f"{len(record['rows'])} arms. Annealing start: the first epoch trained with an lr below "
        "the first epoch's. Test BLEU: sacreBLEU of best.ckpt (best valid BLEU) on test. A run "
        "counts in the decomposition only once its own annealing rule stopped it.",
        "",
        *_arm_table(record),
        "",
        _sources(record),
        "",
        *_bootstrap(record),
        "",
        *_factorial(record),
        "",
        *_momentum(record),
        "",
        *_seeds(record),
        "",
        f'## Does "plateau adds {lo:g}-{hi:g} epochs" hold?',
        "",
        record["verdict"],
    ]
    if record["notes"]:
        lines += ["", "Notes: " + "; ".join(record["notes"]) + "."]
    plots = record.get("plots")
    if plots:
        lines += [
            "",
            f"![validation BLEU by training minutes]({plots['bleu']})",
            "",
            f"![learning rate by epoch, log axis]({plots['lr']})",
            "",
            f"![epochs and total time per arm]({plots['bars']})",
        ]
    return "\n".join(lines) + "\n"
