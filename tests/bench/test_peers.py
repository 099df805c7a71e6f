"""`pdserve bench peers`: argument parsing, llama-batched-bench parsing and the report (the runs
themselves are too slow for the suite; docs/benchmarks.md has their command and figures)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pdserve.bench.peers import cli as peers_cli
from pdserve.bench.peers.llama import (
    NGRAM_SPEC_TYPES,
    NO_EXTRA_BUFFERS,
    GgufType,
    LlamaRun,
    LlamaSpeculation,
    Peer,
    parse_batched_bench,
    runnable,
)
from pdserve.bench.peers.report import PeerResult, json_line, report


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    peers_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_arguments_as_the_issue_names_them() -> None:
    args = _parse("--workload", "w.json", "--slots", "16", "--batch1", "--json", "--model", "m")
    assert (args.slots, args.batch1, args.json, args.model) == ([16], True, True, "m")
    assert args.gguf is GgufType.F32 and args.dtype == "float32" and args.quantization == "none"
    assert _parse("--slots", "16,64", "--gguf", "q8_0").slots == [16, 64]


@pytest.mark.parametrize("slots", ["0", "x", "16,-1", ""])
def test_bad_slots_are_refused(slots: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--slots", slots)
    assert "--slots" in capsys.readouterr().err


def test_batched_bench_jsonl_gives_ms_per_token() -> None:
    line = json.dumps({"pp": 87, "tg": 128, "pl": 1, "t_pp": 0.2, "t_tg": 2.56, "speed_tg": 50.0})
    assert parse_batched_bench(f"build info\n{line}\n\nllama_perf ...") == pytest.approx(20.0)
    with pytest.raises(ValueError, match="no jsonl"):
        parse_batched_bench("| PP | TG |")


def test_json_lines_carry_the_issue_fields() -> None:
    run = json.loads(json_line(PeerResult("pdserve", 16, 7303, 36.5, 2.1, "float32"), "mixed.json"))
    assert run["engine"] == "pdserve" and run["slots"] == 16
    assert run["tokens_per_s"] == pytest.approx(200.08)
    assert "ms_per_token_batch1" not in run
    batch1 = PeerResult("llama.cpp", 1, 128, 2.56, 2.0, "f32", 20.0)
    assert json.loads(json_line(batch1, "mixed.json"))["ms_per_token_batch1"] == 20.0


def test_report_prints_same_run_ratios() -> None:
    results = [
        PeerResult("pdserve", 1, 128, 1.28, 2.0, "float32", 10.0),
        PeerResult("llama.cpp", 1, 128, 2.56, 2.0, "f32", 20.0),
        PeerResult("pdserve", 16, 1000, 5.0, 2.0, "float32"),
        PeerResult("llama.cpp", 16, 1000, 10.0, 2.0, "f32"),
        PeerResult("pdserve", 64, 1000, 4.0, 2.0, "float32"),
        PeerResult("llama.cpp", 64, 1000, 12.5, 2.0, "f32"),
    ]
    text = report(results)
    assert "batch-1 decode speed, pdserve / llama.cpp: 2.00x" in text
    assert "16 slots, pdserve / llama.cpp tok/s: 2.00x" in text
    assert "best of each, pdserve (64 slots) / llama.cpp (16 slots): 2.50x" in text


def test_speculative_arguments() -> None:
    args = _parse("--slots", "16", "--speculative", "ngram", "--llama-spec-types", "ngram-mod")
    assert (args.speculative, args.llama_spec_types) == ("ngram", ["ngram-mod"])
    assert _parse("--slots", "1").llama_spec_types == list(NGRAM_SPEC_TYPES)


@pytest.mark.parametrize("types", ["draft", "ngram-mod,eagle", ""])
def test_unknown_llama_spec_types_are_refused(
    types: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parse("--slots", "1", "--speculative", "ngram", "--llama-spec-types", types)
    assert "--llama-spec-types" in capsys.readouterr().err


def test_llama_speculation_flags_and_timings() -> None:
    assert LlamaSpeculation("ngram-mod", 4).flags() == [
        "--spec-type",
        "ngram-mod",
        "--spec-draft-n-max",
        "4",
    ]
    run = LlamaRun(seconds=3.0, decode_ms=254.0, decode_tokens=127, drafted=40, accepted=30)
    assert run.ms_per_token == pytest.approx(2.0) and run.acceptance_rate == pytest.approx(0.75)
    assert LlamaRun(1.0, 1.0, 1, 0, 0).acceptance_rate is None


def test_report_compares_with_llamas_best_speculation() -> None:
    results = [
        PeerResult("pdserve", 1, 256, 2.0, 2.0, "float32", 10.0, "ngram", 0.6),
        PeerResult("llama.cpp", 1, 256, 3.0, 2.0, "f32", 25.0, "ngram-simple", 0.5),
        PeerResult("llama.cpp", 1, 256, 3.0, 2.0, "f32", 12.5, "ngram-mod", 0.7),
        PeerResult("pdserve", 16, 1000, 5.0, 2.0, "float32", None, "ngram", 0.6),
        PeerResult("llama.cpp", 16, 1000, 4.0, 2.0, "f32", None, "ngram-map-k", 0.5),
        PeerResult("llama.cpp", 16, 1000, 8.0, 2.0, "f32", None, "ngram-mod", 0.7),
    ]
    text = report(results)
    assert "batch-1 decode speed, pdserve (ngram) / llama.cpp (ngram-mod): 1.25x" in text
    assert "16 slots, pdserve (ngram) / llama.cpp (ngram-map-k) tok/s: 0.80x" in text
    row = json.loads(json_line(results[2], "repetition.json"))
    assert (row["speculative"], row["acceptance_rate"]) == ("ngram-mod", 0.7)


def _peer_whose_bench(tmp_path: Path, script: str) -> Peer:
    """A cache whose llama-batched-bench is `script` (a shell script's body)."""
    peer = Peer(tmp_path)
    binary = peer.binary("llama-batched-bench")
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(0o755)
    return peer


def test_llama_runs_as_built_where_it_can(tmp_path: Path) -> None:
    peer = _peer_whose_bench(tmp_path, "exit 0")
    assert runnable(peer, tmp_path / "m.gguf").flags == ()


def test_llama_without_extra_buffers_where_they_crash_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As AMX did on a KVM guest that advertised it: the tile instructions fault."""
    crash_unless_flag = f'case "$*" in *{NO_EXTRA_BUFFERS}*) exit 0;; esac; kill -SEGV $$'
    peer = _peer_whose_bench(tmp_path, crash_unless_flag)
    fallback = runnable(peer, tmp_path / "m.gguf")
    assert fallback.flags == (NO_EXTRA_BUFFERS,)
    assert NO_EXTRA_BUFFERS in capsys.readouterr().err
    result = PeerResult("llama.cpp", 16, 7303, 36.5, 2.1, "q8_0", flags=fallback.flags)
    assert json.loads(json_line(result, "mixed.json"))["flags"] == NO_EXTRA_BUFFERS


def test_llama_that_fails_either_way_is_an_error(tmp_path: Path) -> None:
    peer = _peer_whose_bench(tmp_path, "exit 1")
    with pytest.raises(RuntimeError, match="with and without"):
        runnable(peer, tmp_path / "m.gguf")
