"""`pdserve bench offline --profile`: the parts add up to the step, and what each part must move
and compute is counted right (checked against the model's shapes and by hand)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pdserve.bench.offline.bounds import HostBounds
from pdserve.bench.offline.part_costs import prefill_attention_work
from pdserve.bench.offline.profile_report import (
    PARTS,
    StepGroup,
    exclusive_parts,
    profile_report,
    profile_workload,
    step_seconds,
)
from pdserve.bench.offline.workload import WorkloadRequest
from pdserve.cli import main
from pdserve.core.model.config import load_model_config

PROMPT = tuple(range(400, 430))  # 30 tokens: two blocks of 16
DECODE_STEPS = 5


@pytest.fixture(scope="module")
def one_request(model_dir: Path) -> list[StepGroup]:
    return profile_workload(model_dir, [WorkloadRequest(PROMPT, DECODE_STEPS + 1)], max_batch=1)


def test_the_parts_add_up_to_the_step(one_request: list[StepGroup]) -> None:
    everything, decode_only, with_prefill = one_request
    assert len(with_prefill.steps) == 1 and len(decode_only.steps) == DECODE_STEPS
    for step in everything.steps:
        assert math.isclose(sum(exclusive_parts(step).values()), step_seconds(step))
        assert 0 < step_seconds(step) < step.seconds["step"]  # the counting is left out


def test_a_batch1_decode_step_reads_every_weight_once(
    one_request: list[StepGroup], model_dir: Path
) -> None:
    config = load_model_config(model_dir)
    hidden, inner = config.hidden_size, config.intermediate_size
    q_kv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    layer_params = hidden * q_kv + config.num_heads * config.head_dim * hidden + 3 * hidden * inner
    params = config.num_layers * layer_params + config.vocab_size * hidden
    for step in one_request[1].steps:
        assert step.flops["linear"] == 2 * params  # one row through every weight
        assert step.bytes["linear"] > 4 * params  # float32 weights, plus the row in and out


def test_decode_attention_counts_one_more_key_a_step(
    one_request: list[StepGroup], model_dir: Path
) -> None:
    config = load_model_config(model_dir)
    per_key = 4 * config.num_heads * config.head_dim * config.num_layers
    flops = [step.flops["attention_decode"] for step in one_request[1].steps]
    first_context = len(PROMPT) + 1  # the prompt and the token its prefill sampled
    assert flops == [per_key * (first_context + i) for i in range(DECODE_STEPS)]


def test_prefill_attention_counts_causal_and_windowed_pairs() -> None:
    q = torch.zeros(3, 2, 4)  # a chunk of 3 queries, 2 heads of 4
    k_cache = torch.zeros(8, 16, 1, 4)  # blocks, block size, 1 KV head of 4
    starts, lengths = torch.tensor([0, 3]), torch.tensor([8])  # positions 5, 6, 7
    full = prefill_attention_work(q, k_cache, starts, lengths, None)
    assert full.flops == 4 * (6 + 7 + 8) * 2 * 4
    assert full.bytes == 2 * 8 * 1 * 4 * 4 + 2 * q.nbytes  # keys 0..7 read once
    windowed = prefill_attention_work(q, k_cache, starts, lengths, 4)
    assert windowed.flops == 4 * (4 + 4 + 4) * 2 * 4
    assert windowed.bytes == 2 * 6 * 1 * 4 * 4 + 2 * q.nbytes  # keys 2..7


def test_the_report_puts_each_part_beside_its_floor(one_request: list[StepGroup]) -> None:
    bounds = HostBounds(copy_bandwidth=1e10, peak_flops=1e11)
    text = profile_report(one_request, bounds)
    for part in PARTS:
        assert f"  {part} " in text
    linear_row = next(line for line in text.splitlines() if line.startswith("  linear "))
    assert len(linear_row.split()) == 7  # a floor and a ratio: bytes and flops were counted
    sample_row = next(line for line in text.splitlines() if line.startswith("  sample "))
    assert len(sample_row.split()) == 3  # no count, no floor


def test_the_command_profiles_each_batch_on_the_first_requests_in_its_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "w.json"
    workload.write_text(
        '[{"prompt": [400, 500, 600], "max_tokens": 3}, {"prompt": [700, 800], "max_tokens": 2},'
        ' {"prompt": [900], "max_tokens": 9}]'
    )
    argv = ["bench", "offline", "--profile", "--workload", str(workload), "--max-batch", "1,2"]
    assert main([*argv, "--num-requests", "2", "--quantization", "int8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("host bounds: copy bandwidth ")
    assert "B=1, int8/float32, w.json, 2 requests" in out
    assert "B=2, int8/float32, w.json, 2 requests" in out
    # One at a time: a prefill step and 2 decode steps, then one and 1 (the third never ran).
    assert "all steps: 5 steps, 1.0 sequences/step" in out


def test_context_growth_times_each_batch_at_each_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "offline", "--context-growth", "40,20", "--max-batch", "1,2"]
    assert main([*argv, "--decode-steps", "3", "--json"]) == 0
    captured = capsys.readouterr()
    points = [json.loads(line) for line in captured.out.splitlines()]
    assert [(p["batch"], p["context"]) for p in points] == [(1, 20), (1, 40), (2, 20), (2, 40)]
    for point in points:
        assert point["decode_steps"] == 3 and point["weights"] == "float32"
        assert 0 < point["attention_decode_ms"] < point["step_ms"]
        rest = point["step_ms"] - point["attention_decode_ms"]
        assert math.isclose(point["rest_ms"], rest, abs_tol=0.002)  # each rounded to 0.001

    # The middle decode step reads each sequence's 22 (42) keys and values, 3 KV heads x 64
    # floats each, and its query in and out (9 heads x 64), in each of the 30 layers.
    def step_bytes(sequences: int, keys: int) -> float:
        return sequences * 30 * (2 * keys * 3 * 64 * 4 + 2 * 9 * 64 * 4)

    assert [p["kv_read_mb"] for p in points] == [
        round(step_bytes(n, keys) / 1e6, 2) for n, keys in ((1, 22), (1, 42), (2, 22), (2, 42))
    ]
    assert "B=2: context 20 -> 40: step " in captured.err
