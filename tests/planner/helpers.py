"""Profiles with known costs, for answers that can be worked out by hand."""

from __future__ import annotations

from pdserve.costmodel.profile import BlockCosts, CostModel, Profile

INSTANT_WIRE = 1e30  # bytes/s: a transfer that takes no time


def fixed_step_profile(step_s: float, delivery_s_per_block: float = 0.0) -> Profile:
    """Every step takes `step_s` whatever it runs; a KV block crosses in `delivery_s_per_block`."""
    blocks = BlockCosts(
        block_nbytes=1,
        swap_s=0.0,
        gather_s=0.0,
        scatter_s=delivery_s_per_block,
        wire_bytes_per_s=INSTANT_WIRE,
    )
    return Profile(CostModel((step_s, 0.0, 0.0, 0.0, 0.0)), blocks, block_size=16)
