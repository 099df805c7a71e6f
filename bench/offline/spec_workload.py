"""Writes the shipped repetition-rich workload for `pdserve bench spec` (bench/workloads/).

    .venv/bin/pdserve bench make-spec-workload [--out bench/workloads/repetition.json]

Requests whose answers quote or edit their prompt, the case n-gram drafts are for: code edits
(rename, add a docstring or type hints), extraction (quote the sentences that mention a word),
summaries with quotations and proofreading (return the text with one word fixed). Each task
is asked of each source text through the model's chat template, so the prompts are what a user
of `/v1/chat/completions` would send. Deterministic: no randomness, only the tokenizer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pdserve.bench.offline.workload import WorkloadRequest, save_workload
from pdserve.core.model.source import resolve_model
from pdserve.core.text.chat import ChatMessage, chat_prompt
from pdserve.core.text.tokenizer import load_tokenizer

WORKLOAD_DIR = Path(__file__).resolve().parents[1] / "workloads"
MAX_TOKENS = 256

CODE = (
    """def moving_average(values, window):
    result = []
    count = 0
    running = 0.0
    for index, value in enumerate(values):
        running += value
        count += 1
        if index >= window:
            running -= values[index - window]
            count -= 1
        result.append(running / count)
    return result""",
    """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError(f"not enough {name}")
        self.items[name] -= count

    def total(self):
        return sum(self.items.values())""",
    """def parse_config(lines):
    config = {}
    section = "default"
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, value = line.split("=", 1)
        config.setdefault(section, {})[key.strip()] = value.strip()
    return config""",
    """def merge_intervals(intervals):
    intervals = sorted(intervals)
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged""",
)
CODE_TASKS = (
    "Rename the variable `result` (or, if there is none, `items`) to `output` in this Python "
    "code. Reply with the whole code and nothing else.",
    "Add a docstring to every function in this Python code. Reply with the whole code.",
    "Add type hints to this Python code. Reply with the whole code and nothing else.",
)

TEXT = (
    "The lighthouse stood on the northern cliff for two hundred years. Its keeper, Ana Ferreira, "
    "climbed the one hundred and twelve steps every evening to light the lamp. In winter the "
    "storms cut the island off from the mainland for weeks, and the supply boat could not land. "
    "Ana kept a logbook of every ship that passed, every storm and every repair. When the lamp "
    "was automated in 1987, the logbook was sent to the maritime museum in Porto, where it can "
    "still be read today.",
    "Photosynthesis turns light into chemical energy. In the chloroplasts, chlorophyll absorbs "
    "mostly blue and red light and reflects green, which is why leaves look green. The light "
    "reactions split water and release oxygen. The Calvin cycle then uses the energy stored in "
    "ATP and NADPH to fix carbon dioxide into sugars. Plants use these sugars to grow, and "
    "animals that eat plants depend on them too.",
    "The city council met on Tuesday to discuss the new bicycle lanes. The transport committee "
    "proposed a lane along the river road, connecting the station with the university. Several "
    "shop owners worried that parking would disappear. The council agreed to a six-month trial "
    "and asked the committee to count cyclists and shoppers before and after. The trial starts "
    "in March.",
    "Sourdough bread needs only flour, water and salt. The starter, a mix of flour and water left "
    "to ferment, carries wild yeast and lactic acid bacteria. Bakers feed the starter daily. The "
    "dough rises slowly, often overnight, which gives the bread its sour taste and open crumb. "
    "A hot oven and steam in the first minutes give it a thick, crackling crust.",
)
TEXT_TASKS = (
    "Quote, word for word, every sentence of this text that contains the word 'the'. One "
    "sentence per line.",
    "Summarize this text in three bullet points, quoting its exact words where you can.",
    "Proofread this text: fix any mistakes and reply with the whole corrected text.",
    "Repeat this text exactly, then give it a title.",
)


def requests() -> list[tuple[str, str]]:
    """(task, source) pairs, code tasks first."""
    code = [(task, f"```python\n{source}\n```") for source in CODE for task in CODE_TASKS]
    return code + [(task, source) for source in TEXT for task in TEXT_TASKS]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=WORKLOAD_DIR / "repetition.json")
    parser.add_argument("--model", help="model folder whose tokenizer and chat template to use")


def run(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(resolve_model(args.model))
    workload = []
    for task, source in requests():
        prompt = chat_prompt(tokenizer, [ChatMessage("user", f"{task}\n\n{source}")])
        ids = tokenizer.encode(prompt)  # as the HTTP door encodes a chat prompt
        workload.append(WorkloadRequest(tuple(ids), MAX_TOKENS))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_workload(workload, args.out)
    print(f"{len(workload)} requests -> {args.out}")
    return 0
