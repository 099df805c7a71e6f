"""Bad arguments fail with a ValueError that names the argument."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pdserve.kernels import (
    copy_blocks,
    paged_attention_decode,
    paged_attention_prefill,
    write_kv,
)
from pdserve.testing.kernel_cases import HeadConfig, make_paged_case

CASE = make_paged_case([5, 20], HeadConfig(4, 2, 64, 16), query_lens=[2, 3])


def decode_with(**changes: Any) -> Callable[[], object]:
    args: dict[str, Any] = {
        "q": CASE.q[:2],
        "k_cache": CASE.k_cache,
        "v_cache": CASE.v_cache,
        "block_tables": CASE.block_tables,
        "context_lens": CASE.context_lens,
        "scale": CASE.scale,
    }
    args.update(changes)
    return lambda: paged_attention_decode(**args)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (decode_with(q=CASE.q[:2].half()), "k_cache"),
        (decode_with(q=CASE.q[:3]), "q"),
        (decode_with(q=CASE.q[:2, :3]), "q: num_heads"),
        (decode_with(v_cache=CASE.v_cache[:-1]), "v_cache"),
        (decode_with(block_tables=CASE.block_tables.long()), "block_tables"),
        (decode_with(context_lens=CASE.context_lens.long()), "context_lens"),
        (decode_with(context_lens=torch.tensor([5, 49], dtype=torch.int32)), "context_lens[1]"),
        (decode_with(context_lens=torch.tensor([0, 3], dtype=torch.int32)), "context_lens[0]"),
        (decode_with(scale=0.0), "scale"),
        (decode_with(sliding_window=0), "sliding_window"),
    ],
)
def test_decode_rejects(call: Callable[[], object], field: str) -> None:
    with pytest.raises(ValueError, match=r"^" + re.escape(field)):
        call()


def test_prefill_rejects_query_start_loc() -> None:
    common = (CASE.q, CASE.k_cache, CASE.v_cache, CASE.block_tables)
    too_long = torch.tensor([0, 2, 9], dtype=torch.int32)  # 7 queries for a context of 20: fine
    bad_end = torch.tensor([0, 2, 4], dtype=torch.int32)
    over_context = torch.tensor([0, 6, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^query_start_loc"):
        paged_attention_prefill(*common, too_long[:2], CASE.context_lens, CASE.scale)
    with pytest.raises(ValueError, match=r"^query_start_loc"):
        paged_attention_prefill(*common, bad_end, CASE.context_lens, CASE.scale)
    with pytest.raises(ValueError, match=r"^query_start_loc"):
        paged_attention_prefill(*common, over_context, CASE.context_lens, CASE.scale)


def test_write_kv_rejects() -> None:
    k = torch.zeros(2, 2, 64)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"^slot_mapping"):
        write_kv(k, k, CASE.k_cache, CASE.v_cache, slots.int())
    with pytest.raises(ValueError, match=r"^slot_mapping"):
        write_kv(k, k, CASE.k_cache, CASE.v_cache, torch.tensor([0, 10_000]))
    with pytest.raises(ValueError, match=r"^k:"):
        write_kv(torch.zeros(2, 3, 64), torch.zeros(2, 3, 64), CASE.k_cache, CASE.v_cache, slots)


def test_write_kv_checked_by_an_earlier_call_skips_the_checks_and_still_writes() -> None:
    k = torch.ones(2, CASE.k_cache.shape[2], CASE.k_cache.shape[3])
    k_cache, v_cache = torch.zeros_like(CASE.k_cache), torch.zeros_like(CASE.v_cache)
    write_kv(k, k, k_cache, v_cache, torch.tensor([0, 1]), checked=True)
    assert bool((k_cache[0, :2] == 1).all()) and bool((v_cache[0, :2] == 1).all())


def test_copy_blocks_rejects() -> None:
    pool = torch.zeros(4, 2, 3)
    with pytest.raises(ValueError, match=r"^dst:"):
        copy_blocks(pool, torch.zeros(4, 2, 4), [0], [1])
    with pytest.raises(ValueError, match=r"^dst_ids"):
        copy_blocks(pool, pool, [0, 1], [1])
    with pytest.raises(ValueError, match=r"^dim"):
        copy_blocks(pool, pool, [0], [1], dim=3)


def test_triton_launchers_refuse_cpu_tensors_outside_the_interpreter() -> None:
    pytest.importorskip("triton")
    from pdserve.kernels import _backend, triton_decode

    if _backend.TRITON_INTERPRET:
        pytest.skip("this session runs Triton's interpreter")
    args = (CASE.q[:2], CASE.k_cache, CASE.v_cache, CASE.block_tables, CASE.context_lens)
    with pytest.raises(ValueError, match=r"^q: the Triton kernels need a CUDA tensor"):
        triton_decode.decode_attention(*args, CASE.scale)
