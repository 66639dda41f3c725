"""task=compare (paired bootstrap BLEU) and the Multi30k comparison recipe, experiment=multi30k_compare."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from convseq.cli.dispatch import dispatch
from convseq.common.config import plain as to_plain
from convseq.errors import DataError
from convseq.evaluation.bootstrap import hypothesis_file, paired_bootstrap, read_lines
from convseq.optim.anneal import Annealer
from convseq.tasks.compare import run_compare
from convseq.tasks.config import as_config
from tests.conftest import compose_config

# ---------------------------------------------------------------------------- synthetic systems

VOCAB = [f"w{i}" for i in range(300)]


def _references(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(6, 18))) for _ in range(n)]


def _noisy(refs: list[str], rate: float, seed: int) -> list[str]:
    """Each reference word replaced by a random one with probability `rate`."""
    rng = random.Random(seed)
    return [
        " ".join(w if rng.random() >= rate else rng.choice(VOCAB) for w in r.split()) for r in refs
    ]


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_clearly_better_system_is_significant():
    refs = _references()
    baseline, better = _noisy(refs, 0.4, 1), _noisy(refs, 0.1, 2)
    results, signature = paired_bootstrap([("base", baseline), ("better", better)], refs)
    base, other = results
    assert base.p_value is None and not base.significant
    # the BLEU figures are sacreBLEU's corpus BLEU of each system
    assert base.bleu == pytest.approx(BLEU().corpus_score(baseline, [refs]).score)
    assert other.bleu == pytest.approx(BLEU().corpus_score(better, [refs]).score)
    assert other.bleu > base.bleu + 10
    assert other.p_value < 0.05 and other.significant
    for r in results:  # the bootstrap mean sits near the score, inside a positive CI
        assert r.ci > 0 and abs(r.mean - r.bleu) < r.ci
    assert "bs:1000" in signature and "seed:12345" in signature


def test_identical_and_nearly_identical_systems_are_not_significant():
    refs = _references()
    baseline = _noisy(refs, 0.2, 1)
    one_changed = list(baseline)
    one_changed[7] = _noisy(refs, 0.9, 3)[7]
    assert one_changed != baseline
    results, _ = paired_bootstrap(
        [("base", baseline), ("same", list(baseline)), ("one", one_changed)], refs
    )
    _, same, one = results
    assert same.identical and same.p_value == 1.0 and not same.significant
    assert same.bleu == results[0].bleu and same.ci == results[0].ci
    assert not one.identical and one.p_value > 0.05 and not one.significant


def test_the_seed_fixes_the_resamples():
    refs = _references(120)
    systems = [("a", _noisy(refs, 0.3, 1)), ("b", _noisy(refs, 0.25, 2))]
    first, _ = paired_bootstrap(systems, refs, n_samples=200, seed=7)
    again, _ = paired_bootstrap(systems, refs, n_samples=200, seed=7)
    other, sig = paired_bootstrap(systems, refs, n_samples=200, seed=8)
    assert first == again
    assert (first[1].p_value, first[1].ci) != (other[1].p_value, other[1].ci)
    assert "bs:200" in sig and "seed:8" in sig


def test_a_system_with_another_line_count_is_named(tmp_path):
    refs = _references(50)
    good = _write(tmp_path / "a" / "generate-test.txt", _noisy(refs, 0.1, 1))
    short = _write(tmp_path / "b" / "generate-test.txt", _noisy(refs, 0.1, 2)[:-1])
    with pytest.raises(DataError) as e:
        paired_bootstrap(
            [("a", read_lines(good)), ("b", read_lines(short))], refs, paths=[good, short]
        )
    assert str(short) in str(e.value) and "49 hypotheses for 50 reference lines" in str(e.value)
    with pytest.raises(DataError, match="at least two systems"):
        paired_bootstrap([("a", read_lines(good))], refs)


def test_missing_files_and_folders_are_named(tmp_path):
    with pytest.raises(DataError) as e:
        hypothesis_file(tmp_path / "nowhere.txt")
    assert str(tmp_path / "nowhere.txt") in str(e.value)
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(DataError) as e:
        hypothesis_file(run)
    msg = str(e.value)
    assert str(run) in msg and "generate-test.txt" in msg and "task=generate" in msg
    _write(run / "generate-valid.txt", ["x"])
    assert hypothesis_file(run, "valid") == run / "generate-valid.txt"
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8") as e:
        read_lines(bad)
    assert str(bad) in str(e.value)


def test_read_lines_keeps_empty_hypotheses(tmp_path):
    path = tmp_path / "h.txt"
    path.write_text("a b\n\nc\n", encoding="utf-8")
    assert read_lines(path) == ["a b", "", "c"]
    path.write_text("a b\n\nc", encoding="utf-8")  # no newline after the last line
    assert read_lines(path) == ["a b", "", "c"]


def _compare_cfg(tmp_path: Path, runs: list[Path], refs: Path | None) -> dict:
    overrides = ["task=compare", "compare.runs=[" + ",".join(f"'{r}'" for r in runs) + "]"]
    if refs is not None:
        overrides.append(f"compare.refs='{refs}'")
    return to_plain(compose_config(overrides, output_dir=str(tmp_path / "out")))


def test_task_compare_reads_run_folders_and_files(tmp_path, capsys):
    refs = _references(200)
    ref_file = _write(tmp_path / "test.en", refs)
    base = _write(tmp_path / "runs" / "0" / "generate-test.txt", _noisy(refs, 0.4, 1)).parent
    better = _write(tmp_path / "runs" / "1" / "generate-test.txt", _noisy(refs, 0.1, 2)).parent
    loose = _write(tmp_path / "loose.txt", read_lines(base / "generate-test.txt"))
    cfg = _compare_cfg(tmp_path, [base, better, loose], ref_file)
    assert cfg["compare"]["n_samples"] == 1000 and cfg["compare"]["split"] == "test"
    results = dispatch(cfg)
    assert [r.name for r in results] == [str(base), str(better), str(loose)]
    assert results[1].significant and results[2].identical and results[2].p_value == 1.0
    out = capsys.readouterr().out
    assert f"baseline: {base}" in out and "| * |" in out and "identical" in out
    saved = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert saved["references"] == str(ref_file)
    assert [s["significant"] for s in saved["systems"]] == [False, True, False]
    assert saved["systems"][1]["p_value"] == results[1].p_value


def test_task_compare_calls_two_zero_systems_not_significant(tmp_path, capsys):
    refs = _references(100)
    ref_file = _write(tmp_path / "test.en", refs)
    unrelated = [f"z{i} z{i + 1} z{i + 2}" for i in range(100)]  # no reference word
    a = _write(tmp_path / "a.txt", unrelated)
    b = _write(tmp_path / "b.txt", list(reversed(unrelated)))
    results = dispatch(_compare_cfg(tmp_path, [a, b], ref_file))
    assert results[0].bleu == results[1].bleu == 0.0
    assert results[1].p_value == 1.0 and not results[1].significant
    out = capsys.readouterr().out
    assert "| * |" not in out and "same BLEU" in out
    saved = json.loads((tmp_path / "out" / "compare.json").read_text())["systems"][1]
    assert (saved["p_value"], saved["significant"], saved["note"]) == (1.0, False, "same BLEU")


def test_task_compare_names_an_empty_reference_file(tmp_path, capsys):
    a = _write(tmp_path / "a.txt", ["x y"])
    empty = _write(tmp_path / "test.en", [])
    with pytest.raises(SystemExit) as e:
        dispatch(_compare_cfg(tmp_path, [a, a], empty))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{empty}: the reference file is empty" in err


def test_task_compare_bad_input_exits_with_one_line_naming_the_file(tmp_path, capsys):
    refs = _references(20)
    ref_file = _write(tmp_path / "test.en", refs)
    a = _write(tmp_path / "a.txt", refs)
    missing = tmp_path / "b" / "generate-test.txt"
    with pytest.raises(SystemExit) as e:
        dispatch(_compare_cfg(tmp_path, [a, missing], ref_file))
    assert e.value.code == 2
    assert str(missing) in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dispatch(_compare_cfg(tmp_path, [a], ref_file))
    assert "compare.runs=[BASELINE,OTHER" in capsys.readouterr().err


# ---------------------------------------------------------------------------- a real run folder


def test_training_keeps_its_test_translations_for_compare(tiny_data, tmp_path, capsys):
    from tests.training_utils import tiny_databin, train_one_tiny_epoch

    run = train_one_tiny_epoch(tiny_data, tmp_path / "run")
    hyps = read_lines(run / "generate-test.txt")
    refs = tiny_databin(tiny_data).text("test", "tgt")
    assert len(hyps) == len(refs) == 40
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test_hypotheses"] == str(run / "generate-test.txt")
    # the file holds exactly the translations that test BLEU scored
    assert BLEU().corpus_score(hyps, [refs]).score == pytest.approx(summary["test"]["test/bleu"])
    # references from the data-bin of the composed `data` (no compare.refs)
    overrides = [
        "task=compare",
        "data=toy",
        "data.generator=null",
        f"data.dir={tiny_data['corpus']}",
        f"paths.cache_dir={tiny_data['cache']}",
        f"compare.runs=['{run}','{run}']",
    ]
    results = run_compare(as_config(compose_config(overrides, output_dir=str(tmp_path / "out"))))
    assert results[0].bleu == pytest.approx(summary["test"]["test/bleu"])
    assert results[1].identical and results[1].p_value == 1.0
    assert (
        "(test references)"
        in json.loads((tmp_path / "out" / "compare.json").read_text())["references"]
    )


# ---------------------------------------------------------------------------- the recipe

SWEEP = [
    (batching, anneal, momentum)
    for batching in ("tokens", "sentences")
    for anneal in ("plateau", "force", "lua")
    for momentum in (0.99, 0.0)
]


@pytest.mark.parametrize(("batching", "anneal", "momentum"), SWEEP)
def test_the_comparison_recipe_composes_every_sweep_job(batching, anneal, momentum, tmp_path):
    overrides = [
        "experiment=multi30k_compare",
        f"batching={batching}",
        f"anneal={anneal}",
        f"optim.momentum={momentum}",
        "seed=2",
    ]
    cfg = to_plain(compose_config(overrides, output_dir=str(tmp_path)))
    # the fixed protocol
    assert cfg["trainer"]["max_epochs"] == 12
    assert cfg["trainer"]["max_time"] == "00:00:15:00"
    assert cfg["bleu_every_n_epochs"] == 1 and cfg["report"]["test"] is True
    assert cfg["gen"]["test_bleu"] is True and cfg["gen"]["beam"] == 5
    assert cfg["checkpoint"]["monitor"] == "valid/bleu" and cfg["checkpoint"]["mode"] == "max"
    assert cfg["seed"] == 2 and cfg["optim"]["momentum"] == momentum
    assert cfg["optim"]["name"] == "nag" and cfg["optim"]["lr"] == 0.25
    # the small model
    model = cfg["model"]
    assert model["encoder_embed_dim"] == model["decoder_embed_dim"] == 128
    assert model["encoder_layers"] == [{"layer": [128, 3], "repeat": 3}]
    assert model["decoder_layers"] == [{"layer": [128, 3], "repeat": 2}]
    # the data of experiment=multi30k_fconv, unchanged
    fconv = to_plain(compose_config(["experiment=multi30k_fconv"], output_dir=str(tmp_path)))
    assert cfg["data"] == fconv["data"]
    assert cfg["data"]["subword"]["vocab_size"] == 8000 and cfg["data"]["vocab"]["joined"] is False
    # the batching under test, at the matched mean batch size
    b = cfg["batching"]
    assert b["name"] == batching and b["match_max_tokens"] is None
    if batching == "tokens":
        assert (b["max_tokens"], b["max_sentences"], b["required_batch_size_multiple"]) == (
            4000,
            None,
            8,
        )
    else:
        assert (b["max_tokens"], b["max_sentences"], b["required_batch_size_multiple"]) == (
            None,
            217,
            1,
        )
    assert cfg["anneal"]["name"] == anneal and cfg["anneal"]["min_lr"] == 1e-5


def test_force_annealing_ends_by_its_own_rule_at_the_epoch_budget(tmp_path):
    cfg = as_config(
        compose_config(["experiment=multi30k_compare", "anneal=force"], output_dir=str(tmp_path))
    )
    annealer = Annealer(cfg.anneal, lr=cfg.optim.lr)
    lrs = []
    for epoch in range(1, 20):
        lr = annealer.lr_at_epoch_start(epoch)
        if annealer.should_stop(lr):
            break
        lrs.append(lr)
        annealer.step(epoch, 1.0)
    assert len(lrs) == cfg.trainer.max_epochs == 12  # lr stays >= min_lr for 12 epochs
    assert lrs[:8] == [0.25] * 8 and lrs[8] == pytest.approx(0.025)


def test_the_batching_specialisation_applies_only_to_its_recipe(tmp_path):
    plain = to_plain(compose_config(["batching=sentences"], output_dir=str(tmp_path)))
    assert plain["batching"]["max_sentences"] == 64  # conf/batching/sentences.yaml as it is
    fconv = ["experiment=multi30k_fconv", "batching=sentences"]
    assert (
        to_plain(compose_config(fconv, output_dir=str(tmp_path)))["batching"]["max_sentences"] == 64
    )


@pytest.mark.slow
def test_sentences_jobs_get_the_mean_batch_size_of_the_token_jobs(shared_data, cache_dir, tmp_path):
    """Counts both jobs' training batches on the real corpus (builds its data-bin: about 10 s)."""
    from convseq.data.databin import DataBin
    from convseq.data.preprocess import prepare_databin
    from convseq.training.build import build_datamodule, build_module

    sizes = {}
    for batching in ("tokens", "sentences"):
        overrides = ["experiment=multi30k_compare", f"batching={batching}"]
        cfg = as_config(compose_config(overrides, output_dir=str(tmp_path)))
        cfg = dataclasses.replace(
            cfg,
            paths=dataclasses.replace(cfg.paths, data_root=str(shared_data)),
            data=dataclasses.replace(cfg.data, dir=str(shared_data / "multi30k")),
        )
        databin = DataBin(prepare_databin(cfg.data, str(cache_dir), progress=False))
        dm = build_datamodule(cfg, build_module(cfg, databin))
        dm.setup("fit")
        sampler = dm.batch_sampler("train")
        sampler.set_epoch(0)
        sizes[batching] = np.array([len(batch) for batch in sampler])
    tokens, sentences = sizes["tokens"], sizes["sentences"]
    assert tokens.sum() == sentences.sum() == 28_998
    assert len(tokens) == len(sentences) == 134  # the same updates per epoch ...
    assert tokens.mean() == pytest.approx(sentences.mean())  # ... so the same mean batch size
    assert sentences.max() == 217 and tokens.max() > 217  # fixed size vs the token budget's range
