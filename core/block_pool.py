"""A pool of fixed-size KV blocks with reference counts (the pool never lies).

Every block is either free (ref count 0, on the free list) or owned (ref count >= 1). Ref counts
above one are for sharing a block between requests (prefix sharing); freeing decrements and a block
returns to the free list only at zero.
"""

from __future__ import annotations

from collections import deque


class BlockPoolError(RuntimeError):
    """A caller broke the pool's rules (double free, foreign id): always a bug, never user input."""


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks: must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def can_allocate(self, count: int) -> bool:
        return count <= len(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """`count` fresh blocks, or None (nothing taken) when fewer are free."""
        if count < 0:
            raise ValueError(f"count: must be >= 0, got {count}")
        if count > len(self._free):
            return None
        ids = [self._free.popleft() for _ in range(count)]
        for block_id in ids:
            self._ref_counts[block_id] = 1
        return ids

    def share(self, ids: list[int]) -> None:
        """Takes one more reference on blocks that are already owned (all or nothing)."""
        for block_id in ids:
            self._check_references(block_id, 1)
        for block_id in ids:
            self._ref_counts[block_id] += 1

    def free(self, ids: list[int]) -> None:
        """Drops one reference per id; blocks whose count reaches zero become free (all or
        nothing: a bad id changes no count)."""
        references: dict[int, int] = {}
        for block_id in ids:
            references[block_id] = references.get(block_id, 0) + 1
        for block_id, count in references.items():
            self._check_references(block_id, count)
        for block_id in ids:
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free.append(block_id)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def _check_references(self, block_id: int, count: int) -> None:
        """Raises unless `block_id` is a block of this pool holding at least `count` references."""
        if not 0 <= block_id < self.num_blocks or self._ref_counts[block_id] < count:
            raise BlockPoolError(f"block {block_id} is not owned (double free or foreign id)")
