"""Tenants (router/tenants.py): the file's checks naming the key, who a request is for, and the
token buckets' rates."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.router.tenants import (
    DEFAULT_TENANT,
    TenantBuckets,
    TenantConfig,
    TenantConfigError,
    TenantLimits,
    load_tenants,
    parse_tenants,
    tenant_of,
)

FILE = """
default: {weight: 0.5}
tenants:
  alice: {weight: 2, requests_per_second: 2, api_keys: [sk-alice]}
  batch: {tokens_per_second: 100, burst_seconds: 2}
"""


def test_a_file_loads_with_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(FILE)
    config = load_tenants(path)
    assert config.limits("alice") == TenantLimits(weight=2.0, requests_per_second=2.0)
    assert config.weight("someone-else") == 0.5
    assert config.api_keys == {"sk-alice": "alice"}


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"tenants": {"a": {"weight": 0}}}, "tenants.a.weight"),
        ({"tenants": {"a": {"weight": "heavy"}}}, "tenants.a.weight"),
        ({"tenants": {"a": {"speed": 1}}}, "unknown keys ['speed']"),
        ({"tenants": {"a": {"api_keys": ["k"]}, "b": {"api_keys": ["k"]}}}, "tenants.b.api_keys"),
        ({"tenant": {}}, "default, header and tenants only"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key(data: object, named: str) -> None:
    with pytest.raises(TenantConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        parse_tenants(data, "t.yaml")


def test_a_request_is_for_its_key_then_its_header_then_its_certificate() -> None:
    config = parse_tenants({"tenants": {"alice": {"api_keys": ["sk-alice"]}}}, "t")
    both = [("authorization", "Bearer sk-alice"), ("x-pdserve-tenant", "bob")]
    assert tenant_of(config, both, ["carol"]) == "alice"
    assert tenant_of(config, [("authorization", "Bearer unknown")], ["carol"]) == "carol"
    assert tenant_of(config, [("X-Pdserve-Tenant", "bob")], ["carol"]) == "bob"
    assert tenant_of(config, [], []) == DEFAULT_TENANT


def test_buckets_hold_their_burst_and_refill_at_their_rate() -> None:
    now = [0.0]
    limits = TenantLimits(requests_per_second=2.0, tokens_per_second=100.0, burst_seconds=1.0)
    buckets = TenantBuckets(TenantConfig({"t": limits}), clock=lambda: now[0])
    assert buckets.wait_for("t", 50) == 0.0
    assert buckets.wait_for("t", 50) == 0.0  # the burst: 2 requests, 100 tokens
    assert buckets.wait_for("t", 50) == pytest.approx(0.5)  # both empty: tokens take longest
    now[0] = 0.5
    assert buckets.wait_for("t", 50) == 0.0
    assert buckets.wait_for("t", 500) == pytest.approx(1.0)  # more than it holds: a full bucket
    assert buckets.wait_for("unlimited", 10**6) == 0.0
