"""What the router remembers of each worker's prefix cache: the block hashes of the prompts it
sent there recently (`--routing-policy prefix`).

An approximation, as SGLang's cache-aware router and llm-d's prefix scorer keep one: the router
never asks a worker what it caches. It hashes each prompt's full blocks itself (the workers'
chained hashes, `core.block_pool.chain_hashes`, under a root of its own: it only compares against
its own map) and assumes that a worker it sent a prompt to holds those blocks until
`MAX_BLOCKS_PER_WORKER` newer ones push them out (least recently routed first), or as many as
the worker reports it keeps (`LoadResponse.num_cacheable_blocks`: its pool and its KV offload
tiers, up to `MAX_TRACKED_BLOCKS`). A worker evicting sooner only costs a wrong preference,
never a wrong answer: the worker's own cache decides what is reused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from pdserve.core.kv.block_pool import BlockHash, cache_root, chain_hashes

# Per worker: 4096 blocks of 16 tokens are 64 Ki prompt tokens, about what the default decode
# pool (1024 blocks) and a few of its recent requests' prefixes hold; bounded memory (~300 KiB).
MAX_BLOCKS_PER_WORKER = 4096
# The most blocks remembered per worker however many it keeps (offload tiers on disk may hold
# hundreds of thousands): ~25 MiB of hashes per worker at most.
MAX_TRACKED_BLOCKS = 262_144
# The router's own root (fixed, so every replica hashes a prompt alike): it compares only its own
# hashes, never the workers'.
ROUTER_ROOT = cache_root("pdserve-router")


class PrefixMap:
    def __init__(self, block_size: int, max_blocks: int = MAX_BLOCKS_PER_WORKER) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks: must be >= 1, got {max_blocks}")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._seen: dict[str, OrderedDict[BlockHash, None]] = {}
        self._capacity: dict[str, int] = {}  # per worker, past max_blocks: what it reported
        # The last prompt hashed: both tiers' picks (and retries) for one request hash it once.
        self._last: tuple[Sequence[int], tuple[BlockHash, ...]] | None = None

    def hashes(self, prompt: Sequence[int]) -> tuple[BlockHash, ...]:
        """The prompt's full blocks, chained (equal hashes: equal leading tokens)."""
        if self._last is not None and self._last[0] is prompt:
            return self._last[1]
        known: list[BlockHash] = []
        chain_hashes(ROUTER_ROOT, prompt, self.block_size, known)
        self._last = (prompt, tuple(known))
        return self._last[1]

    def matched(self, worker: str, hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of `hashes` were routed to `worker` recently."""
        seen = self._seen.get(worker)
        count = 0
        if seen is None:
            return count
        for block_hash in hashes:
            if block_hash not in seen:
                break
            count += 1
        return count

    def record(self, worker: str, hashes: Sequence[BlockHash]) -> None:
        """`worker` got a prompt with these blocks: they are its most recent, the head most of
        all (it is the part other prompts share, so it is forgotten last)."""
        seen = self._seen.setdefault(worker, OrderedDict())
        for block_hash in reversed(hashes):
            seen[block_hash] = None
            seen.move_to_end(block_hash)
        while len(seen) > self._capacity.get(worker, self.max_blocks):
            seen.popitem(last=False)

    def set_capacity(self, worker: str, cacheable_blocks: int) -> None:
        """`worker` keeps `cacheable_blocks` prefix blocks: remember that many of its own (at
        least `max_blocks`, at most MAX_TRACKED_BLOCKS)."""
        self._capacity[worker] = min(max(cacheable_blocks, self.max_blocks), MAX_TRACKED_BLOCKS)

    def forget(self, worker: str) -> None:
        """A worker left (or came back as a new process): nothing of its cache is known."""
        self._seen.pop(worker, None)
        self._capacity.pop(worker, None)

    def num_blocks(self, worker: str) -> int:
        return len(self._seen.get(worker, ()))
