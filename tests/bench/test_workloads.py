"""The shipped workloads have the shapes the benchmark issue states, and are reproducible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdserve import cli
from pdserve.bench.offline.workload import (
    WORKLOAD_DIR,
    WorkloadError,
    load_workload,
    parse_workload,
)

VOCAB = 49152  # SmolLM2's


def test_mixed_has_64_requests_with_uniform_ranges() -> None:
    requests = load_workload(WORKLOAD_DIR / "mixed.json")
    assert len(requests) == 64
    prompt_lens = [len(r.prompt) for r in requests]
    max_tokens = [r.max_tokens for r in requests]
    assert min(prompt_lens) >= 10 and max(prompt_lens) <= 100
    assert min(max_tokens) >= 20 and max(max_tokens) <= 200
    # Spread over the range, not bunched: what makes static batching waste slots.
    assert max(prompt_lens) - min(prompt_lens) > 60
    assert max(max_tokens) - min(max_tokens) > 120
    assert all(0 <= t < VOCAB for r in requests for t in r.prompt)


def test_uniform_has_64_requests_of_64_prompt_and_100_output_tokens() -> None:
    requests = load_workload(WORKLOAD_DIR / "uniform.json")
    assert len(requests) == 64
    assert {len(r.prompt) for r in requests} == {64}
    assert {r.max_tokens for r in requests} == {100}
    assert all(0 <= t < VOCAB for r in requests for t in r.prompt)


def test_generator_reproduces_the_shipped_files(tmp_path: Path) -> None:
    assert cli.main(["bench", "make-workloads", "--out", str(tmp_path)]) == 0
    for name in ("mixed.json", "uniform.json"):
        assert (tmp_path / name).read_bytes() == (WORKLOAD_DIR / name).read_bytes()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([], "workload"),
        ([{"prompt": [], "max_tokens": 3}], "prompt"),
        ([{"prompt": [1, "a"], "max_tokens": 3}], "prompt"),
        ([{"prompt": [1, 2], "max_tokens": 0}], "max_tokens"),
        ([{"prompt": [1, 2]}], "max_tokens"),
        ([[1, 2]], "workload"),
    ],
)
def test_bad_workload_names_the_field(data: object, field: str) -> None:
    with pytest.raises(WorkloadError, match=rf"^{field}:"):
        parse_workload(json.loads(json.dumps(data)), "test")


def test_unreadable_file_is_a_workload_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"^workload:"):
        load_workload(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(WorkloadError, match=r"^workload:.*not valid JSON"):
        load_workload(tmp_path / "bad.json")


def test_disagg_spec_ranges_parse_and_bad_ones_name_the_field() -> None:
    from pdserve.bench.disagg.workload import DEFAULT_SPEC, parse_spec, plan_requests

    classes = parse_spec(DEFAULT_SPEC)
    assert [c.name for c in classes] == ["chat", "long"]
    for request in plan_requests(classes, 20, vocab_size=1000, seed="ranges"):
        assert 20 <= len(request.call_data()["prompt_token_ids"]["ids"]) <= 3000
    bad = {
        "classes": [{"prompt_tokens": {"min": 5, "max": 2}, "output_tokens": {"min": 1, "max": 1}}]
    }
    with pytest.raises(ValueError, match=r"classes\[0\]\.prompt_tokens"):
        parse_spec(bad)
