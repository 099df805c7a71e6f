"""The cross-tier prefix cache with the in-process transfer: decode reserves only the blocks its
prefix cache lacks, prefill sends only those, and the greedy tokens stay transformers'.

The real-process version (router, UCX) is tests/integration/test_cross_tier_prefix.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.transfer.interface import TransferDescriptor
from pdserve.decode_service.engine import DecodeEngine
from pdserve.prefill_service.engine import PrefillEngine
from tests.fakes.local_transfer import LocalKVReceiver, LocalKVSender, LocalTransferHub
from tests.oracle import SHARED_MAX_TOKENS

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

BLOCK = 16
GREEDY = SamplingParams(max_tokens=SHARED_MAX_TOKENS, temperature=0.0)


@dataclass
class Tiers:
    prefill: PrefillEngine
    decode: DecodeEngine

    def reserve(self, request_id: str, prompt: list[int]) -> TransferDescriptor:
        return self.decode.reserve(request_id, prompt, GREEDY).result(timeout=0)

    def prefill_into(
        self, request_id: str, prompt: list[int], destination: TransferDescriptor
    ) -> tuple[int, int]:
        """Runs the prompt on prefill into `destination`: (first token, KV bytes sent)."""
        outcome = self.prefill.submit(request_id, prompt, GREEDY, destination)
        while not outcome.done():
            self.prefill.step()
        return outcome.result().first_token_id, outcome.result().kv_bytes_sent

    def finish(self, request_id: str, destination: TransferDescriptor, first: int) -> list[int]:
        """Decode from the first token until the request finishes: its tokens."""
        self.decode.start(request_id, destination.token, first)
        tokens: list[int] = []
        finished = False
        while not finished:
            deltas = [delta for _, delta in self.decode.poll()] + self.decode.step()
            for delta in deltas:
                assert not isinstance(delta, BaseException)
                tokens.extend(delta.new_token_ids)
                finished = finished or delta.finished
        return tokens

    def generate(self, request_id: str, prompt: list[int]) -> tuple[list[int], int, int]:
        """(tokens, cached blocks decode reported, KV bytes sent) of one request."""
        destination = self.reserve(request_id, prompt)
        first, sent = self.prefill_into(request_id, prompt, destination)
        return self.finish(request_id, destination, first), destination.num_cached_blocks, sent

    def all_free(self) -> bool:
        pools = (
            self.prefill.scheduler.kv_manager.block_pool,
            self.decode.scheduler.kv_manager.block_pool,
        )
        return all(pool.num_free == pool.num_blocks for pool in pools)


def _tiers(model_dir: Path, caching: bool = True) -> Tiers:
    hub = LocalTransferHub()
    config = EngineConfig(num_kv_blocks=96, enable_prefix_caching=caching)
    prefill = PrefillEngine(model_dir, config, LocalKVSender(hub))
    decode = DecodeEngine(model_dir, config, lambda cache: LocalKVReceiver(hub, cache, 4))
    return Tiers(prefill, decode)


@pytest.fixture(scope="module")
def tiers(model_dir: Path) -> Tiers:
    return _tiers(model_dir)


def test_shared_prefix_travels_once_and_outputs_match_transformers(
    tiers: Tiers, shared_prompts: list[list[int]], shared_hf_greedy: list[list[int]]
) -> None:
    block_nbytes = int(tiers.decode.layout.block_nbytes)
    saved_before = tiers.decode.saved_kv_bytes
    # Prompts 6-8 share 100 leading tokens (six full blocks); 0-5 share 0 or 9 (no full block).
    results = [tiers.generate(f"s{i}", prompt) for i, prompt in enumerate(shared_prompts)]
    assert [tokens for tokens, _, _ in results] == shared_hf_greedy
    cached = [num_cached for _, num_cached, _ in results]
    assert cached[6:] == [0, 6, 6] and not any(cached[:6])
    for prompt, (_, num_cached, sent) in zip(shared_prompts, results, strict=True):
        assert sent == (-(-len(prompt) // BLOCK) - num_cached) * block_nbytes
    assert tiers.decode.saved_kv_bytes - saved_before == 12 * block_nbytes
    assert tiers.all_free()


def test_a_block_aligned_prompt_still_sends_its_last_block(
    tiers: Tiers, prompts: list[list[int]]
) -> None:
    """Its last block holds the last prompt token's KV: it travels even when decode caches it."""
    prompt = prompts[2]  # 16 tokens: exactly one block
    aligned = prompts[-1][:96]  # six blocks
    first = tiers.generate("aligned-1", aligned)
    second = tiers.generate("aligned-2", aligned)
    assert second[0] == first[0]
    assert (first[1], second[1]) in {(0, 5), (5, 5)}  # 5 when an earlier test cached it
    one_block = tiers.generate("one-block", prompt)
    assert one_block[1] == 0 and one_block[2] == int(tiers.decode.layout.block_nbytes)
    assert tiers.all_free()


def test_aborts_release_cached_blocks_without_freeing_a_holders(
    tiers: Tiers, shared_prompts: list[list[int]]
) -> None:
    pool = tiers.decode.scheduler.kv_manager.block_pool
    prompt = shared_prompts[8]
    tiers.generate("warm", prompt)
    cached = (len(prompt) - 1) // BLOCK  # every full block but the last prompt token's
    holder = tiers.reserve("holder", prompt)  # takes the cached blocks
    aborted = tiers.reserve("aborted", prompt)  # takes them too: two references each
    shared = tiers.decode._reserved["holder"].request.block_ids[:cached]
    assert holder.num_cached_blocks == aborted.num_cached_blocks == cached
    assert [pool.ref_count(block) for block in shared] == [2] * cached
    tiers.decode.abort("aborted")
    assert [pool.ref_count(block) for block in shared] == [1] * cached
    first, _ = tiers.prefill_into("holder", prompt, holder)
    assert tiers.finish("holder", holder, first) == tiers.generate("again", prompt)[0]
    landed = tiers.reserve("landed", prompt)  # its KV arrives, then the router gives up
    tiers.prefill_into("landed", prompt, landed)
    tiers.decode.poll()
    tiers.decode.abort("landed")
    assert tiers.all_free()


def test_prefill_refuses_a_descriptor_caching_every_block(
    tiers: Tiers, shared_prompts: list[list[int]]
) -> None:
    prompt = shared_prompts[8]
    destination = tiers.reserve("too-many", prompt)
    blocks = -(-len(prompt) // BLOCK)
    for cached, field in ((blocks, "num_cached_blocks"), (3, "block_ids")):
        bad = dataclasses.replace(destination, num_cached_blocks=cached)
        with pytest.raises(InvalidRequestError, match=field):
            tiers.prefill.submit("too-many", prompt, GREEDY, bad)
    tiers.decode.abort("too-many")
    assert tiers.all_free()


def test_without_the_cache_every_block_travels(
    model_dir: Path, shared_prompts: list[list[int]]
) -> None:
    tiers = _tiers(model_dir, caching=False)
    results = [tiers.generate(f"n{i}", prompt) for i, prompt in enumerate(shared_prompts[6:])]
    assert [num_cached for _, num_cached, _ in results] == [0, 0, 0]
    assert tiers.decode.saved_kv_bytes == 0 and tiers.all_free()
