"""The KV-cache manager: the one owner of a worker's device blocks and CPU swap blocks (the seam of
vLLM v1's `KVCacheManager`).

Everything that gives a request blocks, takes them back or moves them goes through here: the
scheduler (grow, copy-on-write, fork, swap, free), decode's reservations (`allocate_prompt`) and
the simulator's workers, which run the same scheduler and reservation queue. Nobody else reaches
into the pools to change them; the pools are public only to be read (gauges, load reports).

A request's blocks are `request.block_ids` (device) and `request.swap_block_ids` (CPU), one
reference each; a block two requests hold (a cached prefix, a fork's shared prompt) has two.
After a speculative step, `roll_back` returns the blocks only rejected drafts used.

With a sliding window (`core/kv/sliding_window.py`) a request's table keeps only the blocks its next
queries can see: `slide` hands the ones that fell out of the window back to the pool after every
step and leaves `NULL_BLOCK` in their slots, so a request holds at most `max_live_blocks` blocks
between steps however long it grows, a swap moves only those, and a reservation holds (and
receives) only the prompt's blocks in the window of its first decode. Slid-out blocks that were
registered in the prefix cache stay cached when freed: a block's hash is that of its tokens and
all before them, not of the blocks before it, so a later request with the same prefix may take
the blocks of its own window back (`take_cached_prefix` looks only for those) even after the
blocks before them were evicted.

With KV offload (`core/kv/offload.py`) the prefix cache reaches below the pool: a block the pool
evicts is kept in host memory or on disk, and a request whose leading blocks a lower tier holds
gets them copied into fresh pool blocks (`take_cached_prefix`) instead of computing them.

The prefix-cache counters live here too, so that every path that takes a cached prefix counts
its hits the same way: `num_prefix_query_tokens` are the tokens of requests that looked, and
`num_prefix_hit_tokens` those they found cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import BlockHash, BlockPool, blocks_for, chain_hashes
from pdserve.core.kv.offload import KVOffload
from pdserve.core.kv.sliding_window import (
    NULL_BLOCK,
    first_live_block,
    live_blocks,
    num_null_slots,
)
from pdserve.core.request import Request

BlockPair = tuple[int, int]  # (source block, destination block) of one copy
BELOW: Final = -2  # a prefix block a tier below the pool holds: promoted if the prefix is taken


@dataclass(frozen=True)
class KVUsage:
    """The pools' counts as one snapshot: what load reports, stats and gauges read."""

    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int  # holding a reusable prefix
    num_evictions: int  # cached blocks reused for other KV
    num_swap_blocks: int
    num_free_swap_blocks: int
    num_offload_blocks: int  # blocks the offload tiers below the pool can hold

    @property
    def fraction_used(self) -> float:
        return (self.num_blocks - self.num_free_blocks) / max(self.num_blocks, 1)

    @property
    def num_used_swap_blocks(self) -> int:
        return self.num_swap_blocks - self.num_free_swap_blocks


class KVCacheManager:
    def __init__(self, config: EngineConfig, sliding_window: int | None = None) -> None:
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window: must be None or >= 1, got {sliding_window}")
        self.block_size = config.block_size
        self.sliding_window = sliding_window  # the model's (None: full attention)
        self.block_pool = BlockPool(config.num_kv_blocks, config.enable_prefix_caching)
        self.swap_pool = BlockPool(config.num_swap_blocks)
        self.cache_root: BlockHash = b""  # `block_pool.cache_root` of the model and layout
        self._deferred_swap_frees: list[int] = []
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0
        self.num_reused_blocks = 0  # prompt blocks reservations found cached: they never traveled
        self.num_window_freed_blocks = 0  # blocks `slide` gave back: out of every future window
        self.offload: KVOffload | None = None

    def attach_offload(self, offload: KVOffload) -> None:
        """Keeps the blocks the pool evicts in `offload`'s tiers, and looks there for prefixes."""
        self.offload = offload
        self.block_pool.on_evict = offload.demote

    def usage(self) -> KVUsage:
        pool = self.block_pool
        return KVUsage(
            num_blocks=pool.num_blocks,
            num_free_blocks=pool.num_free,
            num_cached_blocks=pool.num_cached_blocks,
            num_evictions=pool.num_evictions,
            num_swap_blocks=self.swap_pool.num_blocks,
            num_free_swap_blocks=self.swap_pool.num_free,
            num_offload_blocks=0 if self.offload is None else self.offload.capacity_blocks,
        )

    # -- prefix cache ------------------------------------------------------------------------

    def take_cached_prefix(self, request: Request) -> int:
        """A fresh request takes the cached blocks of its tokens but the last; how many tokens.

        The last token is left out so that at least one token is computed (its logits sample
        the next token) and, on decode, so that at least one block travels."""
        if not self.block_pool.enable_caching:
            return 0
        usable = (request.target_tokens - 1) // self.block_size
        hashes = self._block_hashes(request)[:usable]
        found = [self._cached_block(block_hash) for block_hash in hashes]
        first, end = self._cached_span(found)
        request.block_ids = self._take_span(found, hashes, first, end)
        request.num_computed_tokens = len(request.block_ids) * self.block_size
        return request.num_computed_tokens

    def _cached_block(self, block_hash: BlockHash) -> int | None:
        """The pool block holding `block_hash`, `BELOW` when only a lower tier does, or None."""
        block_id = self.block_pool.cached_block(block_hash)
        if block_id is None and self.offload is not None and self.offload.holds(block_hash):
            return BELOW
        return block_id

    def _cached_span(self, found: list[int | None]) -> tuple[int, int]:
        """The table slots `[first, end)` of the longest cached prefix: all of its leading found
        blocks under full attention; with a sliding window, the longest prefix whose blocks in
        the window of the next query are all found (the slots before `first` stay empty)."""
        if self.sliding_window is None:
            end = next((index for index, block in enumerate(found) if block is None), len(found))
            return 0, end
        for end in range(len(found), 0, -1):
            first = first_live_block(end * self.block_size, self.sliding_window, self.block_size)
            if all(block_id is not None for block_id in found[first:end]):
                return first, end
        return 0, 0

    def _take_span(
        self, found: list[int | None], hashes: list[BlockHash], first: int, end: int
    ) -> list[int]:
        """The table of the span: a reference on each pool block, lower tiers' blocks promoted
        into fresh ones. A promotion that fails (no free block, a block lost below) ends the
        prefix there; with a sliding window the prefix is then dropped whole (a shorter one
        would need blocks before `first`)."""
        in_pool = [block for block in found[first:end] if block is not None and block != BELOW]
        self.block_pool.take_cached(in_pool)
        table = [NULL_BLOCK] * first
        for index in range(first, end):
            block_id = found[index]
            if block_id == BELOW:
                block_id = self._promote(hashes[index])
            if block_id is None:
                untaken = [b for b in found[index + 1 : end] if b is not None and b != BELOW]
                self.block_pool.free(untaken)
                if self.sliding_window is not None:
                    self.block_pool.free(live_blocks(table))
                    return []
                break
            table.append(block_id)
        return table

    def _promote(self, block_hash: BlockHash) -> int | None:
        """A fresh pool block holding `block_hash`'s rows from a lower tier, registered; None
        (nothing held) when no block is free or the tier lost it."""
        assert self.offload is not None  # only BELOW blocks are promoted
        ids = self.block_pool.allocate(1)
        if ids is None:
            return None
        if self.offload.promote(block_hash, ids[0]) is None:
            self.block_pool.free(ids)
            return None
        self.block_pool.register(ids[0], block_hash)
        return ids[0]

    def count_prefix_query(self, request: Request) -> None:
        """Counts a request that took its cached prefix (`take_cached_prefix`) and stays: all its
        tokens were looked up, and those it holds computed were found."""
        self.num_prefix_query_tokens += request.num_tokens
        self.num_prefix_hit_tokens += request.num_computed_tokens

    def cache_filled(self, request: Request, num_computed_before: int) -> None:
        """The forward took `request` from `num_computed_before` computed tokens to
        `request.num_computed_tokens`: the blocks it filled join the cache."""
        filled_before = num_computed_before // self.block_size
        filled = request.num_computed_tokens // self.block_size
        if filled > filled_before and self.block_pool.enable_caching:
            hashes = self._block_hashes(request)
            for index in range(filled_before, filled):
                block_id = request.block_ids[index]
                if block_id != NULL_BLOCK:  # a reservation's slot before the window: never held
                    self.block_pool.register(block_id, hashes[index])

    def _block_hashes(self, request: Request) -> list[BlockHash]:
        hashes = request.block_hashes
        chain_hashes(self.cache_root, request.all_token_ids, self.block_size, hashes)
        return hashes

    # -- reservations (decode) ---------------------------------------------------------------

    def allocate_prompt(self, request: Request) -> bool:
        """Blocks for a fresh request's whole prompt (and the output it resumes after, for a
        migrated one), or nothing: its cached leading blocks by reference (at most all but the
        last token's, so at least that block travels) and new ones for the rest. With a sliding
        window it holds only the blocks in the window of the first decode: `NULL_BLOCK` before."""
        self.take_cached_prefix(request)
        first = first_live_block(request.num_tokens, self.sliding_window, self.block_size)
        if len(request.block_ids) <= first:  # every cached block lies before that window
            self.free_for_recompute(request)
        else:
            self._release_before(request, first)
        request.block_ids.extend([NULL_BLOCK] * (first - len(request.block_ids)))
        needed = blocks_for(request.num_tokens, self.block_size)
        fresh = self.block_pool.allocate(needed - len(request.block_ids))
        if fresh is None:
            self.free_for_recompute(request)
            return False
        request.block_ids.extend(fresh)
        return True

    def count_reservation(self, request: Request) -> None:
        """A reservation stands: its cached blocks are prefix hits that never travel."""
        cached = request.block_ids[: request.num_computed_tokens // self.block_size]
        self.num_reused_blocks += len(live_blocks(cached))
        self.count_prefix_query(request)

    def num_slid_blocks(self, request: Request) -> int:
        """Leading blocks of the request's table that slid out of the window (none held)."""
        return num_null_slots(request.block_ids)

    # -- growth ------------------------------------------------------------------------------

    def can_grow(self, request: Request, num_new: int) -> bool:
        """Whether enough blocks are free for `num_new` more tokens of `request` (and for its
        swapped blocks to come back in)."""
        total = blocks_for(request.num_computed_tokens + num_new, self.block_size)
        grow = total - len(request.block_ids) + int(self._shared_write_block(request) is not None)
        return self.block_pool.can_allocate(max(grow, len(request.swap_block_ids)))

    def grow(self, request: Request, num_new: int, copies: list[BlockPair]) -> bool:
        """Allocates the blocks `request` needs for `num_new` more tokens, or nothing: new
        blocks at the end, and a private copy of a shared block it is about to write into
        (copy-on-write; the pair to copy is appended to `copies`)."""
        total = blocks_for(request.num_computed_tokens + num_new, self.block_size)
        shared = self._shared_write_block(request)
        missing = total - len(request.block_ids) + int(shared is not None)
        if missing <= 0:
            return True
        ids = self.block_pool.allocate(missing)
        if ids is None:
            return False
        if shared is not None:
            copy = ids.pop()
            copies.append((request.block_ids[shared], copy))
            self.block_pool.free([request.block_ids[shared]])
            request.block_ids[shared] = copy
        request.block_ids.extend(ids)
        return True

    def _shared_write_block(self, request: Request) -> int | None:
        """Index of the block the next token goes into, when other requests hold it too."""
        index = request.num_computed_tokens // self.block_size
        shared = (
            index < len(request.block_ids)
            and self.block_pool.ref_count(request.block_ids[index]) > 1
        )
        return index if shared else None

    def share(self, leader: Request, fork: Request) -> None:
        """`fork` takes a reference on each of `leader`'s blocks (n > 1: one prompt's samples)."""
        self.block_pool.share(live_blocks(leader.block_ids))
        fork.block_ids = list(leader.block_ids)

    def roll_back(self, request: Request) -> None:
        """Frees the blocks past those its computed tokens use: rejected drafts wrote there.

        Rejected slots in the last block it keeps need nothing: the next step writes those
        positions before any query reads them. None of them was ever registered in the prefix
        cache (`cache_filled` registers full blocks of computed, hence verified, tokens only)."""
        keep = blocks_for(request.num_computed_tokens, self.block_size)
        tail = request.block_ids[keep:]
        if tail:
            self.block_pool.free(tail[::-1])
            del request.block_ids[keep:]

    # -- freeing -----------------------------------------------------------------------------

    def slide(self, request: Request) -> None:
        """Gives back the blocks no future query of the request can see (its computed tokens
        moved the window past them); a no-op without a sliding window."""
        if self.sliding_window is not None:
            first = first_live_block(
                request.num_computed_tokens, self.sliding_window, self.block_size
            )
            self.num_window_freed_blocks += self._release_before(request, first)

    def _release_before(self, request: Request, first: int) -> int:
        """Frees the request's blocks before table index `first`, leaving `NULL_BLOCK`; how
        many. Oldest first: the cache evicts in the order of freeing."""
        slots = range(num_null_slots(request.block_ids), min(first, len(request.block_ids)))
        released = [request.block_ids[index] for index in slots]
        self.block_pool.free(released)
        for index in slots:
            request.block_ids[index] = NULL_BLOCK
        return len(released)

    def free(self, request: Request) -> None:
        """Drops the request's reference on each of its device and swap blocks. Device blocks
        go last first: the cache evicts in the order of freeing, and a prefix's tail is the
        part other requests are least likely to share."""
        self.block_pool.free(live_blocks(request.block_ids)[::-1])
        request.block_ids = []
        self.swap_pool.free(request.swap_block_ids)
        request.swap_block_ids = []

    def free_for_recompute(self, request: Request) -> None:
        """Frees the request's blocks and forgets what they held: it computes from token 0."""
        self.free(request)
        request.num_computed_tokens = 0

    # -- swap --------------------------------------------------------------------------------

    def swap_out(self, request: Request, sources: list[int]) -> list[BlockPair] | None:
        """Moves a running request's blocks in use to the swap pool: `sources` (its table, with
        the source of a copy this step cancelled in place of the copy) pair with new swap blocks
        and its device blocks are freed. Only the blocks of its computed tokens move: not those
        it grew into this step before it was preempted (nothing was written there), nor the
        slots that slid out of the window, which the table keeps (`NULL_BLOCK`) so that swap-in
        puts the blocks back in their slots. None, and nothing changed, when the swap pool lacks
        room."""
        slid = num_null_slots(request.block_ids)
        moving = sources[slid : blocks_for(request.num_computed_tokens, self.block_size)]
        swap_ids = self.swap_pool.allocate(len(moving))
        if swap_ids is None:
            return None
        self.free(request)
        request.block_ids = [NULL_BLOCK] * slid
        request.swap_block_ids = swap_ids
        return list(zip(moving, swap_ids, strict=True))

    def swap_in(self, request: Request) -> list[BlockPair]:
        """Moves a swapped request's blocks back to new device blocks (`can_grow` counted
        them). The swap blocks are read by this step's copies: they go back to the swap pool
        only at `release_swapped_in`."""
        device_ids = self.block_pool.allocate(len(request.swap_block_ids))
        assert device_ids is not None  # the caller checked can_grow
        pairs = list(zip(request.swap_block_ids, device_ids, strict=True))
        self._deferred_swap_frees.extend(request.swap_block_ids)
        request.block_ids, request.swap_block_ids = request.block_ids + device_ids, []
        return pairs

    def release_swapped_in(self) -> None:
        """The copies of the last step have run: the swap blocks its swap-ins read are free."""
        self.swap_pool.free(self._deferred_swap_frees)
        self._deferred_swap_frees = []

    @property
    def swapped_in_blocks(self) -> tuple[int, ...]:
        """Swap blocks the last step's swap-ins read: owned until `release_swapped_in`."""
        return tuple(self._deferred_swap_frees)
