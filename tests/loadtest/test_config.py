"""ghz config parsing: ghz's keys and defaults, clear errors naming the key, the shipped configs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from pdserve.loadtest.calldata import build_messages
from pdserve.loadtest.config import (
    DurationStop,
    LoadConfigError,
    Method,
    config_from_dict,
    load_config,
    parse_go_duration,
)
from pdserve.loadtest.schedule import ArrivalSchedule, LoadSchedule
from pdserve.v1.generation_pb2 import GenerateRequest

SHIPPED_CONFIGS = sorted((Path(__file__).parents[2] / "loadtest").glob("*.json"))
BASE = {"call": "pdserve.v1.Generation.Generate", "host": "127.0.0.1:50051"}


def test_ghz_defaults() -> None:
    config = config_from_dict(BASE)
    assert (config.total, config.concurrency, config.connections) == (200, 50, 1)
    assert (config.rps, config.duration_s, config.timeout_s) == (0.0, 0.0, 20.0)
    assert config.duration_stop is DurationStop.CLOSE
    assert config.insecure is False


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("20s", 20.0), ("1m30s", 90.0), ("250ms", 0.25), ("1.5h", 5400.0), ("10us", 1e-5)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text, "duration") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["10", "ten seconds", "10s junk", ""])
def test_bad_go_duration_names_the_key(text: str) -> None:
    with pytest.raises(LoadConfigError, match=r"^timeout:"):
        config_from_dict({**BASE, "timeout": text})


@pytest.mark.parametrize(
    ("call", "method"),
    [
        ("pdserve.v1.Generation.Generate", Method.GENERATE),
        ("pdserve.v1.Generation/GenerateStream", Method.GENERATE_STREAM),
        ("pdserve.v1.Generation.Info", Method.INFO),
    ],
)
def test_both_ghz_call_spellings(call: str, method: Method) -> None:
    assert config_from_dict({**BASE, "call": call}).method is method


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"call": "pdserve.v1.Prefill.Prefill"}, "call"),
        ({"host": ""}, "host"),
        ({"concurrency": 0}, "concurrency"),
        ({"total": -1}, "total"),
        ({"rps": "fast"}, "rps"),
        ({"insecure": "yes"}, "insecure"),
        ({"load-schedule": "step"}, "load-schedule"),
        ({"concurency": 4}, "concurency"),
        ({"connections": 9, "concurrency": 4}, "connections"),
        ({"data": []}, "data"),
        ({"metadata": {"a": 1}}, "metadata"),
        ({"skipFirst": 300}, "skipFirst"),
    ],
)
def test_bad_values_name_the_key(keys: dict[str, Any], named: str) -> None:
    with pytest.raises(LoadConfigError, match=f"^{named}:"):
        config_from_dict({**BASE, **keys})


def test_data_round_robin_messages_and_bad_field() -> None:
    data = ({"prompt": "a", "sampling": {"max_tokens": 3}}, {"prompt_token_ids": {"ids": [1, 2]}})
    first, second = build_messages(Method.GENERATE, data)
    assert isinstance(first, GenerateRequest) and isinstance(second, GenerateRequest)
    assert first.prompt == "a" and first.sampling.max_tokens == 3
    assert list(second.prompt_token_ids.ids) == [1, 2]
    with pytest.raises(LoadConfigError, match=r"^data\[1\]:.*max_token"):
        build_messages(Method.GENERATE, ({"prompt": "a"}, {"sampling": {"max_token": 3}}))
    with pytest.raises(LoadConfigError, match=r"^data\[0\]: ghz call templates"):
        build_messages(Method.GENERATE, ({"request_id": "{{.RequestNumber}}"},))


def test_overrides_and_data_file(tmp_path: Path) -> None:
    data_file = tmp_path / "data.json"
    data_file.write_text(json.dumps([{"prompt": "x"}, {"prompt": "y"}]))
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({**BASE, "data-file": str(data_file), "concurrency": 2}))
    config = load_config(config_file, {"host": "10.0.0.1:1", "concurrency": 3})
    assert config.host == "10.0.0.1:1" and config.concurrency == 3
    assert [item["prompt"] for item in config.data] == ["x", "y"]


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda path: path.name)
def test_shipped_configs_target_the_router(path: Path) -> None:
    config = load_config(path)
    raw = json.loads(path.read_text())
    assert config.host == "127.0.0.1:50051" and config.insecure
    assert config.method in {Method.GENERATE, Method.GENERATE_STREAM}
    assert (Path(__file__).parents[2] / raw["proto"]).is_file()  # ghz reads it from the repo root
    assert build_messages(config.method, config.data)
    assert ("rps" in raw) == (config.rps > 0) and ("rps" in raw) == (config.duration_s > 0)


def test_shipped_configs_cover_both_calls_at_fixed_concurrency_and_rate() -> None:
    kinds = {(load_config(p).method, load_config(p).rps > 0) for p in SHIPPED_CONFIGS}
    assert kinds == {
        (m, rated) for m in (Method.GENERATE, Method.GENERATE_STREAM) for rated in (0, 1)
    }


def test_const_schedule_is_ghz_pacer() -> None:
    """ghz's ConstantPacer (load/pacer.go) sends its first call one interval after the start."""
    schedule = ArrivalSchedule(4.0)
    assert [schedule.offset(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert ArrivalSchedule(0.0).offset(7) is None  # no rate: every call at once


def test_a_poisson_window_schedule_ends_with_its_span() -> None:
    """`total` arrivals at `rps` fall within total / rps seconds (a trace's phase), scattered as
    a Poisson process's are given their count: seeded, in order, bursts and lulls."""
    config = config_from_dict({**BASE, "rps": 2, "total": 180, "load-schedule": "poisson-window"})
    schedule = ArrivalSchedule(2.0, config.load_schedule, 3, config.total)
    offsets = [schedule.offset(i) or 0.0 for i in range(180)]
    assert offsets == sorted(offsets) and offsets[0] >= 0 and offsets[-1] < 90.0
    assert offsets[-1] > 85.0 and offsets[0] < 5.0  # the span is used to its ends
    again = ArrivalSchedule(2.0, LoadSchedule.POISSON_WINDOW, 3, 180)
    assert offsets == [again.offset(i) for i in range(180)]
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert min(gaps) < 0.02 and max(gaps) > 1.5
    for missing in ({"rps": 0, "total": 10}, {"rps": 2, "total": 10, "duration": "10s"}):
        with pytest.raises(LoadConfigError, match="poisson-window"):
            config_from_dict({**BASE, **missing, "load-schedule": "poisson-window"})


def test_poisson_schedule_is_seeded_with_the_configured_mean_rate() -> None:
    config = config_from_dict({**BASE, "rps": 4, "load-schedule": "poisson"})
    assert config.load_schedule is LoadSchedule.POISSON
    first, again = (
        ArrivalSchedule(4.0, LoadSchedule.POISSON),
        ArrivalSchedule(4.0, config.load_schedule),
    )
    offsets = [first.offset(i) or 0.0 for i in range(4000)]
    assert offsets == [again.offset(i) for i in range(4000)]  # the same arrivals every run
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert 0.23 < sum(gaps) / len(gaps) < 0.27  # mean gap 1 / rps
    assert min(gaps) < 0.02 and max(gaps) > 1.0  # bursts and lulls, unlike const
    with pytest.raises(LoadConfigError, match="load-schedule"):
        config_from_dict({**BASE, "load-schedule": "step"})
