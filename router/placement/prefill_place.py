"""Where a request's prompt is prefilled: on the prefill tier (disaggregated) or on the decode
worker that will generate it (colocated), decided per request, as Dynamo's and llm-d's routers do.

    no healthy prefill worker              -> local  (nothing else can serve it)
    --disagg-threshold 0                   -> remote (always disaggregated)
    prompt shorter than the threshold      -> local  (its prefill is cheaper than the hand-off,
                                                      and stalls decode's batch only briefly)
    prefill tier saturated                 -> local  (waiting there would cost more TTFT)
    otherwise                              -> remote

A huge threshold makes every prompt local: a colocated deployment with the same binaries.

That is `--placement threshold` (the default). `--placement adaptive` chooses by predicting each
option's cost with the profiled cost model instead (adaptive_placement.py); its reasons are the
members after LONG_PROMPT.

`PlacementConfig` holds the rule's settings, with the router's defaults: the router builds it
from `--placement`, `--disagg-threshold` and `--max-prefill-queue`, the planner's simulator places
with it, and `pdserve plan` writes it into the chart's values, which hand it to the router as
those flags.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PrefillPlace(enum.Enum):
    LOCAL = "local"  # the decode worker prefills it (Decode.GenerateLocal)
    REMOTE = "remote"  # the prefill tier prefills it and ships the KV over UCX


class PlacementReason(enum.Enum):
    NO_PREFILL_WORKER = "no_prefill_worker"
    ALWAYS_REMOTE = "always_remote"
    SHORT_PROMPT = "short_prompt"
    PREFILL_SATURATED = "prefill_saturated"
    LONG_PROMPT = "long_prompt"
    # --placement adaptive (adaptive_placement.py): what decided the cheapest option.
    LOCAL_CHEAPER = "local_cheaper"  # prefilling on its decode worker costs least
    REMOTE_FASTER = "remote_faster"  # the prefill tier gives it the earliest first token
    SPARES_STREAMS = "spares_streams"  # local would be sooner, but stall the streams running there
    PREFILL_IDLE = "prefill_idle"  # end to end on an idle prefill worker, now lent to decode
    LENT_PREFILL_WORKER = "lent_prefill_worker"  # end to end on a prefill worker already lent


class PlacementMode(enum.Enum):
    """`--placement`: the threshold rule (below), or the cost model (adaptive_placement.py)."""

    THRESHOLD = "threshold"
    ADAPTIVE = "adaptive"


@dataclass(frozen=True)
class Placement:
    place: PrefillPlace
    reason: PlacementReason


@dataclass(frozen=True)
class PlacementConfig:
    # Prompts shorter than this many tokens are prefilled on their decode worker; 0 = always on
    # the prefill tier (when it has a healthy worker).
    disagg_threshold: int = 0
    # Prefill calls in flight per healthy prefill worker at which the tier counts as saturated
    # and long prompts too are prefilled locally (with a threshold > 0); 0 = never saturated.
    max_prefill_queue: int = 4
    # ADAPTIVE ignores the two above: the cost model decides.
    mode: PlacementMode = PlacementMode.THRESHOLD

    def __post_init__(self) -> None:
        for name in ("disagg_threshold", "max_prefill_queue"):
            if getattr(self, name) < 0:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag}: must be >= 0, got {getattr(self, name)}")

    def router_flags(self) -> tuple[str, ...]:
        """The router's flags for this placement (what the chart and the planner's runs pass)."""
        threshold, queue = str(self.disagg_threshold), str(self.max_prefill_queue)
        return (
            "--placement",
            self.mode.value,
            "--disagg-threshold",
            threshold,
            "--max-prefill-queue",
            queue,
        )


@dataclass(frozen=True)
class PrefillTierState:
    """What the router knows of the prefill tier at the moment of the decision."""

    healthy_workers: int
    in_flight: int  # Prefill calls this router has sent and not seen answered


def place_prefill(
    prompt_tokens: int, threshold: int, max_queue_per_worker: int, tier: PrefillTierState
) -> Placement:
    """The rule in the module docstring; `max_queue_per_worker` 0 means never saturated."""
    if tier.healthy_workers == 0:
        return Placement(PrefillPlace.LOCAL, PlacementReason.NO_PREFILL_WORKER)
    if threshold == 0:
        return Placement(PrefillPlace.REMOTE, PlacementReason.ALWAYS_REMOTE)
    if prompt_tokens < threshold:
        return Placement(PrefillPlace.LOCAL, PlacementReason.SHORT_PROMPT)
    saturated_at = max_queue_per_worker * tier.healthy_workers
    if max_queue_per_worker and tier.in_flight >= saturated_at:
        return Placement(PrefillPlace.LOCAL, PlacementReason.PREFILL_SATURATED)
    return Placement(PrefillPlace.REMOTE, PlacementReason.LONG_PROMPT)
