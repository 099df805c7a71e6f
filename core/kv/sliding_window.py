"""Sliding-window attention's paging rule: which leading blocks of a sequence no query will read.

With window W the query at position p sees the keys at p - W < k <= p (the Hugging Face / Mistral
convention the kernels use). A sequence with n computed tokens asks its next query at position n
and every later one further right, so no key before position n - W + 1 is ever read again: the
blocks wholly before it can go back to the pool. Chunked prefill keeps to the same rule, since a
chunk's first query is its leftmost one, and so does speculative decoding, since the verified
count (what `n` is after a roll-back) never runs ahead of the tokens whose KV is kept.

A block table keeps its freed leading slots as `NULL_BLOCK` (vLLM v1's null block), so block index
= position // block_size holds for every slot still in use and the tables of a forked or swapped
sequence line up with its tokens. No pool ever sees a `NULL_BLOCK` (`live_blocks` filters them),
and the kernels never read one: they start at the window (`readable_table` only gives the tensor a
valid id to hold in the slots before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pdserve.core.kv.block_pool import blocks_for

NULL_BLOCK: Final = -1  # a table slot whose block slid out of the window and went back to the pool
_READABLE_FILLER: Final = (
    0  # any real block id: the kernels mask (and skip) slots before the window
)


def first_visible_position(num_computed: int, window: int | None) -> int:
    """The first position a query at `num_computed` or later can see (0 without a window)."""
    return 0 if window is None else max(num_computed - window + 1, 0)


def first_live_block(num_computed: int, window: int | None, block_size: int) -> int:
    """Index of the first block a sequence with `num_computed` computed tokens still needs."""
    return first_visible_position(num_computed, window) // block_size


def max_live_blocks(window: int, block_size: int, num_new: int = 1) -> int:
    """Most blocks a sliding-window sequence holds while `num_new` tokens of it are computed (1:
    a decode step, and between steps), however long it is: the W - 1 keys its first query looks
    back at and the `num_new` positions written are consecutive, and m consecutive positions
    touch at most blocks_for(m - 1) + 1 blocks. For a decode that is at most
    ceil(W / block_size) + 1."""
    return blocks_for(window + num_new - 2, block_size) + 1


def live_blocks(block_ids: Sequence[int]) -> list[int]:
    """The blocks of a table that are held (its `NULL_BLOCK` slots left out), in table order."""
    return [block_id for block_id in block_ids if block_id != NULL_BLOCK]


def num_null_slots(block_ids: Sequence[int]) -> int:
    """How many leading slots of a table slid out of the window."""
    count = 0
    while count < len(block_ids) and block_ids[count] == NULL_BLOCK:
        count += 1
    return count


def readable_table(block_ids: Sequence[int]) -> list[int]:
    """The table as the kernels' block-table tensor holds it: every slot a valid block id."""
    return [_READABLE_FILLER if block_id == NULL_BLOCK else block_id for block_id in block_ids]
