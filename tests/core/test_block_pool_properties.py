"""BlockPool against a model: random allocate / share / free sequences keep every count right.

The model is a plain dict of owned block id -> reference count. After every rule the pool must agree
with it: the same free count, the same ref count per block, no id handed out twice, owned + free ==
total, and a free or share of an id that is not owned must raise and change nothing.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from pdserve.core.block_pool import BlockPool, BlockPoolError


class BlockPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(0)
        self.refs: dict[int, int] = {}  # the model: owned id -> reference count

    @initialize(num_blocks=st.integers(0, 12))
    def make_pool(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks)

    @property
    def model_free(self) -> int:
        total: int = self.pool.num_blocks
        return total - len(self.refs)

    @rule(count=st.integers(0, 14))
    def allocate(self, count: int) -> None:
        assert self.pool.can_allocate(count) == (count <= self.model_free)
        ids = self.pool.allocate(count)
        if count > self.model_free:
            assert ids is None
            return
        assert ids is not None and len(ids) == count
        assert len(set(ids)) == count, f"one allocation handed out an id twice: {ids}"
        for block_id in ids:
            assert 0 <= block_id < self.pool.num_blocks
            assert block_id not in self.refs, f"block {block_id} handed out while owned"
            self.refs[block_id] = 1

    @precondition(lambda self: bool(self.refs))
    @rule(data=st.data())
    def share(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.refs)), max_size=4))
        self.pool.share(ids)
        for block_id in ids:
            self.refs[block_id] += 1

    @precondition(lambda self: bool(self.refs))
    @rule(data=st.data())
    def free_owned(self, data: st.DataObject) -> None:
        """Drops references that are held; the same id may appear as often as it is held."""
        held = [block_id for block_id, count in self.refs.items() for _ in range(count)]
        ids = data.draw(st.lists(st.sampled_from(held), max_size=len(held)))
        ids = _within_counts(ids, self.refs)
        self.pool.free(ids)
        for block_id in ids:
            self.refs[block_id] -= 1
            if self.refs[block_id] == 0:
                del self.refs[block_id]

    @rule(data=st.data())
    def free_or_share_unowned_raises(self, data: st.DataObject) -> None:
        unowned = [i for i in range(self.pool.num_blocks) if i not in self.refs]
        foreign = st.sampled_from([-1, self.pool.num_blocks, self.pool.num_blocks + 7])
        block_id = data.draw(st.sampled_from(unowned) | foreign if unowned else foreign)
        operation = data.draw(st.sampled_from([self.pool.free, self.pool.share]))
        with pytest.raises(BlockPoolError, match=f"block {block_id} is not owned"):
            operation([block_id])

    @invariant()
    def agrees_with_model(self) -> None:
        pool = self.pool
        assert pool.num_free == self.model_free
        assert pool.num_used == len(self.refs)
        assert pool.num_free + pool.num_used == pool.num_blocks
        for block_id in range(pool.num_blocks):
            assert pool.ref_count(block_id) == self.refs.get(block_id, 0)


def _within_counts(ids: list[int], refs: dict[int, int]) -> list[int]:
    """Keeps each id at most as often as it is referenced (a free must not over-release)."""
    left = dict(refs)
    kept = []
    for block_id in ids:
        if left[block_id] > 0:
            left[block_id] -= 1
            kept.append(block_id)
    return kept


BlockPoolMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestBlockPool = BlockPoolMachine.TestCase


def test_double_free_raises_and_keeps_counts() -> None:
    pool = BlockPool(4)
    ids = pool.allocate(2)
    assert ids is not None
    pool.free(ids)
    with pytest.raises(BlockPoolError, match=f"block {ids[0]} is not owned"):
        pool.free([ids[0]])
    assert pool.num_free == 4


def test_free_list_reuses_in_order_and_never_duplicates() -> None:
    pool = BlockPool(3)
    first = pool.allocate(3)
    assert first is not None and pool.allocate(1) is None
    pool.free([first[1]])
    assert pool.allocate(1) == [first[1]]


def test_negative_size_is_rejected_naming_the_field() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(-1)
