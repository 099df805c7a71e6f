"""The router's settings, built once from flags (see `pdserve.router.main`) and passed down."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pdserve.core.serving.keepalive import Keepalive
from pdserve.core.serving.server import DEFAULT_MAX_MESSAGE_BYTES
from pdserve.core.serving.tls import ChannelTls
from pdserve.costmodel.step_budget import StepCosts
from pdserve.router.placement.prefill_place import PlacementConfig, PlacementMode
from pdserve.router.placement.worker_choice import RoutingPolicy
from pdserve.router.tenants import TenantConfig

_PLACEMENT_DEFAULTS = PlacementConfig()


class RelayMode(enum.Enum):
    """How decode's tokens reach the router (docs/router.md, "The decode stream")."""

    # Decode.Multiplex: one stream per decode worker, one message per engine step.
    MULTIPLEXED = "multiplexed"
    # Decode.Generate / GenerateLocal: one stream per request, one message per token.
    PER_REQUEST = "per-request"


class Tier(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class RequestCaps:
    """What one request may ask for (router flags); None: up to the model's own context."""

    max_prompt_tokens: int | None = None
    max_tokens: int | None = None
    max_stop_strings: int = 16  # stop strings, and stop token ids, per request
    max_stop_string_chars: int = 256

    def __post_init__(self) -> None:
        for name in (
            "max_prompt_tokens",
            "max_tokens",
            "max_stop_strings",
            "max_stop_string_chars",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{_flag(name)}: must be >= 1, got {value}")


@dataclass(frozen=True)
class RouterConfig:
    # `host:port,...` or `dns:///NAME:PORT`, one per tier.
    prefill_targets: str
    decode_targets: str
    resolve_interval_seconds: float = 5.0
    # Requests in flight in the router before new ones get RESOURCE_EXHAUSTED.
    max_queue: int = 256
    # Reserve + Prefill tries per request before the last failure goes to the client.
    max_attempts: int = 3
    load_poll_interval_seconds: float = 0.5
    load_timeout_seconds: float = 1.0
    # A step is bounded by the token budget (a second or two on a CPU); a decode worker whose
    # Load reports one running this long is wedged, and its streams fail over (0: never).
    engine_stall_seconds: float = 60.0
    # Best-effort Decode.Abort after a cancel, deadline or failure must not hold anything up.
    abort_timeout_seconds: float = 1.0
    # Decode.Abort is retried (each try with twice the time) until it answers or this many fail.
    abort_attempts: int = 5
    caps: RequestCaps = field(default_factory=RequestCaps)
    # Reported by Info until a decode worker's reservation tells the real one.
    block_size: int = 16
    # Where prompts are prefilled: the two settings of `placement.PlacementConfig` (see
    # `placement`), flat here because each is a flag of its own.
    disagg_threshold: int = _PLACEMENT_DEFAULTS.disagg_threshold
    max_prefill_queue: int = _PLACEMENT_DEFAULTS.max_prefill_queue
    placement_mode: PlacementMode = _PLACEMENT_DEFAULTS.mode
    # The workers' cost model (from --profile, with their chunk budget and --itl-slo): what
    # --placement adaptive predicts with; None without --profile.
    costs: StepCosts | None = None
    # How a worker is chosen in each tier: least loaded, or the one whose recent prompts share
    # the most leading blocks with this one, within a load bound (`prefix_choice` in
    # placement/worker_choice.py).
    routing_policy: RoutingPolicy = RoutingPolicy.LEAST_LOADED
    # --routing-policy prefix-hash: the leading full blocks a prompt is keyed by (prefix_hash.py).
    prefix_hash_blocks: int = 4
    relay: RelayMode = RelayMode.MULTIPLEXED
    # Times one request may move to another decode worker after losing its own.
    max_migrations: int = 3
    # The router's channels to the workers: TLS/mTLS settings (None: plaintext), message bound.
    worker_tls: ChannelTls | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    keepalive: Keepalive = field(default_factory=Keepalive)
    # The OpenAI-compatible HTTP door (router/http/); 0 turns it off.
    http_port: int = 8000
    # Its requests' deadline (0: none): OpenAI's API carries none, and a client that vanished
    # without closing its connection would otherwise hold its streams until max_tokens.
    http_request_timeout_seconds: float = 600.0
    # Every request's SLOs unless it sets its own (None: none): a request predicted to miss one
    # is refused at once (router/slo_admission.py). Needs the cost model (`costs`).
    slo_ttft_seconds: float | None = None
    slo_tpot_seconds: float | None = None
    # Who requests are for, their weights and rate limits (--tenants; router/tenants.py).
    tenants: TenantConfig = field(default_factory=TenantConfig)

    def __post_init__(self) -> None:
        for name in (
            "max_queue",
            "max_attempts",
            "abort_attempts",
            "block_size",
            "prefix_hash_blocks",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{_flag(name)}: must be >= 1, got {getattr(self, name)}")
        for name in (
            "resolve_interval_seconds",
            "load_poll_interval_seconds",
            "load_timeout_seconds",
            "abort_timeout_seconds",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{_flag(name)}: must be > 0, got {getattr(self, name)}")
        if self.engine_stall_seconds < 0:
            raise ValueError(
                f"--engine-stall-seconds: must be >= 0 (0: never), got {self.engine_stall_seconds}"
            )
        if self.max_migrations < 0:
            raise ValueError(f"--max-migrations: must be >= 0, got {self.max_migrations}")
        PlacementConfig(self.disagg_threshold, self.max_prefill_queue)  # checks both flags
        if self.placement_mode is PlacementMode.ADAPTIVE and self.costs is None:
            raise ValueError("--placement adaptive: needs --profile (a `pdserve profile` file)")
        for name in ("slo_ttft_seconds", "slo_tpot_seconds"):
            value = getattr(self, name)
            flag = "--" + name.removesuffix("_seconds").replace("_", "-")
            if value is not None and not value > 0:
                raise ValueError(f"{flag}: must be > 0 seconds, got {value}")
            if value is not None and self.costs is None:
                raise ValueError(f"{flag}: needs --profile (the cost model that predicts it)")
        if self.http_request_timeout_seconds < 0:
            raise ValueError(
                "--http-request-timeout-seconds: must be >= 0, got "
                f"{self.http_request_timeout_seconds}"
            )
        if not 0 <= self.http_port <= 65535:
            raise ValueError(f"--http-port: must be in [0, 65535], got {self.http_port}")

    @property
    def placement(self) -> PlacementConfig:
        return PlacementConfig(self.disagg_threshold, self.max_prefill_queue, self.placement_mode)


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")
