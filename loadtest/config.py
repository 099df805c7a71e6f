"""Reads ghz JSON config files (ghz's own keys and meaning) into a frozen `LoadConfig`.

ghz keys that only matter to ghz itself (proto, protoset, import-paths, format, output, cpus, ...)
are accepted and ignored: this runner uses the compiled stubs. Keys whose behaviour the runner does
not reproduce (step/line schedules, async, binary data) are refused with an error naming the key,
so a config never silently means something else here than under ghz.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from pdserve.loadtest.schedule import POISSON_SEED, LoadSchedule

IGNORED_KEYS = frozenset(
    {"proto", "protoset", "import-paths", "format", "output", "cpus", "debug", "connect-timeout"}
    | {"keepalive", "reflect-metadata", "enable-compression", "authority", "stream-interval"}
)
UNSUPPORTED_VALUES: dict[str, object] = {
    "concurrency-schedule": "const",
    "async": False,
    "binary-file": "",
}
RUNNER_KEYS = frozenset(
    {"call", "host", "data", "data-file", "metadata", "metadata-file", "insecure", "total"}
    | {"concurrency", "rps", "duration", "max-duration", "duration-stop", "timeout"}
    | {"connections", "skipFirst", "name", "tags", "cacert", "cert", "key", "cname", "skipTLS"}
    | {"load-schedule"}
)
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


class LoadConfigError(ValueError):
    """A config file that ghz or this runner would refuse; the message names the key."""


class Method(Enum):
    """The calls this runner drives, by their full gRPC method path."""

    GENERATE = "/pdserve.v1.Generation/Generate"
    GENERATE_STREAM = "/pdserve.v1.Generation/GenerateStream"
    INFO = "/pdserve.v1.Generation/Info"

    @property
    def is_stream(self) -> bool:
        return self is Method.GENERATE_STREAM


def parse_method(call: str) -> Method:
    """ghz's `call`: "pdserve.v1.Generation.Generate" or "pdserve.v1.Generation/Generate"."""
    service, _, method = call.rpartition("/") if "/" in call else call.rpartition(".")
    path = f"/{service.lstrip('/')}/{method}"
    for known in Method:
        if known.value == path:
            return known
    names = ", ".join(m.value.lstrip("/").replace("/", ".") for m in Method)
    raise LoadConfigError(f"call: {call!r} is not one of {names}")


class DurationStop(Enum):
    """ghz `duration-stop`: what happens to calls in flight when `duration` runs out."""

    CLOSE = "close"  # cancel them and count them (status Canceled)
    WAIT = "wait"  # let them finish and count them
    IGNORE = "ignore"  # cancel them and leave them out of the report


@dataclass(frozen=True)
class TlsConfig:
    """ghz TLS keys; only used when `insecure` is false."""

    cacert: str = ""
    cert: str = ""
    key: str = ""
    cname: str = ""


@dataclass(frozen=True)
class LoadConfig:
    """One load run, in ghz's terms (durations in seconds; 0 means unset / unlimited)."""

    method: Method
    host: str
    data: tuple[Mapping[str, Any], ...] = ({},)
    total: int = 200
    concurrency: int = 50
    rps: float = 0.0
    load_schedule: LoadSchedule = LoadSchedule.CONST
    # Seeds the Poisson gaps: one seed, one arrival sequence. Not a ghz key: benchmarks that repeat
    # a point set a fresh seed per repeat.
    schedule_seed: int = POISSON_SEED
    duration_s: float = 0.0
    max_duration_s: float = 0.0
    duration_stop: DurationStop = DurationStop.CLOSE
    timeout_s: float = 20.0
    connections: int = 1
    insecure: bool = False
    tls: TlsConfig = field(default_factory=TlsConfig)
    metadata: tuple[tuple[str, str], ...] = ()
    skip_first: int = 0
    name: str = ""
    tags: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        _check_counts(self)


def _check_counts(config: LoadConfig) -> None:
    for key, value in (("concurrency", config.concurrency), ("connections", config.connections)):
        if value < 1:
            raise LoadConfigError(f"{key}: must be >= 1, got {value}")
    for key, number in (("rps", config.rps), ("timeout", config.timeout_s)):
        if number < 0:
            raise LoadConfigError(f"{key}: must be >= 0, got {number}")
    if config.duration_s == 0 and config.skip_first > config.total:
        raise LoadConfigError(f"skipFirst: cannot skip more than total ({config.total}) calls")
    if config.connections > config.concurrency:
        raise LoadConfigError("connections: must be <= concurrency")
    counted = config.rps > 0 and config.total > 0 and config.duration_s == 0
    if config.load_schedule is LoadSchedule.POISSON_WINDOW and not counted:
        raise LoadConfigError('load-schedule: "poisson-window" needs rps and total, no duration')
    if not config.host:
        raise LoadConfigError("host: missing (set it in the config or pass --host)")


def parse_go_duration(text: object, key: str) -> float:
    """Seconds in a Go duration string ("20s", "1m30s", "250ms", "0"), as ghz reads it."""
    if not isinstance(text, str):
        raise LoadConfigError(f'{key}: must be a Go duration string like "10s", got {text!r}')
    if text.strip() == "0":
        return 0.0
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text.strip():
        raise LoadConfigError(f'{key}: not a Go duration ("10s", "1m30s", "250ms"): {text!r}')
    return sum(float(number) * _GO_UNIT_SECONDS[unit] for number, unit in parts)


def load_config(path: Path, overrides: Mapping[str, Any] | None = None) -> LoadConfig:
    """Parse and check a ghz JSON config file, with `overrides` (ghz keys) on top, as ghz merges
    command-line flags over a config file. Relative data/metadata files resolve from the CWD."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise LoadConfigError(f"{path}: cannot read a JSON config: {error}") from error
    if not isinstance(raw, dict):
        raise LoadConfigError(f"{path}: the config must be a JSON object")
    return config_from_dict({**raw, **(overrides or {})})


def config_from_dict(raw: Mapping[str, Any]) -> LoadConfig:
    _check_keys(raw)
    return LoadConfig(
        method=parse_method(_string(raw, "call", "")),
        host=_string(raw, "host", ""),
        data=_call_data(raw),
        total=_count(raw, "total", 200),
        concurrency=_count(raw, "concurrency", 50),
        rps=float(_count(raw, "rps", 0)),
        load_schedule=_load_schedule(raw),
        duration_s=parse_go_duration(raw.get("duration", "0"), "duration"),
        max_duration_s=parse_go_duration(raw.get("max-duration", "0"), "max-duration"),
        duration_stop=_duration_stop(raw),
        timeout_s=parse_go_duration(raw.get("timeout", "20s"), "timeout"),
        connections=_count(raw, "connections", 1),
        insecure=_flag(raw, "insecure"),
        tls=_tls(raw),
        metadata=_string_pairs(raw, "metadata"),
        skip_first=_count(raw, "skipFirst", 0),
        name=_string(raw, "name", ""),
        tags=_string_pairs(raw, "tags"),
    )


def _check_keys(raw: Mapping[str, Any]) -> None:
    for key, value in raw.items():
        if key in UNSUPPORTED_VALUES:
            if value != UNSUPPORTED_VALUES[key]:
                raise LoadConfigError(f"{key}: {value!r} is not supported by pdserve loadtest")
        elif key not in RUNNER_KEYS and key not in IGNORED_KEYS:
            raise LoadConfigError(f"{key}: not a ghz config key")
    if _flag(raw, "skipTLS"):
        raise LoadConfigError("skipTLS: not supported (grpc Python always verifies TLS)")


def _string(raw: Mapping[str, Any], key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise LoadConfigError(f"{key}: must be a string, got {value!r}")
    return value


def _count(raw: Mapping[str, Any], key: str, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LoadConfigError(f"{key}: must be a whole number >= 0, got {value!r}")
    return value


def _flag(raw: Mapping[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise LoadConfigError(f"{key}: must be true or false, got {value!r}")
    return value


def _duration_stop(raw: Mapping[str, Any]) -> DurationStop:
    # ghz lower-cases the value and falls back to "close" for anything unknown.
    text = _string(raw, "duration-stop", "close").lower()
    return (
        DurationStop(text) if text in {stop.value for stop in DurationStop} else DurationStop.CLOSE
    )


def _load_schedule(raw: Mapping[str, Any]) -> LoadSchedule:
    """ghz's "const" (its step and line schedules are not reproduced) or pdserve's "poisson" and
    "poisson-window" (the latter a count of requests at a rate: `total` and `rps`, no duration)."""
    text = _string(raw, "load-schedule", "const")
    if text not in {schedule.value for schedule in LoadSchedule}:
        choices = ", ".join(f'"{schedule.value}"' for schedule in LoadSchedule)
        raise LoadConfigError(f"load-schedule: one of {choices}, got {text!r}")
    return LoadSchedule(text)


def _tls(raw: Mapping[str, Any]) -> TlsConfig:
    return TlsConfig(*(_string(raw, key, "") for key in ("cacert", "cert", "key", "cname")))


def _string_pairs(raw: Mapping[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    value = raw.get(key)
    if value is None and f"{key}-file" in raw:
        value = _read_json_file(_string(raw, f"{key}-file", ""), f"{key}-file")
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise LoadConfigError(f"{key}: must be an object of string values, got {value!r}")
    return tuple(sorted(value.items()))


def _call_data(raw: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    value = raw.get("data")
    if value is None and "data-file" in raw:
        value = _read_json_file(_string(raw, "data-file", ""), "data-file")
    if value is None:
        return ({},)
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, dict) for item in items):
        raise LoadConfigError("data: must be an object or a non-empty array of objects")
    return tuple(items)


def _read_json_file(path: str, key: str) -> object:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise LoadConfigError(f"{key}: cannot read JSON from {path!r}: {error}") from error
