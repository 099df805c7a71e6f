"""BlockPool against a model: random allocate / share / free / cache steps keep every count right.

The model is a plain dict of owned block id -> reference count, plus the prefix cache: which block
holds which hash and the order cached blocks were freed in. After every rule the pool must agree
with it: the same free count, the same ref count per block, no id handed out twice (a cached block
is never handed out while referenced), owned + free == total, cached blocks evicted only when no
never-cached block is free and least recently freed first, and a free or share of an id that is not
owned must raise and change nothing.
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

from pdserve.core.kv.block_pool import BlockPool, BlockPoolError

HASHES = st.sampled_from([b"a", b"b", b"c", b"d", b"e"])  # few, so that prefixes collide


class BlockPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(0)
        self.refs: dict[int, int] = {}  # the model: owned id -> reference count
        self.hash_of: dict[int, bytes] = {}  # cached block -> its hash
        self.lru: list[int] = []  # cached blocks with no reference, least recently freed first
        self.evictions = 0

    @initialize(num_blocks=st.integers(0, 12), caching=st.booleans())
    def make_pool(self, num_blocks: int, caching: bool) -> None:
        self.pool = BlockPool(num_blocks, enable_caching=caching)

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
        num_evicted = max(0, count - (self.model_free - len(self.lru)))
        assert {i for i in ids if i in self.hash_of} == set(self.lru[:num_evicted])
        for block_id in self.lru[:num_evicted]:
            del self.hash_of[block_id]
        self.lru = self.lru[num_evicted:]
        self.evictions += num_evicted
        for block_id in ids:
            assert 0 <= block_id < self.pool.num_blocks
            assert block_id not in self.refs, f"block {block_id} handed out while owned"
            self.refs[block_id] = 1

    @precondition(lambda self: bool(self.refs))
    @rule(data=st.data(), block_hash=HASHES)
    def register(self, data: st.DataObject, block_hash: bytes) -> None:
        block_id = data.draw(st.sampled_from(sorted(self.refs)))
        self.pool.register(block_id, block_hash)
        taken = block_hash in self.hash_of.values()
        if self.pool.enable_caching and block_id not in self.hash_of and not taken:
            self.hash_of[block_id] = block_hash

    @rule(hashes=st.lists(HASHES))
    def take_cached_prefix(self, hashes: list[bytes]) -> None:
        ids = self.pool.cached_prefix(hashes)
        block_of = {block_hash: block_id for block_id, block_hash in self.hash_of.items()}
        expected = []
        for block_hash in hashes:
            if block_hash not in block_of:
                break
            expected.append(block_of[block_hash])
        assert ids == expected
        self.pool.take_cached(ids)
        for block_id in ids:
            if block_id in self.lru:
                self.lru.remove(block_id)
            self.refs[block_id] = self.refs.get(block_id, 0) + 1

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
                if block_id in self.hash_of:
                    self.lru.append(block_id)

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
        assert pool.num_cached_blocks == len(self.hash_of)
        assert pool.num_evictions == self.evictions


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


def test_take_cached_refuses_a_block_without_a_prefix() -> None:
    pool = BlockPool(2, enable_caching=True)
    ids = pool.allocate(2)
    assert ids is not None
    pool.register(ids[0], b"a")
    with pytest.raises(BlockPoolError, match=f"block {ids[1]} holds no cached prefix"):
        pool.take_cached([ids[0], ids[1]])
    assert pool.ref_count(ids[0]) == 1  # all or nothing


def test_negative_size_is_rejected_naming_the_field() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(-1)
