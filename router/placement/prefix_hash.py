"""The key `--routing-policy prefix-hash` routes a prompt by: its leading KV blocks, hashed.

Router replicas share nothing, so a prefix-aware choice that they all make alike cannot come
from what each one remembers (`prefix_map.py`). It comes from the prompt itself: the chained
hash (`core.block_pool.chain_hashes`, the router's fixed root) of its first `--prefix-hash-blocks`
full blocks, ranked onto the workers by rendezvous hashing (`policy.rendezvous_choice`). Prompts
that share those blocks (a system prompt, a conversation's history) land on one worker, whose
prefix cache then holds them, whichever replica routes them.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.core.kv.block_pool import BlockHash, chain_hashes
from pdserve.router.placement.prefix_map import ROUTER_ROOT


class PrefixHash:
    def __init__(self, block_size: int, depth_blocks: int) -> None:
        if depth_blocks < 1:
            raise ValueError(f"--prefix-hash-blocks: must be >= 1, got {depth_blocks}")
        self.block_size = block_size
        self.depth_blocks = depth_blocks
        # The last prompt keyed: both tiers' picks (and retries) for one request hash it once.
        self._last: tuple[Sequence[int], BlockHash | None] | None = None

    def key(self, prompt: Sequence[int]) -> BlockHash | None:
        """The hash of the prompt's first `depth_blocks` full blocks (fewer if it has fewer);
        None for a prompt shorter than one block (nothing worth a preference)."""
        if self._last is not None and self._last[0] is prompt:
            return self._last[1]
        head = prompt[: self.depth_blocks * self.block_size]
        known: list[BlockHash] = []
        chain_hashes(ROUTER_ROOT, head, self.block_size, known)
        key = known[-1] if known else None
        self._last = (prompt, key)
        return key
