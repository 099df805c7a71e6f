"""Writes the shipped workload of `pdserve bench structured` (bench/workloads/structured.json).

    .venv/bin/pdserve bench make-structured-workload [--out bench/workloads/structured.json]

Chat requests that ask for a record of the kind one of the shipped JSON schemas describes
(bench/workloads/schemas/: a person, a product, an event, a review), each naming the schema it is
run under when the benchmark constrains it. The schemas bound their strings and arrays, so a
constrained answer ends well within max_tokens. Deterministic: only the tokenizer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pdserve.bench.offline.workload import WorkloadRequest, save_workload
from pdserve.core.model.source import resolve_model
from pdserve.core.text.chat import ChatMessage, chat_prompt
from pdserve.core.text.tokenizer import load_tokenizer

WORKLOAD_DIR = Path(__file__).resolve().parents[1] / "workloads"
SCHEMA_DIR = WORKLOAD_DIR / "schemas"
MAX_TOKENS = 256

SUBJECTS = {
    "person": (
        "Marie Curie",
        "Alan Turing",
        "Ada Lovelace",
        "Isaac Newton",
        "Frida Kahlo",
        "Ludwig van Beethoven",
        "Rosalind Franklin",
        "Nikola Tesla",
    ),
    "product": (
        "a cast-iron frying pan",
        "a garden hose",
        "an ergonomic office chair",
        "a wooden toy train",
        "a pair of running shoes",
        "a stainless steel kettle",
        "a solar garden lamp",
        "a mechanical keyboard",
    ),
    "event": (
        "a science fiction film festival in Lisbon",
        "a Python developers' conference in Berlin",
        "a jazz night in New Orleans",
        "a marathon in Tokyo",
        "a book fair in Frankfurt",
        "a robotics competition in Boston",
        "a food market in Barcelona",
        "a chess tournament in Oslo",
    ),
    "review": (
        "a small Italian restaurant",
        "a budget smartphone",
        "a historical novel",
        "a hotel by the sea",
        "a cordless vacuum cleaner",
        "an animated film",
        "a city bicycle",
        "a board game for families",
    ),
}
QUESTION = "Describe {subject} as a JSON object: {fields}."


def schema_fields(schema_name: str) -> str:
    schema = json.loads((SCHEMA_DIR / f"{schema_name}.json").read_text())
    return ", ".join(schema["properties"])


def questions() -> list[tuple[str, str]]:
    """(schema name, question), the kinds interleaved so any prefix of the workload mixes them."""
    per_kind = [
        [(name, QUESTION.format(subject=s, fields=schema_fields(name))) for s in subjects]
        for name, subjects in SUBJECTS.items()
    ]
    return [pair for round_ in zip(*per_kind, strict=True) for pair in round_]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=WORKLOAD_DIR / "structured.json")
    parser.add_argument("--model", help="model folder whose tokenizer and chat template to use")


def run(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(resolve_model(args.model))
    requests = []
    schemas = []
    for schema_name, question in questions():
        prompt = chat_prompt(tokenizer, [ChatMessage("user", question)])
        requests.append(WorkloadRequest(tuple(tokenizer.encode(prompt)), MAX_TOKENS))
        schemas.append(schema_name)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_workload(requests, args.out, {"schema": schemas})
    print(f"{len(requests)} requests -> {args.out}")
    return 0
