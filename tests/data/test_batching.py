"""Token-budget batching and the DDP-sharded batch sampler (pure numpy: no data-bin needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from convseq.data.batching import (
    TokenBatchSampler,
    decode_index,
    dummy_index,
    match_max_sentences,
    source_batches,
)
from convseq.data.packing import batch_by_size, filter_by_size, ordered_indices
from convseq.errors import DataError


def random_sizes(n: int = 700, seed: int = 0, high: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(seed)
    src = rng.randint(1, high, size=n)
    tgt = np.clip(src + rng.randint(-5, 6, size=n), 1, None)
    return src, tgt


def as_lists(batches: list[np.ndarray]) -> list[list[int]]:
    return [b.tolist() for b in batches]


# -- batch_by_size: literal cases worked out by hand ------------------------------------------------
def test_batch_by_size_greedy_token_budget():
    # cost = size x longest: [2,2,3] costs 9; adding a 3 would cost 12 > 10, and so on.
    lens = np.array([2, 2, 3, 3, 5, 5, 5, 9])
    got = batch_by_size(np.arange(8), lens, max_tokens=10)
    assert as_lists(got) == [[0, 1, 2], [3, 4], [5, 6], [7]]


def test_batch_by_size_keeps_multiples_of_required_multiple():
    # max_sentences 5 with multiple 2: full batches are cut back to 4, the rest carried over.
    got = batch_by_size(
        np.arange(11), np.ones(11, int), max_sentences=5, required_batch_size_multiple=2
    )
    assert as_lists(got) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10]]


def test_batch_by_size_cuts_an_overflowing_tail():
    # Multiple 4: [0..3] is committed, [4, 5] is the tail; the 6-token pair makes both the batch
    # (7 x 6) and the tail (3 x 6) exceed 12, so the tail is cut before it. The 2019 algorithm
    # would have emitted [4, 5, 6] at cost 18 > 12.
    lens = np.array([1, 1, 1, 1, 1, 1, 6])
    got = batch_by_size(np.arange(7), lens, max_tokens=12, required_batch_size_multiple=4)
    assert as_lists(got) == [[0, 1, 2, 3], [4, 5], [6]]


def test_batch_by_size_follows_the_given_order_and_ids():
    ids = np.array([40, 10, 30, 20])
    got = batch_by_size(ids, np.array([4, 4, 4, 4]), max_tokens=8)
    assert as_lists(got) == [[40, 10], [30, 20]]


def test_batch_by_size_refuses_a_pair_longer_than_the_budget():
    with pytest.raises(DataError, match=r"batching.max_tokens=10 .* longest pair kept \(11 tokens"):
        batch_by_size(np.arange(3), np.array([3, 11, 2]), max_tokens=10)


# -- ordering and filtering -------------------------------------------------------------------------
def test_ordered_indices_sorts_by_source_then_target_and_shuffles_ties():
    src = np.array([3, 1, 3, 2, 1, 3, 3, 3])
    tgt = np.array([5, 2, 4, 9, 2, 4, 4, 4])
    order = ordered_indices(src, tgt, seed=None)
    assert order.tolist() == [1, 4, 3, 2, 5, 6, 7, 0]  # stable within ties without a seed
    keys = [(src[i], tgt[i]) for i in ordered_indices(src, tgt, seed=5)]
    assert keys == sorted(keys)
    tie_orders = {
        tuple(i for i in ordered_indices(src, tgt, seed=s) if (src[i], tgt[i]) == (3, 4))
        for s in range(10)
    }
    assert len(tie_orders) > 1  # the seeded permutation decides the order within ties


def test_snake_order_alternates_the_target_direction():
    src = np.array([1, 1, 2, 2, 3, 3, 5, 5])
    tgt = np.array([2, 1, 1, 2, 5, 3, 4, 6])
    assert ordered_indices(src, tgt).tolist() == [1, 0, 2, 3, 5, 4, 6, 7]
    # ranks of the distinct source lengths 1, 2, 3, 5: targets up, down, up, down
    assert ordered_indices(src, tgt, order="snake").tolist() == [1, 0, 3, 2, 5, 4, 7, 6]
    with pytest.raises(ValueError, match="order must be one of"):
        ordered_indices(src, tgt, order="zigzag")


def test_ordered_indices_matches_fairseqs_numpy_seed_recipe():
    # fairseq: with numpy_seed(s): np.random.permutation(N), then mergesort by tgt, then by src.
    src, tgt = random_sizes(50, seed=3, high=6)
    np.random.seed(11)
    idx = np.random.permutation(len(src))
    idx = idx[np.argsort(tgt[idx], kind="mergesort")]
    idx = idx[np.argsort(src[idx], kind="mergesort")]
    assert ordered_indices(src, tgt, seed=11).tolist() == idx.tolist()


def test_filter_by_size_drops_pairs_over_either_limit():
    src = np.array([5, 9, 3, 4])
    tgt = np.array([5, 2, 8, 4])
    kept, dropped = filter_by_size(np.arange(4), src, tgt, (6, 7))
    assert kept.tolist() == [0, 3] and dropped.tolist() == [1, 2]


def test_dummy_index_round_trip():
    assert [decode_index(dummy_index(i)) for i in (0, 7)] == [(0, True), (7, True)]
    assert decode_index(7) == (7, False)


# -- the sampler ------------------------------------------------------------------------------------
CONFIGS = [
    {"max_tokens": 300, "required_batch_size_multiple": 8},
    {"max_tokens": 300, "required_batch_size_multiple": 8, "order": "snake"},
    {"max_tokens": 257, "max_sentences": 6, "required_batch_size_multiple": 1},
    {"max_sentences": 16, "required_batch_size_multiple": 1},
]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("cfg", CONFIGS, ids=["tokens", "snake", "tokens+sentences", "sentences"])
def test_each_kept_index_once_per_epoch_and_on_one_rank(world, cfg):
    src, tgt = random_sizes()
    limits = (50, 52)
    samplers = [
        TokenBatchSampler(src, tgt, max_positions=limits, rank=r, world_size=world, seed=3, **cfg)
        for r in range(world)
    ]
    expect_kept = sorted(i for i in range(len(src)) if src[i] <= 50 and tgt[i] <= 52)
    for epoch in (0, 1):
        real_owner: dict[int, int] = {}
        lengths = set()
        n_dummy = 0
        for r, s in enumerate(samplers):
            s.set_epoch(epoch)
            batches = list(s)
            lengths.add(len(batches))
            assert len(batches) == len(s)
            for batch in batches:
                decoded = [decode_index(i) for i in batch]
                flags = {d for _, d in decoded}
                assert len(flags) == 1  # a batch is wholly real or wholly dummy
                if flags == {True}:
                    n_dummy += 1
                    continue
                for i, _ in decoded:
                    assert i not in real_owner, f"index {i} on ranks {real_owner[i]} and {r}"
                    real_owner[i] = r
            for batch in batches:
                ids = [decode_index(i)[0] for i in batch]
                longest = max(max(src[i], tgt[i]) for i in ids)
                if cfg.get("max_tokens"):
                    assert len(ids) * longest <= cfg["max_tokens"]
                if cfg.get("max_sentences"):
                    assert len(ids) <= cfg["max_sentences"]
        assert sorted(real_owner) == expect_kept
        assert len(lengths) == 1  # equal batch counts on every rank
        nb = len(samplers[0].batches)
        assert lengths == {math.ceil(nb / world)}
        assert n_dummy == math.ceil(nb / world) * world - nb


def test_dummy_batches_repeat_real_sentences_of_the_epoch():
    src, tgt = random_sizes(200)
    s = TokenBatchSampler(src, tgt, max_tokens=400, rank=2, world_size=3)
    nb = len(s.batches)
    assert nb % 3 != 0 and nb % 3 <= 2  # this rank comes up short
    batches = list(s)
    dummies = [b for b in batches if b[0] < 0]
    assert len(dummies) == 1
    real_first = batches[0]
    assert [decode_index(i)[0] for i in dummies[0]] == real_first


def test_same_seed_and_epoch_same_order_next_epoch_different():
    src, tgt = random_sizes()
    a = TokenBatchSampler(src, tgt, max_tokens=300, seed=7)
    b = TokenBatchSampler(src, tgt, max_tokens=300, seed=7)
    c = TokenBatchSampler(src, tgt, max_tokens=300, seed=8)
    assert list(a) == list(b)
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(c) != list(b)
    # the batches themselves are frozen: only their order changes between epochs
    a.set_epoch(2)
    assert sorted(map(tuple, a)) == sorted(tuple(x.tolist()) for x in a.batches)


def test_epoch_shuffle_is_fairseqs_seed_plus_one_based_epoch():
    src, tgt = random_sizes(300)
    s = TokenBatchSampler(src, tgt, max_tokens=300, seed=4)
    s.set_epoch(2)  # fairseq's epoch 3: np.random.seed(4 + 3); np.random.shuffle(batches)
    frozen = [b.tolist() for b in s.batches]
    np.random.seed(7)
    np.random.shuffle(frozen)
    assert list(s) == frozen


def test_valid_order_is_sorted_and_never_shuffled():
    src, tgt = random_sizes(300)
    s = TokenBatchSampler(src, tgt, max_tokens=300, shuffle=False)
    first = list(s)
    s.set_epoch(5)
    assert list(s) == first
    flat = [i for b in first for i in b]
    assert flat == ordered_indices(src, tgt, seed=None).tolist()


def test_over_long_pairs_filtered_and_counted():
    src = np.array([3, 12, 4, 5, 11, 2])
    tgt = np.array([3, 4, 13, 5, 2, 2])
    s = TokenBatchSampler(src, tgt, max_tokens=100, max_positions=(10, 12))
    assert s.num_filtered == 3
    assert s.filtered_indices.tolist() == [1, 2, 4]
    assert sorted(i for b in s for i in b) == [0, 3, 5]


def test_over_long_eval_pairs_are_refused_unless_skipped():
    src = np.array([3, 12, 4])
    tgt = np.array([3, 4, 4])
    with pytest.raises(DataError, match=r"valid: 1 pair\(s\) are longer than max_positions"):
        TokenBatchSampler(
            src,
            tgt,
            max_tokens=100,
            max_positions=(10, 10),
            overlong="error",
            name="valid",
            shuffle=False,
        )


def test_max_tokens_below_longest_kept_pair_is_an_error_not_an_empty_epoch():
    src = np.array([3, 40, 8])
    tgt = np.array([3, 2, 9])
    with pytest.raises(DataError, match=r"train: batching.max_tokens=8 .* \(9 tokens"):
        TokenBatchSampler(src, tgt, max_tokens=8, max_positions=(30, 30))
    # the 40-token pair is filtered by max_positions first, so 9 is the longest that counts
    s = TokenBatchSampler(src, tgt, max_tokens=9, max_positions=(30, 30))
    assert s.num_filtered == 1 and len(s) == 2


def test_nothing_left_after_filtering_is_an_error():
    with pytest.raises(DataError, match="no pair is within max_positions"):
        TokenBatchSampler([20, 30], [5, 5], max_tokens=100, max_positions=(10, 10))


def test_no_limit_at_all_is_refused():
    with pytest.raises(DataError, match="max_tokens or batching.max_sentences"):
        TokenBatchSampler([2, 3], [2, 3])


# -- resuming ---------------------------------------------------------------------------------------
def test_mid_epoch_state_resumes_at_the_next_batch():
    src, tgt = random_sizes()
    kw = {"max_tokens": 300, "seed": 2, "rank": 1, "world_size": 2}
    s = TokenBatchSampler(src, tgt, **kw)
    s.set_epoch(3)
    full = list(s)
    for _ in range(5):  # train on five batches
        s.advance()
    state = s.state_dict()
    assert state["epoch"] == 3 and state["offset"] == 5

    fresh = TokenBatchSampler(src, tgt, **kw)
    fresh.load_state_dict(state)
    assert fresh.epoch == 3
    assert list(fresh) == full[5:]
    fresh.set_epoch(4)  # the next epoch starts from its first batch
    assert len(list(fresh)) == len(fresh)


def test_state_after_a_finished_epoch_resumes_at_the_next_epoch():
    src, tgt = random_sizes(200)
    s = TokenBatchSampler(src, tgt, max_tokens=300)
    s.advance(len(s))
    fresh = TokenBatchSampler(src, tgt, max_tokens=300)
    fresh.load_state_dict(s.state_dict())
    assert (fresh.epoch, fresh.offset) == (1, 0)
    fresh2 = TokenBatchSampler(src, tgt, max_tokens=300)
    fresh2.set_epoch(1)
    assert list(fresh) == list(fresh2)


def test_state_from_different_batching_restarts_the_epoch_with_a_warning():
    src, tgt = random_sizes(200)
    s = TokenBatchSampler(src, tgt, max_tokens=300)
    s.advance(4)
    other = TokenBatchSampler(src, tgt, max_tokens=500)
    with pytest.warns(UserWarning, match="batches changed"):
        other.load_state_dict(s.state_dict())
    assert other.offset == 0 and len(list(other)) == len(other)


# -- matching fixed-sentence batches to a token budget ----------------------------------------------
def test_match_max_sentences_literal():
    # 50 pairs of length 5 then 50 of length 20, budget 100: batches of 20, 20, 10 short pairs,
    # then 10 batches of 5 long ones -> B = 13, so max_sentences = ceil(100 / 13) = 8.
    sizes = np.array([5] * 50 + [20] * 50)
    assert match_max_sentences(sizes, sizes, 100) == 8


def test_matched_fixed_sentence_batches_have_the_same_mean_size():
    src, tgt = random_sizes(2000, seed=5)
    tok = TokenBatchSampler(src, tgt, max_tokens=600, seed=1)
    ms = match_max_sentences(src, tgt, 600, seed=1)
    sent = TokenBatchSampler(src, tgt, max_sentences=ms, seed=1)
    assert all(len(b) == ms for b in sent.batches[:-1])
    mean_tok = tok.num_kept / len(tok.batches)
    mean_sent = sent.num_kept / len(sent.batches)
    assert len(sent.batches) <= len(tok.batches)
    assert abs(mean_sent - mean_tok) / mean_tok < 0.05


def test_source_batches_are_the_unshuffled_sampler_over_sources_alone():
    src, _ = random_sizes(300)
    batches = source_batches(src, 200, 16, 64, "input")
    sampler = TokenBatchSampler(
        src, np.zeros_like(src), max_tokens=200, max_sentences=16, shuffle=False,
        max_positions=(64, 1 << 30), overlong="error", name="input",
    )  # fmt: skip
    assert batches == list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(300))
    assert all(len(b) <= 16 and len(b) * max(src[b]) <= 200 for b in batches)
    with pytest.raises(DataError, match="input"):
        source_batches(src, 200, None, 10, "input")  # longer than the positions
    with pytest.raises(DataError):
        source_batches(src, None, None, 64, "input")
