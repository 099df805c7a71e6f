"""Writes the shipped multi-turn workload of `pdserve bench offload` (bench/workloads/).

    .venv/bin/pdserve bench make-multiturn-workload [--out bench/workloads/multiturn.json]
        [--conversations 16] [--turns 8]

C conversations of T turns. A conversation's first prompt is a user message; each later turn's
prompt is the previous turn's prompt, the reply to it (as long as that turn's `max_tokens`) and a
new user message, as a chat client resends the whole history. Turns arrive interleaved, one turn
of every conversation before the next turn of any (`turn` then `conversation` order), so between
two turns of a conversation every other conversation's history passes through the KV pool: with
the offload bench's pool (160 blocks of 16 tokens) the last turns' histories exceed it 5x, and
an LRU cache without tiers below it has evicted each history before its next turn. Of a turn's
prompt, all but the reply and the new message (~100 tokens) was the previous turn's prompt: over
8 turns about a quarter of the prompt tokens are new.

Token ids are drawn at random (seeded) from SmolLM2's vocabulary past its special tokens, as
`make-workloads` does: the bench runs greedy with `ignore_eos`, so only the lengths and the
shared prefixes matter, and the file needs no tokenizer. The reply's tokens stand in for what the
model said; a real client would resend the model's own reply, which changes none of the lengths.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from pdserve.bench.offline.make_workloads import FIRST_ID, VOCAB
from pdserve.bench.offline.workload import WorkloadRequest, save_workload

WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "multiturn.json"
SEED = 20261204
FIRST_MESSAGE = (64, 192)  # tokens of a conversation's first user message (inclusive range)
LATER_MESSAGE = (32, 96)  # of each later user message
REPLY = (16, 32)  # max_tokens of each turn: the reply the next turn carries


def conversations(
    rng: random.Random, num_conversations: int, num_turns: int
) -> list[tuple[int, int, WorkloadRequest]]:
    """(conversation, turn, request) in arrival order: every conversation's turn 0, then 1, ..."""
    history = [_tokens(rng, rng.randint(*FIRST_MESSAGE)) for _ in range(num_conversations)]
    arrivals = []
    for turn in range(num_turns):
        for conversation in range(num_conversations):
            reply_tokens = rng.randint(*REPLY)
            arrivals.append(
                (conversation, turn, WorkloadRequest(history[conversation], reply_tokens))
            )
            reply = _tokens(rng, reply_tokens)
            message = _tokens(rng, rng.randint(*LATER_MESSAGE))
            history[conversation] = history[conversation] + reply + message
    return arrivals


def _tokens(rng: random.Random, length: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_ID, VOCAB) for _ in range(length))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=WORKLOAD)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)


def run(args: argparse.Namespace) -> int:
    if args.conversations < 1 or args.turns < 1:
        print("error: --conversations and --turns must be >= 1")
        return 2
    arrivals = conversations(random.Random(SEED), args.conversations, args.turns)
    columns = {
        "conversation": [str(conversation) for conversation, _, _ in arrivals],
        "turn": [str(turn) for _, turn, _ in arrivals],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_workload([request for _, _, request in arrivals], args.out, columns)
    return 0
