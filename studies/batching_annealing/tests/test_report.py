"""The study report over hand-made run folders whose answers are known by construction.

The fake study (NAG 0.99 lr 0.25 unless said otherwise, seed 1 unless said otherwise):

| arm | epochs | lr falls at | stop | seconds |
|---|---|---|---|---|
| tok_plateau_s1 (tp) | 20 | 16 | its rule | timing.json: 50 + 10 s an epoch |
| tok_lua_s1 (tl) | 12 | 9 | its rule | 100 s an epoch |
| sen_plateau_s1 (sp) | 18 | 14 | its rule | 100 |
| sen_lua_s1 (sl) | 10 | 7 | its rule | 100 |
| tok_plateau_s2, _s3 | 22, 21 | 18, 17 | its rule | 100 |
| sen_lua_s2, _s3 | 11, 12 | 8, 9 | its rule | 100 |
| tok_force_s1 (force@9) | 12 | 9 | its rule | 100 |
| tok_plateau_sgd_s1 (SGD 0, lr 0.25) | 30 | never | trainer.max_epochs=30 | 100 |
| tok_plateau_sgd25_s1 (SGD 0, lr 25) | 24 | 20 | its rule | 100 |
| sen_lua_sgd25_s1 (SGD 0, lr 25) | 5 so far | 4 | no summary.json (metrics.csv only, no config.yaml) | 100 |
| sen_force_s1 (force@7) | 6 so far | never | interrupted | 100 |

So: annealing-rule effect ((20 - 12) + (18 - 10)) / 2 = 8, batching ((20 - 18) + (12 - 10)) / 2 = 2,
tp - sl = 10; tp seeds 20, 22, 21 and sl seeds 10, 11, 12 (sd 1 each, pooled 1), paired
differences 10, 11, 9; momentum at lr 25: 20 - 24 = -4.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tests.conftest import compose_config

from convseq.common.config import plain
from convseq.errors import DataError
from convseq.viz.runs import RunCurves
from studies.batching_annealing import report
from studies.batching_annealing.effects import Factorial, verdict
from studies.batching_annealing.figures import (
    ZOOM_BLEU,
    draw_bleu_minutes,
    draw_epoch_time_bars,
    draw_lr_epochs,
)
from studies.batching_annealing.report import STUDY_FILES, study_record, write_study_report
from studies.batching_annealing.runs import identify_arm, read_timing

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RULE = "lr 2.5e-06 fell below anneal.min_lr 1e-05 (plateau annealing, after epoch {})"
N_SENTENCES = 60


def _lrs(epochs: int, lr0: float, falls_at: int | None) -> list[float]:
    """lr0 until epoch `falls_at`, then x0.1 per epoch (1-based epochs)."""
    return [
        lr0 if falls_at is None or e < falls_at else lr0 * 0.1 ** (e - falls_at + 1)
        for e in range(1, epochs + 1)
    ]


def _history(epochs: int, lr0: float, falls_at: int | None) -> list[dict]:
    """Valid BLEU peaks (30.0) at the last-but-one epoch; 100 s an epoch."""
    peak = max(epochs - 1, 1)
    return [
        {
            "epoch": e,
            "train_epoch/lr": lr,
            "train_epoch/time": 100.0,
            "valid/loss": 5.0,
            "valid/bleu": 30.0 - abs(e - peak),
        }
        for e, lr in zip(range(1, epochs + 1), _lrs(epochs, lr0, falls_at))
    ]


def _config(batching: str, anneal: str, seed: int, optim: str, momentum: float, lr: float,
            force: int = 9) -> str:  # fmt: skip
    return (
        f"seed: {seed}\nbatching:\n  name: {batching}\n  max_tokens: 4000\n"
        f"anneal:\n  name: {anneal}\n  force_anneal: {force}\n"
        f"optim:\n  name: {optim}\n  momentum: {momentum}\n  lr: {lr}\n"
        "paths:\n  output_dir: ${hydra:runtime.output_dir}\n"
    )


def _run(
    root: Path,
    name: str,
    batching: str,
    anneal: str,
    seed: int = 1,
    epochs: int = 10,
    falls_at: int | None = None,
    optim: tuple[str, float, float] = ("nag", 0.99, 0.25),
    test_bleu: float = 30.0,
    reason: str | None = None,
    interrupted: bool = False,
    force: int = 9,
    write_config: bool = True,
) -> Path:
    folder = root / name
    (folder / ".hydra").mkdir(parents=True)
    overrides = ["experiment=multi30k_study", f"batching={batching}", f"anneal={anneal}",
                 f"seed={seed}"]  # fmt: skip
    if optim[0] == "sgd":
        overrides += ["optim=sgd", f"optim.momentum={optim[1]:g}", f"optim.lr={optim[2]:g}"]
    if anneal == "force":
        overrides.append(f"anneal.force_anneal={force}")
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if write_config:
        (folder / ".hydra" / "config.yaml").write_text(
            _config(batching, anneal, seed, *optim, force=force)
        )
    history = _history(epochs, optim[2], falls_at)
    summary = {
        "epochs": epochs,
        "history": history,
        "stop_reason": reason if reason is not None else RULE.format(epochs),
        "interrupted": interrupted,
        "train_seconds": 100.0 * epochs,
        "seconds_per_epoch": 100.0,
        "best_epoch": epochs - 1,
        "test": {"test/bleu": test_bleu},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def _metrics_only(root: Path, name: str, overrides: list[str], epochs: int, lrs: list[float]):
    """A run that is still going: overrides and csv/metrics.csv (0-based epochs), nothing else."""
    folder = root / name
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (folder / "csv").mkdir()
    lines = ["epoch,step,train_epoch/lr,train_epoch/time,valid/bleu,valid/loss"]
    for e in range(epochs):
        lines.append(f"{e},{10 * e},,,{20.0 + e},5.0")  # the valid row
        lines.append(f"{e},{10 * e},{lrs[e]},100.0,,")  # the train-epoch row
    (folder / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")
    return folder


def _references() -> list[str]:
    return [
        f"a dog number {i} runs across the green field with {i % 7} balls"
        for i in range(N_SENTENCES)
    ]


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def study(tmp_path) -> Path:
    root = tmp_path / "study"
    tp = _run(root, "tok_plateau_s1", "tokens", "plateau", epochs=20, falls_at=16, test_bleu=35.0)
    tl = _run(root, "tok_lua_s1", "tokens", "lua", epochs=12, falls_at=9, test_bleu=34.0)
    sp = _run(root, "sen_plateau_s1", "sentences", "plateau", epochs=18, falls_at=14)
    _run(root, "sen_lua_s1", "sentences", "lua", epochs=10, falls_at=7, test_bleu=33.0)
    _run(root, "tok_plateau_s2", "tokens", "plateau", 2, epochs=22, falls_at=18, test_bleu=36.0)
    _run(root, "tok_plateau_s3", "tokens", "plateau", 3, epochs=21, falls_at=17, test_bleu=34.0)
    _run(root, "sen_lua_s2", "sentences", "lua", 2, epochs=11, falls_at=8, test_bleu=33.5)
    _run(root, "sen_lua_s3", "sentences", "lua", 3, epochs=12, falls_at=9, test_bleu=32.5)
    _run(root, "tok_force_s1", "tokens", "force", epochs=12, falls_at=9, force=9)
    _run(root, "tok_plateau_sgd_s1", "tokens", "plateau", epochs=30, optim=("sgd", 0.0, 0.25),
         reason="reached trainer.max_epochs=30", test_bleu=12.0)  # fmt: skip
    sgd25 = _run(root, "tok_plateau_sgd25_s1", "tokens", "plateau", epochs=24, falls_at=20,
                 optim=("sgd", 0.0, 25.0))  # fmt: skip
    _metrics_only(
        root,
        "sen_lua_sgd25_s1",
        [
            "experiment=multi30k_study",
            "batching=sentences",
            "anneal=lua",
            "seed=1",
            "optim=sgd",
            "optim.momentum=0",
            "optim.lr=25",
            "anneal.min_lr=0.001",
        ],  # fmt: skip
        epochs=5,
        lrs=[25.0, 25.0, 25.0, 2.5, 0.25],
    )
    _run(root, "sen_force_s1", "sentences", "force", epochs=6, force=7, interrupted=True)
    # not runs: a code snapshot, logs
    (root / "study_code" / "src").mkdir(parents=True)
    (root / "study_code" / "run.py").write_text("print('not a run')\n")
    (root / "queue1.log").write_text("a log\n")
    # translations: tp and tl identical, sp one word off in every line, sgd25 garbage
    refs = _references()
    _write_lines(tmp_path / "test.en", refs)
    _write_lines(tp / "generate-test.txt", refs)
    _write_lines(tl / "generate-test.txt", refs)
    _write_lines(sp / "generate-test.txt", [r.replace("green", "red") for r in refs])
    _write_lines(sgd25 / "generate-test.txt", ["the the the"] * N_SENTENCES)
    timing = {
        "_note": "medians of 3 epochs on a quiet machine",
        "tok_plateau_s1": {"train_seconds_per_epoch": 50.0, "valid_seconds_per_epoch": 10.0},
        "no_such_arm": {"train_seconds_per_epoch": 1.0, "valid_seconds_per_epoch": 1.0},
    }
    (root / "timing.json").write_text(json.dumps(timing))
    return root


def _refs(tmp_path: Path):
    def load(_: Path) -> tuple[list[str], str]:
        return _references(), str(tmp_path / "test.en")

    return load


def _rows(record: dict) -> dict[str, dict]:
    return {r["run"]: r for r in record["rows"]}


# ---------------------------------------------------------------------------- the table


def test_every_run_folder_is_found_and_its_arm_identified(study, tmp_path):
    _, record = study_record(study, _refs(tmp_path), n_samples=200)
    rows = _rows(record)
    assert set(rows) == {
        "tok_plateau_s1",
        "tok_lua_s1",
        "sen_plateau_s1",
        "sen_lua_s1",
        "tok_plateau_s2",
        "tok_plateau_s3",
        "sen_lua_s2",
        "sen_lua_s3",
        "tok_force_s1",
        "tok_plateau_sgd_s1",
        "tok_plateau_sgd25_s1",
        "sen_lua_sgd25_s1",
        "sen_force_s1",
    }  # fmt: skip  (no study_code, no log, no timing.json)
    tp = rows["tok_plateau_s1"]
    assert (tp["batching"], tp["annealing"], tp["optimiser"], tp["seed"]) == (
        "tokens", "plateau", "NAG 0.99, lr 0.25", 1)  # fmt: skip
    assert rows["tok_force_s1"]["annealing"] == "force@9"
    assert rows["sen_force_s1"]["annealing"] == "force@7"
    assert rows["tok_plateau_sgd25_s1"]["optimiser"] == "SGD 0, lr 25"
    # no config.yaml: read from its overrides
    sgd = rows["sen_lua_sgd25_s1"]
    assert (sgd["batching"], sgd["annealing"], sgd["optimiser"]) == (
        "sentences",
        "lua",
        "SGD 0, lr 25",
    )
    assert record["baseline"] == "tok_plateau_s1"
    assert record["nag_setting"] == ["nag", 0.99, 0.25]


def test_rows_hold_the_known_figures(study, tmp_path):
    _, record = study_record(study, _refs(tmp_path), n_samples=200)
    rows = _rows(record)
    # anneal start: the first epoch with an lr below the first epoch's
    starts = {name: rows[name]["anneal_start"] for name in rows}
    assert starts == {
        "tok_plateau_s1": 16, "tok_lua_s1": 9, "sen_plateau_s1": 14, "sen_lua_s1": 7,
        "tok_plateau_s2": 18, "tok_plateau_s3": 17, "sen_lua_s2": 8, "sen_lua_s3": 9,
        "tok_force_s1": 9, "tok_plateau_sgd_s1": None, "tok_plateau_sgd25_s1": 20,
        "sen_lua_sgd25_s1": 4, "sen_force_s1": None,
    }  # fmt: skip
    # timing.json overrides the run's own seconds: 50 + 10 s an epoch, 20 epochs
    tp = rows["tok_plateau_s1"]
    assert tp["time_source"] == "timing.json"
    assert tp["seconds_per_epoch"] == 60.0 and tp["total_seconds"] == 1200.0
    # the others: their summary.json (100 s an epoch)
    tl = rows["tok_lua_s1"]
    assert tl["time_source"] == "summary.json"
    assert (tl["seconds_per_epoch"], tl["total_seconds"], tl["epochs"]) == (100.0, 1200.0, 12)
    assert (tl["best_valid_bleu"], tl["best_bleu_epoch"], tl["test_bleu"]) == (30.0, 11, 34.0)
    assert tp["stop_reason"] == RULE.format(20) and tp["status"] == "finished"
    # the unfinished one, from metrics.csv: 5 epochs of 100 s, best valid BLEU 24 at epoch 5
    sgd = rows["sen_lua_sgd25_s1"]
    assert sgd["time_source"] == "csv/metrics.csv" and not sgd["finished"]
    assert (sgd["epochs"], sgd["total_seconds"], sgd["seconds_per_epoch"]) == (5, 500.0, 100.0)
    assert (sgd["best_valid_bleu"], sgd["best_bleu_epoch"]) == (24.0, 5)
    assert "no summary.json" in sgd["status"] and sgd["test_bleu"] is None
    assert rows["sen_force_s1"]["status"].startswith("interrupted")
    # timing.json's entry for a folder that is not there is reported, not used
    assert any("no_such_arm" in n for n in record["notes"])


def test_bootstrap_against_the_pytorch_style_end_point(study, tmp_path):
    _, record = study_record(study, _refs(tmp_path), n_samples=200)
    rows = _rows(record)
    assert rows["tok_plateau_s1"]["p_note"] == "baseline"
    assert rows["tok_lua_s1"]["p_value"] == 1.0  # the same translations line for line
    assert rows["tok_plateau_sgd25_s1"]["p_value"] < 0.05  # "the the the" against the references
    assert 0 <= rows["sen_plateau_s1"]["p_value"] <= 1
    assert rows["sen_lua_sgd25_s1"]["p_value"] is None
    assert rows["sen_lua_sgd25_s1"]["p_note"] == "unfinished"
    assert rows["sen_lua_s1"]["p_note"] == "no generate-test.txt"  # finished, no translations
    boot = record["bootstrap"]
    assert boot["baseline"] == "tok_plateau_s1" and boot["n_samples"] == 200
    assert boot["bleu"]["tok_plateau_s1"] == pytest.approx(100.0)  # translations = references


def test_bootstrap_skips_a_file_of_another_length(study, tmp_path):
    _write_lines(study / "sen_plateau_s1" / "generate-test.txt", ["too short"])
    _, record = study_record(study, _refs(tmp_path), n_samples=50)
    row = _rows(record)["sen_plateau_s1"]
    assert row["p_value"] is None and row["p_note"] == f"1 lines for {N_SENTENCES} references"
    assert _rows(record)["tok_lua_s1"]["p_value"] == 1.0  # the others are still tested


# ---------------------------------------------------------------------------- the decomposition


def test_the_two_by_two_decomposition(study, tmp_path):
    _, record = study_record(study, _refs(tmp_path), n_samples=50)
    e = record["factorial"]["epochs"]
    assert e["values"] == {"tp": 20.0, "tl": 12.0, "sp": 18.0, "sl": 10.0}
    assert e["anneal"] == 8.0 and e["batching"] == 2.0 and e["total"] == 10.0
    assert e["anneal"] + e["batching"] == e["total"]
    assert e["anneal_paths"] == {"tokens": 8.0, "sentences": 8.0}
    assert e["batching_paths"] == {"plateau": 2.0, "lua": 2.0}
    assert e["missing"] == {}
    h = record["factorial"]["hours"]  # tp from timing.json: 1200 s; sl 1000 s
    assert h["total"] == pytest.approx(200 / 3600)
    assert h["anneal"] == pytest.approx(((1200 - 1200) + (1800 - 1000)) / 2 / 3600)


def test_momentum_rows(study, tmp_path):
    _, record = study_record(study, _refs(tmp_path), n_samples=50)
    rows = {(r["batching"], r["anneal"], r["run"]): r for r in record["momentum"]}
    nag = rows[("tokens", "plateau", "tok_plateau_s1")]
    assert nag["kind"] == "NAG" and nag["epochs"] == 20
    slow = rows[("tokens", "plateau", "tok_plateau_sgd_s1")]
    assert slow["epochs"] is None and slow["epochs_text"] == "did not anneal within 30 epochs"
    assert slow["lr_note"] == "the NAG lr" and slow["nag_minus_sgd_text"] == "< -10"
    matched = rows[("tokens", "plateau", "tok_plateau_sgd25_s1")]
    assert matched["epochs"] == 24 and matched["nag_minus_sgd"] == -4
    assert "effective step" in matched["lr_note"]
    unfinished = rows[("sentences", "lua", "sen_lua_sgd25_s1")]
    assert unfinished["epochs"] is None and "5 epochs so far" in unfinished["epochs_text"]
    assert rows[("sentences", "lua", "sen_lua_s1")]["epochs"] == 10


def test_epoch_counts_read_as_english():
    from studies.batching_annealing.effects import _epochs

    assert [_epochs(n) for n in (0, 1, 2)] == ["0 epochs", "1 epoch", "2 epochs"]


def test_seed_spread(study, tmp_path):
    _, record = study_record(study, _refs(tmp_path), n_samples=50)
    s = record["seeds"]
    tp, sl = s["end_points"]["tp"], s["end_points"]["sl"]
    assert tp["seeds"] == [1, 2, 3] and sl["seeds"] == [1, 2, 3]
    assert tp["epochs"] == {"n": 3, "mean": 21.0, "sd": 1.0, "min": 20.0, "max": 22.0}
    assert sl["epochs"] == {"n": 3, "mean": 11.0, "sd": 1.0, "min": 10.0, "max": 12.0}
    assert tp["test_bleu"]["mean"] == pytest.approx(35.0) and tp["test_bleu"][
        "sd"
    ] == pytest.approx(1.0)
    assert sl["test_bleu"]["mean"] == pytest.approx(33.0) and sl["test_bleu"][
        "sd"
    ] == pytest.approx(0.5)
    d = s["difference"]  # 20 - 10, 22 - 11, 21 - 12
    assert d["seeds"] == [1, 2, 3]
    assert (d["epochs"]["mean"], d["epochs"]["min"], d["epochs"]["max"]) == (10.0, 9.0, 11.0)
    assert d["epochs"]["sd"] == pytest.approx(1.0)
    assert d["test_bleu"]["mean"] == pytest.approx(2.0)  # 2, 2.5, 1.5
    assert s["pooled_epochs_sd"] == pytest.approx(1.0)
    # 8 epochs, 10-15 within twice the seed sd (8 + 2 = 10): not ruled out
    assert "cannot be ruled out" in record["verdict"] and "+8" in record["verdict"]


def _fact(anneal: float) -> Factorial:
    return Factorial(values={}, missing={}, runs={}, anneal=anneal,
                     anneal_paths={"tokens": anneal, "sentences": anneal})  # fmt: skip


def test_verdict_wording():
    assert "holds here" in verdict(_fact(12.0), 1.0)
    assert "does not hold" in verdict(_fact(8.0), 0.5)  # 8 + 2 * 0.5 < 10
    assert "does not hold" in verdict(_fact(3.0), math.nan)
    assert "no seed spread" in verdict(_fact(3.0), math.nan)
    missing = Factorial(values={}, missing={"tl": "no such run"}, runs={})
    assert "cannot be checked yet" in verdict(missing, 1.0) and "tl: no such run" in verdict(
        missing, 1.0
    )


# ---------------------------------------------------------------------------- degrading gracefully


def test_missing_and_unfinished_arms_do_not_crash(tmp_path):
    root = tmp_path / "study"
    _run(root, "tok_plateau_s1", "tokens", "plateau", epochs=20, falls_at=16)
    _metrics_only(
        root, "sen_lua_s1", ["batching=sentences", "anneal=lua", "seed=1"], 3, [0.25, 0.25, 0.25]
    )  # fmt: skip  (no config.yaml: NAG from... nothing)
    files = write_study_report(root, references=None)
    record = json.loads(files["json"].read_text())
    e = record["factorial"]["epochs"]
    assert e["anneal"] is None and e["batching"] is None and e["total"] is None
    assert e["missing"]["tl"] == "no such run" and e["missing"]["sp"] == "no such run"
    assert "cannot be checked yet" in record["verdict"]
    assert record["bootstrap"]["note"].startswith(
        "no baseline translations"
    )  # no generate-test.txt
    assert record["momentum"] == []
    text = files["markdown"].read_text()
    assert "Not computable from" in text and "momentum not measured" in text
    assert _rows(record)["sen_lua_s1"]["epochs"] == 3


def test_no_run_and_bad_timing_are_named_errors(tmp_path):
    empty = tmp_path / "empty"
    (empty / "study_code").mkdir(parents=True)
    with pytest.raises(DataError, match="no run folders"):
        write_study_report(empty)
    with pytest.raises(DataError, match="no such sweep folder"):
        write_study_report(tmp_path / "nowhere")
    (empty / "timing.json").write_text(json.dumps({"a": {"train_seconds_per_epoch": -1}}))
    with pytest.raises(DataError, match='timing.json: entry "a" needs train_seconds_per_epoch'):
        read_timing(empty)
    (empty / "timing.json").write_text("{not json")
    with pytest.raises(DataError, match="timing.json: not valid JSON"):
        read_timing(empty)


def test_identify_arm_prefers_the_composed_config(tmp_path):
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(
        _config("sentences", "force", 2, "sgd", 0.0, 25.0, 11)
    )
    arm = identify_arm(folder, ["batching=tokens", "seed=5"])  # the config wins
    assert (arm.batching, arm.annealing, arm.seed, arm.optimiser) == (
        "sentences", "force@11", 2, "SGD 0, lr 25")  # fmt: skip


# ---------------------------------------------------------------------------- files and plots


def test_files_and_plots_are_written(study, tmp_path):
    files = write_study_report(study, _refs(tmp_path), n_samples=50)
    assert set(files) == set(STUDY_FILES)
    for kind in ("bleu", "lr", "bars"):
        data = files[kind].read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
        assert files[kind].parent == study
    text = files["markdown"].read_text()
    assert (
        "| tok_plateau_s1 | tokens | plateau | NAG 0.99, lr 0.25 | 1 | finished | 60.0 | timing.json | 20 | 0:20:00 | 16 |"
        in text
    )
    assert "did not anneal within 30 epochs" in text
    assert "![validation BLEU by training minutes](study_bleu_minutes.png)" in text
    record = json.loads(files["json"].read_text())
    curve = next(c for c in record["curves"] if c["run"] == "tok_plateau_s1")
    assert curve["minutes"] == [float(e) for e in range(1, 21)]  # 60 s an epoch, from timing.json
    other = next(c for c in record["curves"] if c["run"] == "tok_lua_s1")
    assert other["minutes"][-1] == pytest.approx(12 * 100 / 60)  # its own train_epoch/time


def test_figures_draw_one_line_per_arm():
    curves = [
        RunCurves("a", Path("a"), "x", [1, 2, 3], [1.0, 2.0, 3.0], [10.0, 20.0, 25.0], [], [0.25, 0.25, 0.025]),
        RunCurves("b", Path("b"), "x", [1, 2], [1.5, None], [12.0, None], [], [25.0, 2.5]),
    ]  # fmt: skip
    bleu = draw_bleu_minutes(curves).axes[0]
    assert len(bleu.lines) == 2 and list(bleu.lines[0].get_xdata()) == [1.0, 2.0, 3.0]
    assert list(bleu.lines[1].get_xdata()) == [1.5]  # the point with no minutes is left out
    lr = draw_lr_epochs(curves).axes[0]
    assert lr.get_yscale() == "log" and list(lr.lines[1].get_ydata()) == [25.0, 2.5]


def test_bleu_figure_zooms_on_the_top_bleu_where_the_rules_differ():
    curves = [
        RunCurves("a", Path("a"), "x", [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0], [5.0, 30.0, 38.0, 40.0], [], [0.25] * 4),
        RunCurves("b", Path("b"), "x", [1, 2, 3], [1.5, 3.0, 4.5], [8.0, 36.0, 37.0], [], [0.25] * 3),
    ]  # fmt: skip
    whole, zoom = draw_bleu_minutes(curves).axes
    assert len(zoom.lines) == len(whole.lines) == 2
    assert zoom.get_ylim()[0] == pytest.approx(40.0 - ZOOM_BLEU)  # best 40: from 34 up
    assert zoom.get_ylim()[1] > 40.0
    x0, x1 = zoom.get_xlim()  # from b's 36 at 3.0 min (the first point >= 34) to the last, 4.5
    assert 2.0 < x0 < 3.0 and 4.5 < x1 < 4.7
    assert whole.get_ylim()[0] < 5.0  # the left panel keeps the whole climb


def test_bleu_zoom_ignores_a_longer_run_that_never_reaches_the_top_bleu():
    curves = [
        RunCurves("a", Path("a"), "x", [1, 2, 3], [1.0, 2.0, 3.0], [30.0, 38.0, 40.0], [], [0.25] * 3),
        RunCurves("slow", Path("s"), "x", [1, 2, 3], [10.0, 20.0, 30.0], [1.0, 2.0, 3.0], [], [0.25] * 3),
    ]  # fmt: skip
    whole, zoom = draw_bleu_minutes(curves).axes
    x0, x1 = zoom.get_xlim()  # a's 38 at 2.0 min to its last point, 3.0; not the slow run's 30
    assert 1.9 < x0 < 2.0 and 3.0 < x1 < 3.1
    assert whole.get_xlim()[1] > 30.0  # the left panel still shows the slow run whole


def test_bar_chart_says_what_hatching_means_only_when_an_arm_is_unfinished():
    fig = draw_epoch_time_bars(["a", "b"], [10.0, 4.0], [9.0, 3.0], done=[True, False], title="s")
    assert fig.get_suptitle() == "s; hatched: unfinished or cut by a limit"
    hatches = [bar.get_hatch() for bar in fig.axes[0].patches]
    assert hatches == ["", "//"]
    done = draw_epoch_time_bars(["a"], [10.0], [9.0], done=[True], title="s")
    assert done.get_suptitle() == "s"


# ---------------------------------------------------------------------------- the command


def test_the_report_command_with_a_reference_file(study, tmp_path, capsys):
    argv = ["--study", str(study), "--refs", str(tmp_path / "test.en"), "--n-samples", "50"]
    files = report.main(argv)
    out = capsys.readouterr().out
    assert "| tok_lua_s1 | tokens | lua |" in out and "study report written" in out
    record = json.loads(files["json"].read_text())
    assert record["bootstrap"]["references"] == str(tmp_path / "test.en")
    assert _rows(record)["tok_lua_s1"]["p_value"] == 1.0
    assert record["factorial"]["epochs"]["anneal"] == 8.0


def test_the_primary_config_knows_nothing_of_the_study(tmp_path):
    """task=report is the sweep report's only: the study's settings are its command's options."""
    cfg = plain(compose_config(["task=report"], output_dir=str(tmp_path)))
    assert "study" not in cfg["report"] and "refs" not in cfg["report"]
    with pytest.raises(Exception, match="study"):  # the schema refuses the old key
        compose_config(["task=report", "report.study=true"])


def test_the_report_command_names_a_missing_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report.main(["--study", str(tmp_path / "nowhere"), "--refs", str(tmp_path / "r.txt")])
    assert exit_info.value.code == 2
    assert "nowhere: no such study folder; pass --study DIR" in capsys.readouterr().err


def test_references_from_the_baseline_runs_databin(tiny_data, tmp_path):
    """No --refs: the test references of the data-bin of the baseline's own data settings."""
    import yaml
    from tests.training_utils import tiny_config, tiny_databin

    from studies.batching_annealing.references import databin_references

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    saved = {"data": plain(tiny_config(tiny_data, tmp_path / "unused").data)}
    saved["paths"] = {"output_dir": "${hydra:runtime.output_dir}"}  # unresolvable here: replaced
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(saved))
    refs, source = databin_references(
        {"data_root": str(tmp_path), "cache_dir": str(tiny_data["cache"])}
    )(run)
    assert refs == tiny_databin(tiny_data).text("test", "tgt") and len(refs) == 40
    assert source.endswith("(test references)")


def test_run_paths_are_those_run_py_composes(tmp_path, monkeypatch):
    """Without --refs the data-bin is looked up where `python run.py` would look."""
    from studies.batching_annealing.references import run_paths

    monkeypatch.setenv("CONVSEQ_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("CONVSEQ_CACHE", str(tmp_path / "cache"))
    paths = run_paths()
    assert paths == {"data_root": str(tmp_path / "data"), "cache_dir": str(tmp_path / "cache")}
    composed = plain(compose_config([], output_dir=str(tmp_path)))["paths"]
    assert paths == {k: composed[k] for k in paths}
