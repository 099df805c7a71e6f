"""A pool of fixed-size KV blocks with reference counts and a prefix cache (the pool never lies).

Every block is free (ref count 0) or owned (ref count >= 1); ref counts above one are blocks shared
between requests. With caching on, a full block whose KV has been computed is registered under its
hash (`chain_hashes`: its tokens chained with its parent's hash, so equal hashes mean equal
prefixes). When its last owner frees it, it stays cached with ref count 0: it counts as free and a
later request with the same prefix can take it back (`take_cached`) instead of computing it again.
`allocate` hands out never-cached free blocks first and evicts cached ones least recently freed
first, so the cache costs no capacity: it only keeps what nobody has needed yet. An evicted
block's content may live on below the pool (`on_evict`, core/kv/offload.py): the pool tells it
which block and hash it is evicting before it hands the block out.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

BlockHash = bytes


class BlockPoolError(RuntimeError):
    """A caller broke the pool's rules (double free, foreign id): always a bug, never user input."""


def chain_hashes(
    root: BlockHash, token_ids: Sequence[int], block_size: int, known: list[BlockHash]
) -> None:
    """Appends to `known` the hashes of the full blocks of `token_ids` it lacks.

    `root` stands for the model and KV layout (see `cache_root`), so blocks of different models
    or layouts never match. BLAKE2b is stable across processes, which the tiers rely on when they
    compare hashes with each other.
    """
    for index in range(len(known), len(token_ids) // block_size):
        parent = known[index - 1] if index else root
        tokens = array("q", token_ids[index * block_size : (index + 1) * block_size])
        known.append(hashlib.blake2b(parent + tokens.tobytes(), digest_size=16).digest())


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens (the last one possibly partly filled)."""
    return -(-num_tokens // block_size)


def cache_root(identity: str) -> BlockHash:
    """The parent hash of every first block, for one model and KV layout."""
    return hashlib.blake2b(identity.encode(), digest_size=16).digest()


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = False) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks: must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # free and holding no cached prefix
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self._hash_of: dict[int, BlockHash] = {}
        self._block_of: dict[BlockHash, int] = {}
        self.num_evictions = 0
        # Called with (block id, hash) as a cached block is evicted, its content still intact.
        self.on_evict: Callable[[int, BlockHash], None] | None = None

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._free_cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a registered prefix, owned or free."""
        return len(self._block_of)

    def can_allocate(self, count: int) -> bool:
        return count <= self.num_free

    def allocate(self, count: int) -> list[int] | None:
        """`count` blocks, or None (nothing taken) when fewer are free; evicts cached blocks,
        least recently freed first, only when no never-cached block is left."""
        if count < 0:
            raise ValueError(f"count: must be >= 0, got {count}")
        if count > self.num_free:
            return None
        ids = [self._take_free() for _ in range(count)]
        for block_id in ids:
            self._ref_counts[block_id] = 1
        return ids

    def _take_free(self) -> int:
        if self._free:
            return self._free.popleft()
        block_id, _ = self._free_cached.popitem(last=False)
        block_hash = self._hash_of.pop(block_id)
        del self._block_of[block_hash]
        self.num_evictions += 1
        if self.on_evict is not None:
            self.on_evict(block_id, block_hash)
        return block_id

    def share(self, ids: list[int]) -> None:
        """Takes one more reference on blocks that are already owned (all or nothing)."""
        for block_id in ids:
            self._check_references(block_id, 1)
        for block_id in ids:
            self._ref_counts[block_id] += 1

    def cached_prefix(self, hashes: Sequence[BlockHash]) -> list[int]:
        """The blocks holding the longest cached prefix of `hashes` (no reference taken)."""
        ids: list[int] = []
        for block_hash in hashes:
            block_id = self.cached_block(block_hash)
            if block_id is None:
                break
            ids.append(block_id)
        return ids

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """The block holding the prefix `block_hash`, if one does (no reference taken)."""
        return self._block_of.get(block_hash)

    def take_cached(self, ids: list[int]) -> None:
        """Takes one reference on each cached block, owned or free (all or nothing)."""
        for block_id in ids:
            if block_id not in self._hash_of:
                raise BlockPoolError(f"block {block_id} holds no cached prefix")
        for block_id in ids:
            self._free_cached.pop(block_id, None)
            self._ref_counts[block_id] += 1

    def register(self, block_id: int, block_hash: BlockHash) -> None:
        """Records that owned, full `block_id` holds the prefix `block_hash`. A no-op when caching
        is off, the block is registered already, or another block holds that prefix."""
        self._check_references(block_id, 1)
        fresh = block_id not in self._hash_of and block_hash not in self._block_of
        if self.enable_caching and fresh:
            self._hash_of[block_id] = block_hash
            self._block_of[block_hash] = block_id

    def free(self, ids: list[int]) -> None:
        """Drops one reference per id; blocks whose count reaches zero become free, cached ones
        at the most recently used end (all or nothing: a bad id changes no count)."""
        references: dict[int, int] = {}
        for block_id in ids:
            references[block_id] = references.get(block_id, 0) + 1
        for block_id, count in references.items():
            self._check_references(block_id, count)
        for block_id in ids:
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                if block_id in self._hash_of:
                    self._free_cached[block_id] = None
                else:
                    self._free.append(block_id)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def _check_references(self, block_id: int, count: int) -> None:
        """Raises unless `block_id` is a block of this pool holding at least `count` references."""
        if not 0 <= block_id < self.num_blocks or self._ref_counts[block_id] < count:
            raise BlockPoolError(f"block {block_id} is not owned (double free or foreign id)")
