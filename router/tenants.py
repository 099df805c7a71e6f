"""Tenants: who a request is for, their weights and rate limits (`--tenants FILE`,
docs/admission.md "Tenants").

A request's tenant comes from its metadata, first match wins: an API key the file names
(`authorization: Bearer KEY`, what OpenAI clients send), the tenant header (`x-pdserve-tenant`,
a name the file may or may not list), the name on the client's certificate under mTLS (gRPC door
only: the HTTP server does not hand it over), else `default`. A tenant the file does not list
gets the `default` entry's limits under its own name.

Each tenant has a weight (its share of the router's `--max-queue` places when they run short:
router/places.py) and optional token buckets: requests per second and tokens per second (prompt
plus `max_tokens`, what a request may cost), each holding `burst_seconds` of its rate. A request
past a bucket is refused at once (RESOURCE_EXHAUSTED, retried after the bucket refills enough)
and takes nothing from the other bucket.

    default: {weight: 1}
    header: x-pdserve-tenant
    tenants:
      alice: {weight: 2, requests_per_second: 5, tokens_per_second: 4000, api_keys: [sk-alice]}
      batch: {weight: 0.5, tokens_per_second: 1000, burst_seconds: 10}
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pdserve.core.sampling_params import DEFAULT_TENANT

TENANT_HEADER = "x-pdserve-tenant"
MAX_TENANT_NAME = 64


class TenantConfigError(ValueError):
    """A tenants file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class TenantLimits:
    weight: float = 1.0
    requests_per_second: float | None = None  # None: no bucket
    tokens_per_second: float | None = None
    burst_seconds: float = 1.0  # each bucket holds this many seconds of its rate


@dataclass(frozen=True)
class TenantConfig:
    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)
    default: TenantLimits = TenantLimits()
    header: str = TENANT_HEADER
    api_keys: Mapping[str, str] = field(default_factory=dict)  # key -> tenant

    def limits(self, tenant: str) -> TenantLimits:
        return self.tenants.get(tenant, self.default)

    def weight(self, tenant: str) -> float:
        return self.limits(tenant).weight


def load_tenants(path: Path) -> TenantConfig:
    """Reads and checks a tenants file (YAML)."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise TenantConfigError(f"--tenants: cannot read {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise TenantConfigError(f"--tenants: {path} is not YAML: {error}") from error
    return parse_tenants(data or {}, str(path))


def parse_tenants(data: object, source: str) -> TenantConfig:
    if not isinstance(data, dict) or set(data) - {"default", "header", "tenants"}:
        raise TenantConfigError(f"--tenants: {source} holds default, header and tenants only")
    entries = data.get("tenants") or {}
    if not isinstance(entries, dict):
        raise TenantConfigError(f"--tenants: {source}: tenants must map names to limits")
    tenants, api_keys = {}, {}
    for name, entry in entries.items():
        where = f"{source}: tenants.{name}"
        if not isinstance(name, str) or not 0 < len(name) <= MAX_TENANT_NAME:
            raise TenantConfigError(f"--tenants: {where}: a name of 1-{MAX_TENANT_NAME} chars")
        keys = entry.pop("api_keys", []) if isinstance(entry, dict) else []
        tenants[name] = _limits(entry, where)
        for key in keys if isinstance(keys, list) else [keys]:
            if not isinstance(key, str) or not key or key in api_keys:
                raise TenantConfigError(f"--tenants: {where}.api_keys: distinct non-empty strings")
            api_keys[key] = name
    header = data.get("header", TENANT_HEADER)
    if not isinstance(header, str) or not header:
        raise TenantConfigError(f"--tenants: {source}: header must be a header name")
    default = _limits(data.get("default") or {}, f"{source}: default")
    return TenantConfig(tenants, default, header.lower(), api_keys)


def _limits(entry: object, where: str) -> TenantLimits:
    if not isinstance(entry, dict):
        raise TenantConfigError(f"--tenants: {where} must be a mapping")
    known = {"weight", "requests_per_second", "tokens_per_second", "burst_seconds"}
    if set(entry) - known:
        raise TenantConfigError(f"--tenants: {where}: unknown keys {sorted(set(entry) - known)}")
    values: dict[str, Any] = {}
    for key, value in entry.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TenantConfigError(f"--tenants: {where}.{key} must be a number")
        if not (math.isfinite(value) and value > 0):
            raise TenantConfigError(f"--tenants: {where}.{key} must be > 0, got {value}")
        values[key] = float(value)
    return TenantLimits(**values)


def tenant_of(
    config: TenantConfig, metadata: Iterable[tuple[str, str | bytes]], cert_names: Sequence[str]
) -> str:
    """The request's tenant (module docstring: key, header, certificate name, default)."""
    headers = {key.lower(): value for key, value in metadata if isinstance(value, str)}
    scheme, _, key = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip() in config.api_keys:
        return config.api_keys[key.strip()]
    named = headers.get(config.header, "").strip()
    if named and len(named) <= MAX_TENANT_NAME:
        return named
    return next((name for name in cert_names if name), DEFAULT_TENANT)


class TokenBucket:
    """`rate` per second, holding at most `capacity`; starts full."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self._level = capacity
        self._updated = now

    def level(self, now: float) -> float:
        self._level = min(self.capacity, self._level + (now - self._updated) * self.rate)
        self._updated = now
        return self._level

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until `amount` is there (0: now). More than the capacity never is: the
        wait for a full bucket then, so a huge request is not refused forever."""
        missing = min(amount, self.capacity) - self.level(now)
        return max(missing, 0.0) / self.rate

    def take(self, amount: float, now: float) -> None:
        self._level = self.level(now) - min(amount, self.capacity)


class TenantBuckets:
    """Each tenant's request and token buckets, made on first use."""

    def __init__(self, config: TenantConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        # Per tenant: (bucket, whether it counts tokens; else requests).
        self._buckets: dict[str, list[tuple[TokenBucket, bool]]] = {}

    def wait_for(self, tenant: str, tokens: int) -> float:
        """Seconds the tenant must wait before this request fits its buckets; 0: taken now."""
        now = self._clock()
        buckets = self._buckets.get(tenant)
        if buckets is None:
            buckets = self._buckets[tenant] = self._new_buckets(tenant, now)
        costs = [
            (bucket, float(tokens) if counts_tokens else 1.0) for bucket, counts_tokens in buckets
        ]
        wait = max((bucket.wait_for(amount, now) for bucket, amount in costs), default=0.0)
        if wait == 0.0:
            for bucket, amount in costs:
                bucket.take(amount, now)
        return wait

    def _new_buckets(self, tenant: str, now: float) -> list[tuple[TokenBucket, bool]]:
        limits = self.config.limits(tenant)
        rates = ((limits.requests_per_second, False), (limits.tokens_per_second, True))
        return [
            (TokenBucket(rate, rate * limits.burst_seconds, now), counts_tokens)
            for rate, counts_tokens in rates
            if rate is not None
        ]
