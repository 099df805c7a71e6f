"""Per-request generation settings, validated once when the request arrives."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdserve.core.structured.params import StructuredOutputsParams

# The tenant of a request that names none (the router's default tenant too).
DEFAULT_TENANT = "default"

# Sample i of a request with n > 1 runs as `<request id>/<i>`, in the engine and at the router.
SAMPLE_SEPARATOR = "/"


class InvalidRequestError(ValueError):
    """Bad user input. The message starts with the offending field's name."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class DuplicateRequestError(InvalidRequestError):
    """The request id is already in flight here (ALREADY_EXISTS over gRPC)."""

    def __init__(self, request_id: str) -> None:
        super().__init__("request_id", f"{request_id!r} is already in use")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    priority: int = 0  # higher runs first under the `priority` policy
    # Who the request is for, and that tenant's weight: under the `fair` policy tenants share
    # the worker's steps in proportion to their weights (core/sched/fair_share.py). The router
    # stamps both from its --tenants file.
    tenant: str = DEFAULT_TENANT
    tenant_weight: float = 1.0
    n: int = 1  # completions of the prompt; they share its KV blocks (copy-on-write)
    # What the output must follow (vLLM's name: SamplingParams.structured_outputs).
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, minimum=1)
        _check_int("top_k", self.top_k, minimum=0)
        _check_int("priority", self.priority, minimum=None)
        _check_int("n", self.n, minimum=1)
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise InvalidRequestError("temperature", f"must be >= 0, got {self.temperature}")
        _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if any(not isinstance(text, str) or not text for text in self.stop):
            raise InvalidRequestError("stop", "every stop string must be a non-empty string")
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids", token_id, minimum=0)
        _check_structured(self.structured_outputs)
        if not isinstance(self.tenant, str) or not self.tenant:
            raise InvalidRequestError("tenant", "must be a non-empty string")
        _check_number("tenant_weight", self.tenant_weight)
        if not self.tenant_weight > 0:
            raise InvalidRequestError("tenant_weight", f"must be > 0, got {self.tenant_weight}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def for_sample(self, index: int) -> SamplingParams:
        """Sample `index` of n: n = 1 and, when seeded, the derived seed `seed + index`, so each
        sample gives exactly the tokens a single-sample request with that seed gives."""
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed)


def sample_ids(request_id: str, n: int) -> list[str]:
    """The ids of a request's n samples: itself for n = 1, else `<id>/0` .. `<id>/<n-1>`."""
    return [request_id] if n == 1 else [f"{request_id}{SAMPLE_SEPARATOR}{i}" for i in range(n)]


def _check_structured(structured: object) -> None:
    # Imported here: the structured module raises this module's InvalidRequestError.
    from pdserve.core.structured.params import StructuredOutputsParams

    if structured is not None and not isinstance(structured, StructuredOutputsParams):
        raise InvalidRequestError("structured_outputs", "must be a StructuredOutputsParams")


def _check_int(field: str, value: object, minimum: int | None) -> None:
    # bool is an int subclass; True as a max_tokens is a client bug, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(field, f"must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise InvalidRequestError(field, f"must be >= {minimum}, got {value}")


def _check_number(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(field, f"must be a number, got {type(value).__name__}")
    # NaN slips past every comparison and +inf past `>= 0`: both would reach the sampler.
    if not math.isfinite(value):
        raise InvalidRequestError(field, f"must be a finite number, got {value}")
