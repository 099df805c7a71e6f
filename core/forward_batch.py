"""What one model step computes, as explicit tensors (never globals).

Tokens are packed: the decode sequences' single tokens come first (one per sequence), then the
prefill chunks. Attention runs the decode kernel on the first part and the chunked-prefill kernel
on the rest, so each kernel sees the shape it is fast at.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeMetadata:
    block_tables: torch.Tensor  # [num_decode, max_blocks] int32
    context_lens: torch.Tensor  # [num_decode] int32, including the new token


@dataclass(frozen=True)
class PrefillMetadata:
    block_tables: torch.Tensor  # [num_prefill, max_blocks] int32
    query_start_loc: torch.Tensor  # [num_prefill + 1] int32, offsets into the prefill tokens
    context_lens: torch.Tensor  # [num_prefill] int32, tokens so far including this chunk


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset
    num_decode_tokens: int
    decode: DecodeMetadata | None
    prefill: PrefillMetadata | None
    logits_indices: torch.Tensor  # [num_sequences] int64: the token whose logits each needs
