"""The measured cost model: what one engine step costs, as a function of what it runs.

A step's cost is predicted from five features of its plan (`StepShape`) by a linear model fitted
with least squares, constrained to non-negative coefficients:

    seconds = fixed + per_prefill_token * prefill_tokens + per_attended_pair * prefill_pairs
              + per_decode_seq * decode_seqs + per_context_token * decode_context

Why linear in these: on this engine a step is a fixed cost (Python, scheduling, sampling setup),
GEMMs whose cost grows with the tokens in the batch (prompt tokens, and one per decoding sequence),
and attention, which reads every earlier token: `decode_context` tokens for the decodes and
`new * (start + new)` query-key pairs for a prefill chunk. Vidur fits random forests per operator;
a forest cannot extrapolate past the profiled grid (a planner asks about bigger batches than the
profile ran) and five coefficients can be read and checked by hand.

On a CPU the fit is made on each step's thread CPU time, not its wall time: on a shared machine
the wall time of the same step swings with what else runs on the core, and those swings would
drown the differences between shapes. The profile keeps the median wall / CPU ratio of its steps
(`contention`: 1.0 on a quiet core) and predictions are the CPU-time model times that ratio. On a
GPU, where the host thread's CPU time says nothing about the kernels, the fit is on wall time and
`contention` is 1.

Block copies are priced per block: swap (device <-> CPU pool, on the engine thread) and KV
transfer (gather into the staging buffer on prefill's thread, the wire, scatter on decode).

A serving worker pays more per step than the offline `engine.step()` the model is fitted on: each
token goes through a sink into the asyncio loop and a gRPC stream on the same core, each request
through Reserve / Prefill / Generate calls and the router. `ServingCosts` holds those, measured
in a separate run through real workers (`pdserve profile --serving`, serving_calibration.py): a
cost per step and per streamed token added to every step, and a dispatch latency added to every
request's way in. Without that run they are zero.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pdserve.costmodel.host import HostFingerprint, warn_if_foreign
from pdserve.costmodel.step_shape import StepShape

PROFILE_VERSION = 1
FEATURES = ("fixed", "prefill_tokens", "prefill_pairs", "decode_seqs", "decode_context")


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the field."""


@dataclass(frozen=True)
class StepSample:
    scenario: str
    shape: StepShape
    seconds: float  # wall time
    cpu_seconds: float  # the engine thread's CPU time


@dataclass(frozen=True)
class BlockCosts:
    """Seconds per KV block (plus the wire's bandwidth) for copies outside the forward."""

    block_nbytes: int
    swap_s: float  # one block, device -> CPU pool or back
    gather_s: float  # prefill: one block into the staging buffer (blocks the prefill step)
    scatter_s: float  # decode: one block from the staging buffer into the cache
    wire_bytes_per_s: float  # documented, not measured here (see docs/planning.md)

    def delivery_s(self, num_blocks: int) -> float:
        """Wire + scatter of a prompt's blocks, after prefill's step gathered them."""
        return num_blocks * (self.block_nbytes / self.wire_bytes_per_s + self.scatter_s)


@dataclass(frozen=True)
class ServingCosts:
    """What serving adds to the offline step model (zeros: not calibrated)."""

    per_step_s: float = 0.0  # the loop turn around a step: polls, deltas handed to asyncio
    per_token_s: float = 0.0  # one streamed token: sink, gRPC message, router relay
    dispatch_s: float = 0.0  # router -> worker calls before a request can be scheduled
    calibration: Mapping[str, Any] = field(default_factory=dict)  # how they were measured

    def step_overhead(self, shape: StepShape) -> float:
        return self.per_step_s + self.per_token_s * shape.decode_seqs


@dataclass(frozen=True)
class CostModel:
    coefficients: tuple[float, ...]  # one per FEATURES entry, seconds per unit

    def step_seconds(self, shape: StepShape) -> float:
        return float(sum(c * x for c, x in zip(self.coefficients, shape.vector(), strict=True)))


@dataclass(frozen=True)
class Profile:
    model: CostModel
    blocks: BlockCosts
    block_size: int
    environment: Mapping[str, str] = field(default_factory=dict)  # device, dtype, model, torch
    samples: tuple[StepSample, ...] = ()
    contention: float = 1.0  # median wall / CPU time of the profiled steps (CPU fits only)
    serving: ServingCosts = field(default_factory=ServingCosts)
    host: HostFingerprint | None = None  # None: a profile made before fingerprints
    version: int = PROFILE_VERSION

    def offline_step_seconds(self, shape: StepShape) -> float:
        """What `engine.step()` alone takes (the fitted model, at the profile's contention)."""
        return self.model.step_seconds(shape) * self.contention

    def step_seconds(self, shape: StepShape, swapped_blocks: int = 0) -> float:
        """A serving worker's step: the offline step, its swaps, and what serving adds."""
        swaps = swapped_blocks * self.blocks.swap_s
        return self.offline_step_seconds(shape) + swaps + self.serving.step_overhead(shape)

    def save(self, path: Path) -> None:
        document = {
            "version": self.version,
            "environment": dict(self.environment),
            "host": None if self.host is None else self.host.to_json(),
            "block_size": self.block_size,
            "fitted": {
                "features": list(FEATURES),
                "coefficients": list(self.model.coefficients),
                "clock": "cpu" if self.contention != 1.0 else "wall",
                "contention": self.contention,
                "r2_wall": fit_r2(self, self.samples),
            },
            "blocks": asdict(self.blocks),
            "serving": asdict(self.serving),
            "samples": [
                {
                    "scenario": s.scenario,
                    **asdict(s.shape),
                    "seconds": s.seconds,
                    "cpu_seconds": s.cpu_seconds,
                }
                for s in self.samples
            ],
        }
        path.write_text(json.dumps(document, indent=1) + "\n")


def fit(samples: Sequence[StepSample], cpu_clock: bool) -> CostModel:
    """Least squares on relative error (rows weighted by 1 / seconds: a 100 ms decode step off by
    50 ms matters as much as a 10 s prefill off by 5 s), every coefficient >= 0: a feature whose
    fitted weight is negative is dropped and the rest refitted (more work never costs less)."""
    if len(samples) < len(FEATURES):
        raise ProfileError(f"samples: need at least {len(FEATURES)} to fit, got {len(samples)}")
    target = [s.cpu_seconds if cpu_clock else s.seconds for s in samples]
    weights = np.array([1.0 / seconds for seconds in target])
    x = np.array([s.shape.vector() for s in samples]) * weights[:, None]
    y = np.ones(len(samples))  # seconds * weight
    active = list(range(len(FEATURES)))
    while True:
        solution, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [i for i, c in zip(active, solution, strict=True) if c < 0]
        if not negative:
            break
        active.remove(negative[0])
    coefficients = [0.0] * len(FEATURES)
    for index, value in zip(active, solution, strict=True):
        coefficients[index] = float(value)
    return CostModel(tuple(coefficients))


def contention_of(samples: Sequence[StepSample]) -> float:
    return float(np.median([s.seconds / s.cpu_seconds for s in samples if s.cpu_seconds > 0]))


def fit_r2(profile: Profile, samples: Sequence[StepSample]) -> float | None:
    """R^2 of the profile's predictions against the wall times it was fitted from."""
    if len(samples) < 2:
        return None
    y = np.array([s.seconds for s in samples])
    predicted = np.array([profile.offline_step_seconds(s.shape) for s in samples])
    total = float(((y - y.mean()) ** 2).sum())
    return None if total == 0 else 1.0 - float(((y - predicted) ** 2).sum()) / total


def load_profile(path: Path) -> Profile:
    """The profile at `path`; warns (once) when it was measured on another host."""
    try:
        document = json.loads(path.read_text())
    except OSError as error:
        raise ProfileError(f"profile: cannot read {path}: {error.strerror}") from error
    except json.JSONDecodeError as error:
        raise ProfileError(f"profile: {path} is not valid JSON: {error.msg}") from error
    profile = parse_profile(document)
    warn_if_foreign(profile.host, f"profile {path}")
    return profile


def parse_profile(document: Any) -> Profile:
    if not isinstance(document, dict):
        raise ProfileError("profile: must be a JSON object")
    if document.get("version") != PROFILE_VERSION:
        raise ProfileError(f"version: expected {PROFILE_VERSION}, got {document.get('version')!r}")
    try:
        fitted = document["fitted"]
        if list(fitted["features"]) != list(FEATURES):
            raise ProfileError(f"fitted.features: expected {list(FEATURES)}")
        model = CostModel(tuple(float(c) for c in fitted["coefficients"]))
        blocks = BlockCosts(**document["blocks"])
        samples = tuple(
            StepSample(
                s["scenario"],
                StepShape(**{k: s[k] for k in StepShape.__dataclass_fields__}),
                s["seconds"],
                s["cpu_seconds"],
            )
            for s in document.get("samples", [])
        )
        contention = float(fitted.get("contention", 1.0))
        block_size = int(document["block_size"])
        serving = ServingCosts(**document.get("serving", {}))
        host = document.get("host")
        return Profile(
            model,
            blocks,
            block_size,
            document["environment"],
            samples,
            contention,
            serving,
            None if host is None else HostFingerprint.from_json(host),
        )
    except (KeyError, TypeError) as error:
        raise ProfileError(f"profile: missing or malformed field {error}") from error
