"""Executes one scheduler step: block copies, the forward pass, sampling.

The runner owns the device KV cache and the CPU swap space; the scheduler owns which blocks are
whose. Copies run in the order the scheduler relies on: swap-out, copy-on-write, swap-in, then
the forward.

A request with drafts runs its last token and the drafts as one chunk of several query tokens
(the prefill kernel's shape), takes logits at each of them and keeps what `verify_drafts`
accepts: one forward verifies every request's drafts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pdserve.core.forward_batch import DecodeMetadata, ForwardBatch, PrefillMetadata
from pdserve.core.kv.cache import KVCache
from pdserve.core.kv.sliding_window import readable_table
from pdserve.core.model.forward import CausalLM
from pdserve.core.request import Request
from pdserve.core.sampler import sample
from pdserve.core.sched.scheduler import SchedulerOutput
from pdserve.core.spec.verify import verify_drafts
from pdserve.core.structured.grammar import ConstrainedRows, Grammars
from pdserve.kernels import copy_blocks

_BLOCK_DIM = 2  # the block axis of KVCache.tensor


@dataclass(frozen=True)
class ScheduledChunk:
    """One request's share of a step: `num_new` tokens starting at `start`, the last of them
    its `drafts` (speculative tokens after its context, to verify)."""

    request: Request
    start: int
    num_new: int
    drafts: tuple[int, ...] = ()

    @property
    def completes(self) -> bool:
        """Whether the request catches up this step, so its next token is sampled."""
        return self.start + self.num_new == self.request.num_tokens + len(self.drafts)

    @property
    def num_logits(self) -> int:
        """Positions whose logits it needs: its last token's and each draft's."""
        return 1 + len(self.drafts) if self.completes else 0

    def token_id(self, position: int) -> int:
        num_tokens = self.request.num_tokens
        if position < num_tokens:
            return self.request.token_id(position)
        return self.drafts[position - num_tokens]


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        swap_cache: KVCache | None,
        grammars: Grammars,
    ) -> None:
        self.model = model
        self.grammars = grammars  # masks the logits of requests with a structured constraint
        self.kv_cache = kv_cache
        self.swap_cache = swap_cache
        self.block_size = kv_cache.layout.block_size
        self.device = kv_cache.tensor.device

    def execute(
        self,
        output: SchedulerOutput,
        requests: dict[str, Request],
        after_layer: Callable[[int], None] | None = None,
    ) -> dict[str, list[int]]:
        """Runs the step; returns the new tokens of every request that caught up: its sampled
        token, or with drafts the drafts kept and the target's next token.
        `after_layer` goes to the forward pass (called once each layer's K/V is written)."""
        self._copy_blocks(output)
        chunks = _ordered_chunks(output, requests)
        if not chunks:
            return {}
        logits = self.model.forward(self._build_batch(chunks), self.kv_cache, after_layer)
        sampled = [chunk for chunk in chunks if chunk.completes]
        self.grammars.mask(logits, _constrained_rows(sampled))
        return _sample(logits, sampled)

    def _copy_blocks(self, output: SchedulerOutput) -> None:
        """Swap-out, copy-on-write, swap-in: the order core/sched/scheduler.py relies on."""
        if (output.swap_out or output.swap_in) and self.swap_cache is None:
            raise RuntimeError("scheduler asked for a swap but the engine has no swap space")
        for pairs, src, dst in (
            (output.swap_out, self.kv_cache, self.swap_cache),
            (output.copies, self.kv_cache, self.kv_cache),
            (output.swap_in, self.swap_cache, self.kv_cache),
        ):
            if pairs and src is not None and dst is not None:
                src_ids, dst_ids = zip(*pairs, strict=True)
                copy_blocks(src.tensor, dst.tensor, list(src_ids), list(dst_ids), dim=_BLOCK_DIM)

    def _build_batch(self, chunks: list[ScheduledChunk]) -> ForwardBatch:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_indices: list[int] = []
        for chunk in chunks:
            request = chunk.request
            for position in range(chunk.start, chunk.start + chunk.num_new):
                input_ids.append(chunk.token_id(position))
                positions.append(position)
                block = request.block_ids[position // self.block_size]
                slots.append(block * self.block_size + position % self.block_size)
            logits_indices.extend(range(len(input_ids) - chunk.num_logits, len(input_ids)))
        decode = [chunk for chunk in chunks if chunk.num_new == 1]
        prefill = chunks[len(decode) :]
        return ForwardBatch(
            input_ids=self._tensor(input_ids, torch.long),
            positions=self._tensor(positions, torch.long),
            slot_mapping=self._tensor(slots, torch.long),
            num_decode_tokens=len(decode),
            decode=self._decode_metadata(decode) if decode else None,
            prefill=self._prefill_metadata(prefill) if prefill else None,
            logits_indices=self._tensor(logits_indices, torch.long),
        )

    def _decode_metadata(self, chunks: list[ScheduledChunk]) -> DecodeMetadata:
        return DecodeMetadata(
            block_tables=self._block_tables(chunks),
            context_lens=self._tensor([c.start + c.num_new for c in chunks], torch.int32),
        )

    def _prefill_metadata(self, chunks: list[ScheduledChunk]) -> PrefillMetadata:
        starts = [0]
        for chunk in chunks:
            starts.append(starts[-1] + chunk.num_new)
        return PrefillMetadata(
            block_tables=self._block_tables(chunks),
            query_start_loc=self._tensor(starts, torch.int32),
            context_lens=self._tensor([c.start + c.num_new for c in chunks], torch.int32),
        )

    def _block_tables(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        width = max(-(-(c.start + c.num_new) // self.block_size) for c in chunks)
        rows = [readable_table(c.request.block_ids[:width]) for c in chunks]
        return self._tensor([row + [0] * (width - len(row)) for row in rows], torch.int32)

    def _tensor(self, values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)


def _ordered_chunks(output: SchedulerOutput, requests: dict[str, Request]) -> list[ScheduledChunk]:
    """Decode chunks (one token) first, then prefill chunks and chunks with drafts: the layout
    ForwardBatch expects."""
    chunks = [
        ScheduledChunk(
            requests[rid],
            requests[rid].num_computed_tokens,
            num_new,
            output.draft_token_ids.get(rid, ()),
        )
        for rid, num_new in output.num_scheduled_tokens.items()
    ]
    return sorted(chunks, key=lambda chunk: chunk.num_new != 1)


def _sample(logits: torch.Tensor, chunks: list[ScheduledChunk]) -> dict[str, list[int]]:
    """`logits` hold `chunk.num_logits` rows per chunk, in order. Chunks without drafts sample
    their one row together; each chunk with drafts verifies its rows."""
    first_rows = _first_rows(chunks)
    plain = [index for index, chunk in enumerate(chunks) if not chunk.drafts]
    tokens: dict[str, list[int]] = {}
    if plain:
        plain_rows = logits if len(plain) == len(chunks) else logits[[first_rows[i] for i in plain]]
        sampled = sample(
            plain_rows,
            [chunks[index].request.params for index in plain],
            [chunks[index].request.noise for index in plain],
        )
        for index, token in zip(plain, sampled, strict=True):
            tokens[chunks[index].request.request_id] = [token]
    for index, chunk in enumerate(chunks):
        if chunk.drafts:
            rows = logits[first_rows[index] : first_rows[index + 1]]
            request = chunk.request
            tokens[request.request_id] = verify_drafts(
                rows, chunk.drafts, request.params, request.noise
            )
    return tokens


def _first_rows(chunks: list[ScheduledChunk]) -> list[int]:
    """Where each chunk's logits rows start (and, last, their total)."""
    return list(itertools.accumulate((chunk.num_logits for chunk in chunks), initial=0))


def _constrained_rows(chunks: list[ScheduledChunk]) -> list[ConstrainedRows]:
    """The rows of the chunks whose requests have a structured constraint."""
    first_rows = _first_rows(chunks)
    return [
        ConstrainedRows(first_rows[index], chunk.request.grammar, chunk.drafts)
        for index, chunk in enumerate(chunks)
        if chunk.request.grammar is not None
    ]
