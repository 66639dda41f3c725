"""`block_reorder`: the promise a caller makes about how a reorder moves rows."""

from __future__ import annotations

import pytest

from convseq.modules.reorder import BlockReorder, block_reorder, current_block_reorder


def test_the_promise_holds_inside_its_block_only_and_nests():
    assert current_block_reorder() is None
    with block_reorder(4) as outer:
        assert current_block_reorder() == outer == BlockReorder(4, None)
        with block_reorder(4, [0, 2]):
            assert current_block_reorder() == BlockReorder(4, (0, 2))
        assert current_block_reorder() is outer
    assert current_block_reorder() is None


def test_the_promise_ends_with_an_exception_too():
    with pytest.raises(KeyError), block_reorder(2, [1]):
        raise KeyError("x")
    assert current_block_reorder() is None


def test_a_block_holds_at_least_one_row():
    with pytest.raises(ValueError, match="at least one row"), block_reorder(0):
        pass
