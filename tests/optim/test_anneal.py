"""Annealing tables: the lr of every epoch for scripted validation losses, and where runs stop.

Expected tables are written out by hand from the rules in reference/fairseq-fconv.md section 4.
"""

from __future__ import annotations

import io

import pytest
import torch

from convseq.errors import CheckpointError
from convseq.optim import Annealer, OptimConfigError
from convseq.optim.config import AnnealConfig


def run(annealer: Annealer, val_losses: list[float], max_epochs: int = 1000):
    """Drive the annealer as a trainer does; return (lr of each trained epoch, stop epoch).

    The stop epoch is the 1-based epoch that was not trained because lr < min_lr (None if the
    run ended with the scripted losses or max_epochs).
    """
    lrs = []
    for epoch in range(1, max_epochs + 1):
        lr = annealer.lr_at_epoch_start(epoch)
        if annealer.should_stop(lr):
            return lrs, epoch
        if epoch > len(val_losses):
            return lrs, None
        lrs.append(lr)
        annealer.step(epoch, val_losses[epoch - 1])
    return lrs, None


def cfg(name: str, **kw) -> AnnealConfig:
    base = {"name": name, "lr_shrink": 0.1, "lr_threshold": 1e-4, "lr_patience": 0}
    base.update({"min_lr": 1e-5, "min_epoch_to_anneal": 0, "force_anneal": None})
    base.update(kw)
    return AnnealConfig(**base)


def approx(values):
    return pytest.approx(values, rel=1e-12)


# ---------------------------------------------------------------------------------------- plateau


def test_plateau_shrinks_on_every_validation_not_better_than_the_best():
    vals = [5.0, 4.0, 4.1, 4.05, 3.9997, 3.5, 3.5, 3.0]
    # e1 5.0 best | e2 4.0 best | e3 4.1 worse | e4 4.05 better than e3 but not than the best |
    # e5 3.9997: improves by less than 4.0 * 1e-4 | e6 3.5 best | e7 3.5 equal | e8 3.0 best
    lrs, stop = run(Annealer(cfg("plateau"), lr=0.25), vals)
    assert lrs == approx([0.25, 0.25, 0.25, 0.025, 0.0025, 2.5e-4, 2.5e-4, 2.5e-5])
    assert stop is None


def test_plateau_threshold_is_relative_to_the_best():
    # best 4.0: better means val < 4.0 * (1 - 1e-4) = 3.9996
    for val, expected in ((3.9995, 0.25), (3.9997, 0.025), (4.0, 0.025)):
        a = Annealer(cfg("plateau"), lr=0.25)
        a.step(1, 4.0)
        assert a.step(2, val) == pytest.approx(expected, rel=1e-12), val
    # With threshold 0, any decrease counts.
    a = Annealer(cfg("plateau", lr_threshold=0.0), lr=0.25)
    a.step(1, 4.0)
    assert a.step(2, 3.9997) == 0.25


def test_plateau_patience_tolerates_bad_validations_then_restarts_counting():
    vals = [3.0, 3.1, 3.2, 3.3, 3.4, 2.0, 2.5, 2.5]
    # patience 1: shrink after the 2nd bad validation in a row (e3), then again after e5;
    # e6 best; e7, e8 bad -> shrink after e8.
    lrs, _ = run(Annealer(cfg("plateau", lr_patience=1), lr=0.25), vals)
    assert lrs == approx([0.25, 0.25, 0.25, 0.025, 0.025, 0.0025, 0.0025, 0.0025])
    a = Annealer(cfg("plateau", lr_patience=1), lr=0.25)
    run(a, vals)
    assert a.lr == pytest.approx(2.5e-4, rel=1e-12)


def test_plateau_stops_after_the_fifth_non_improving_epoch():
    # fairseq-py 2017 with lr 0.25: 0.25 -> ... -> 2.5e-6 after five bad epochs.
    vals = [3.0, 3.1, 3.1, 3.1, 3.1, 3.1, 3.1, 3.1]
    a = Annealer(cfg("plateau"), lr=0.25)
    lrs, stop = run(a, vals)
    assert lrs == approx([0.25, 0.25, 0.025, 0.0025, 2.5e-4, 2.5e-5])
    assert stop == 7
    assert "min_lr" in a.stop_reason and "epoch 6" in a.stop_reason


def test_plateau_without_validation_keeps_the_lr():
    a = Annealer(cfg("plateau"), lr=0.25)
    a.step(1, 3.0)
    assert a.step(2, None) == 0.25
    assert a.last_epoch == 2


# ------------------------------------------------------------------------------------------ force


def test_force_anneal_3_first_annealed_epoch_is_3():
    vals = [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0]  # ignored by the fixed schedule
    lrs, stop = run(Annealer(cfg("force", force_anneal=3), lr=0.25), vals)
    assert lrs == approx([0.25, 0.25, 0.025, 0.0025, 2.5e-4, 2.5e-5])
    assert stop == 7  # 2.5e-6 < 1e-5


def test_force_uses_fairseq_power_expression():
    a = Annealer(cfg("force", force_anneal=3), lr=0.25)
    # Epoch 6 is the 4th shrink; there the power and four multiplications differ in the last bit.
    assert 0.25 * 0.1**4 != 0.25 * 0.1 * 0.1 * 0.1 * 0.1
    assert a.lr_at_epoch_start(6) == 0.25 * 0.1**4
    assert a.step(5, 1.0) == 0.25 * 0.1**4  # the lr for epoch 6
    assert a.lr_at_epoch_start(2) == 0.25


def test_force_anneal_50_recipe_current_and_2018_conventions():
    # fairseq's WMT recipe: fixed, lr 0.5, --force-anneal 50, min_lr 1e-5.
    vals = [1.0] * 60
    lrs, stop = run(Annealer(cfg("force", force_anneal=50), lr=0.5), vals)
    assert lrs[:49] == [0.5] * 49
    assert lrs[49:] == approx([0.05, 0.005, 5e-4, 5e-5])  # epochs 50..53
    assert stop == 54
    # fairseq 2018-v0.9 annealed one epoch later: epochs 51..54 train with 0.05 ... 5e-5, then
    # stop. force_anneal = 51 here reproduces it.
    lrs, stop = run(Annealer(cfg("force", force_anneal=51), lr=0.5), vals)
    assert lrs[:50] == [0.5] * 50
    assert lrs[50:] == approx([0.05, 0.005, 5e-4, 5e-5])  # epochs 51..54
    assert stop == 55


# -------------------------------------------------------------------------------------------- lua


def test_lua_shrinks_every_epoch_after_the_first_non_improvement():
    vals = [5.0, 4.0, 3.5, 3.6, 3.0, 2.0, 1.0, 0.5, 0.4]
    # e4 3.6 >= e3 3.5: shrink, and from then on every epoch however the loss moves.
    a = Annealer(cfg("lua"), lr=0.25)
    lrs, stop = run(a, vals)
    assert lrs == approx([0.25, 0.25, 0.25, 0.25, 0.025, 0.0025, 2.5e-4, 2.5e-5])
    assert stop == 9
    assert a.annealing
    # Pinned float arithmetic: four multiplications by 0.1, neither the Lua toolkit's division
    # by 10 (2.5e-05 exactly) nor the power 0.1 ** 4.
    assert lrs[-1] == 0.25 * 0.1 * 0.1 * 0.1 * 0.1 == 2.5000000000000008e-05


def test_lua_equal_loss_counts_as_no_improvement():
    a = Annealer(cfg("lua"), lr=0.25)
    lrs, _ = run(a, [5.0, 4.0, 4.0])
    assert a.lr == pytest.approx(0.025, rel=1e-12)
    assert lrs == [0.25, 0.25, 0.25]


def test_lua_min_epoch_to_anneal_delays_and_compares_with_the_previous_loss():
    vals = [5.0, 4.0, 4.5, 4.6, 4.4, 4.3, 4.35, 1.0, 1.0]
    # Before epoch 5 nothing shrinks (e3, e4 are worse) but each loss becomes the previous one;
    # e5 4.4 < 4.6 (previous, though worse than the best 4.0): no shrink; e6 4.3 < 4.4;
    # e7 4.35 >= 4.3: shrink, then every epoch.
    lrs, _ = run(Annealer(cfg("lua", min_epoch_to_anneal=5), lr=0.25), vals)
    assert lrs == approx([0.25] * 7 + [0.025, 0.0025])
    # Without the delay, e3 4.5 >= 4.0 starts annealing at once.
    lrs, _ = run(Annealer(cfg("lua"), lr=0.25), vals)
    assert lrs == approx([0.25, 0.25, 0.25, 0.025, 0.0025, 2.5e-4, 2.5e-5])


def test_a_nan_validation_loss_counts_as_no_improvement():
    for name in ("lua", "plateau"):
        a = Annealer(cfg(name), lr=0.25)
        a.step(1, 3.0)
        assert a.step(2, float("nan")) == pytest.approx(0.025, rel=1e-12), name


def test_lua_min_epoch_to_anneal_is_the_first_epoch_that_may_shrink():
    vals = [5.0, 4.0, 4.5, 4.6, 4.7]
    # min 3: e3 (4.5 >= 4.0) shrinks; min 4: e3 only becomes the previous loss, e4 shrinks.
    lrs, _ = run(Annealer(cfg("lua", min_epoch_to_anneal=3), lr=0.25), vals)
    assert lrs == approx([0.25, 0.25, 0.25, 0.025, 0.0025])
    lrs, _ = run(Annealer(cfg("lua", min_epoch_to_anneal=4), lr=0.25), vals)
    assert lrs == approx([0.25, 0.25, 0.25, 0.25, 0.025])


def test_lua_and_plateau_differ_on_a_loss_worse_than_the_best():
    # Past min_epoch_to_anneal the previous loss is 4.5, worse than the best 3.0.
    vals = [3.0, 4.5, 4.0]
    lua = Annealer(cfg("lua", min_epoch_to_anneal=3), lr=0.25)
    plateau = Annealer(cfg("plateau"), lr=0.25)
    run(lua, vals)
    run(plateau, vals)
    assert lua.lr == 0.25  # 4.0 < previous 4.5
    assert plateau.lr == pytest.approx(0.0025, rel=1e-12)  # e2 and e3 not better than 3.0


def test_min_lr_is_strict_and_lr_shrinks_by_multiplication():
    # 1e-3 * 0.1 * 0.1 is exactly 1e-05 in binary floating point (1e-3 * 0.1 ** 2 is not):
    # an lr equal to min_lr still trains; the next one stops.
    assert 1e-3 * 0.1 * 0.1 == 1e-05
    a = Annealer(cfg("lua", min_lr=1e-5), lr=1e-3)
    lrs, stop = run(a, [1.0] * 10)
    assert lrs == [1e-3, 1e-3, 1e-3 * 0.1, 1e-05]
    assert stop == 5
    assert not Annealer(cfg("none", min_lr=1e-4), lr=1e-4).should_stop()


# ------------------------------------------------------------------------------------------- none


def test_none_is_constant_and_never_stops_with_min_lr_zero():
    lrs, stop = run(Annealer(cfg("none", min_lr=0.0), lr=0.001), [3.0, 4.0, 5.0, 6.0])
    assert lrs == [0.001] * 4
    assert stop is None


def test_negative_min_lr_never_stops():
    a = Annealer(cfg("lua", min_lr=-1.0), lr=0.25)
    lrs, stop = run(a, [1.0] * 30)
    assert stop is None and len(lrs) == 30 and lrs[-1] < 1e-20


# ---------------------------------------------------------------------------------- state, config


def _round_trip(state: dict) -> dict:
    stream = io.BytesIO()
    torch.save(state, stream)
    stream.seek(0)
    return torch.load(stream, weights_only=True)


@pytest.mark.parametrize(
    "conf",
    [
        cfg("plateau", lr_patience=1),
        cfg("force", force_anneal=3),
        cfg("lua", min_epoch_to_anneal=2),
    ],
    ids=["plateau", "force", "lua"],
)
def test_state_dict_round_trip_continues_identically(conf):
    vals = [5.0, 4.0, 4.2, 3.9, 3.95, 3.95, 3.0, 3.1]
    straight = Annealer(conf, lr=0.25)
    full, _ = run(straight, vals)

    first = Annealer(conf, lr=0.25)
    for epoch in (1, 2, 3):
        first.lr_at_epoch_start(epoch)
        first.step(epoch, vals[epoch - 1])
    state = _round_trip(first.state_dict())
    assert all(type(v) in (int, float, bool, type(None)) for v in state.values())

    resumed = Annealer(conf, lr=99.0)  # everything must come from the state
    resumed.load_state_dict(state)
    rest = []
    for epoch in range(4, len(vals) + 1):
        lr = resumed.lr_at_epoch_start(epoch)
        if resumed.should_stop(lr):
            break
        rest.append(lr)
        resumed.step(epoch, vals[epoch - 1])
    assert rest == full[3:]
    assert resumed.state_dict() == straight.state_dict()


def test_load_state_dict_refuses_a_foreign_state():
    with pytest.raises(CheckpointError, match="lacks"):
        Annealer(cfg("plateau"), lr=0.25).load_state_dict({"lr": 0.1})


def test_config_errors_name_the_key():
    with pytest.raises(OptimConfigError, match="anneal.name='linear_decay'"):
        Annealer(cfg("linear_decay"), lr=0.25)
    with pytest.raises(OptimConfigError, match="anneal.force_anneal"):
        Annealer(cfg("force"), lr=0.25)
    with pytest.raises(OptimConfigError, match="anneal.lr_shrink"):
        Annealer(cfg("lua", lr_shrink=10), lr=0.25)


def test_composed_configs_build():
    from tests.conftest import compose_config

    expected = {"plateau": 0.25, "force": 0.25, "lua": 0.25, "none": 0.25}
    for name, lr in expected.items():
        c = compose_config([f"anneal={name}"])
        a = Annealer(c.anneal, lr=c.optim.lr)
        assert a.name == name and a.lr_at_epoch_start(1) == lr
    assert Annealer(compose_config(["anneal=force"]).anneal, lr=0.25).force_anneal == 50
