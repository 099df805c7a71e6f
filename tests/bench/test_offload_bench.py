"""`pdserve bench offload`'s workload: the generator reproduces the shipped file, every turn
resends its conversation's previous prompt, and the turns arrive interleaved. (The bench's arms
run clusters of real processes, minutes each: the offload path itself is tested through a
cluster in tests/integration/test_kv_sharing_cluster.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from pdserve.bench.offload.workload import WORKLOAD
from pdserve.cli import main


def test_generator_reproduces_the_shipped_workload(tmp_path: Path) -> None:
    out = tmp_path / "multiturn.json"
    assert main(["bench", "make-multiturn-workload", "--out", str(out)]) == 0
    assert out.read_text() == WORKLOAD.read_text()


def test_each_turn_extends_its_conversation_and_every_conversation_turns_in_step() -> None:
    requests = json.loads(WORKLOAD.read_text())
    last: dict[str, tuple[list[int], int]] = {}  # conversation -> its last prompt, max_tokens
    turns = []
    for request in requests:
        conversation, prompt = request["conversation"], request["prompt"]
        if conversation in last:  # history, the reply (its max_tokens long), a new message
            previous, reply_tokens = last[conversation]
            assert prompt[: len(previous)] == previous
            assert len(prompt) > len(previous) + reply_tokens
        last[conversation] = (prompt, request["max_tokens"])
        turns.append(int(request["turn"]))
    assert turns == sorted(turns)  # every conversation's turn t before any turn t + 1
    assert len(last) == 16 and max(turns) == 7
