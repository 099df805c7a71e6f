"""transformers' greedy tokens: the oracle every path must match, and the prompts they are for.

The references most tests compare with (`hf_greedy`, `shared_hf_greedy`, `structured_reference`
in tests/conftest.py) cost half a minute of transformers on 2 cores. They are computed by
`start_oracle` in a process of its own from the session's start, at the lowest CPU priority
(tests/background.py), so they take what the tests leave idle (waits on streams, drains,
timeouts), as strict mypy does, instead of holding up the first test that needs them. The
process runs this module: `python -m tests.oracle OUT` writes the references to OUT as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tests.background import lowest_priority, raise_priority

REPO = Path(__file__).resolve().parents[1]

PROMPT_LENGTHS = (1, 7, 16, 17, 63, 130, 250, 500)
MAX_NEW_TOKENS = 24

_TEXT = (
    "The history of computing is a story of people trying to make machines do arithmetic "
    "faster than a clerk with pen and paper. Early mechanical calculators added and "
    "multiplied with gears; punched cards later stored data and programs. In the middle of the "
    "twentieth century, electronic computers replaced relays with vacuum tubes, and then with "
    "transistors, which were smaller, cooler and far more reliable. Integrated circuits put "
    "many transistors on one chip, and the microprocessor put a whole computer on one. "
)

# Prompts that share leading tokens, for the prefix cache (tests/core/test_prefix_cache.py).
SHARED_LENGTHS = (0, 9, 100)  # none, part of one 16-token block, six blocks and a bit
TAIL_LENGTHS = (5, 23, 40)
SHARED_MAX_TOKENS = 12


def real_text_prompts(tokenizer: Any) -> list[list[int]]:
    """Real-text prompts of PROMPT_LENGTHS tokens (each starting at a different word)."""
    ids: list[int] = tokenizer.encode(_TEXT * 12)
    return [ids[3 * i : 3 * i + length] for i, length in enumerate(PROMPT_LENGTHS)]


def shared_prefix_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """For each shared length, tails of TAIL_LENGTHS after the same leading tokens."""
    source = prompts[-1]  # 500 tokens of real text
    out = []
    for shared in SHARED_LENGTHS:
        for index, tail in enumerate(TAIL_LENGTHS):
            start = 120 + 40 * index
            out.append(source[:shared] + source[start : start + tail])
    return out


def structured_chat_prompts(tokenizer: Any) -> list[list[int]]:
    """A chat prompt for each of tests/structured_cases.py's CASES."""
    from tests.structured_cases import CASES, chat_prompt

    return [chat_prompt(tokenizer, question) for question, _ in CASES]


def transformers_greedy(
    model_dir: Path,
    prompts: list[list[int]],
    max_new_tokens: int,
    logits_processors: Callable[[int], list[Any]] | None = None,
) -> list[list[int]]:
    """transformers `generate(do_sample=False)` for every prompt, one at a time (no padding).
    `logits_processors(i)`: fresh logits processors for prompt i (one generate each)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    outputs = []
    with torch.inference_mode():
        for index, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            generated = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                logits_processor=logits_processors(index) if logits_processors else None,
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def structured_greedy(
    model_dir: Path, tokenizer: Any, structured_prompts: list[list[int]]
) -> list[list[int]]:
    """transformers' greedy tokens for each case under llguidance's own mask calls, on the
    grammar the engine's compiler builds."""
    from pdserve.core.model.config import load_model_config
    from pdserve.core.structured.grammar import Grammars
    from tests.structured_cases import CASES, MAX_TOKENS, GuidanceLogitsProcessor

    config = load_model_config(model_dir)
    grammars = Grammars(tokenizer, config.vocab_size, config.eos_token_ids)

    def processors(index: int) -> list[Any]:
        return [GuidanceLogitsProcessor(grammars.compiled(CASES[index][1]))]

    return transformers_greedy(model_dir, structured_prompts, MAX_TOKENS, processors)


def references(model_dir: Path) -> dict[str, list[list[int]]]:
    """Every reference the session fixtures serve, by fixture name."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = real_text_prompts(tokenizer)
    return {
        "hf_greedy": transformers_greedy(model_dir, prompts, MAX_NEW_TOKENS),
        "shared_hf_greedy": transformers_greedy(
            model_dir, shared_prefix_prompts(prompts), SHARED_MAX_TOKENS
        ),
        "structured_reference": structured_greedy(
            model_dir, tokenizer, structured_chat_prompts(tokenizer)
        ),
    }


@dataclass
class OracleRun:
    """The references being computed in the background (`start_oracle`)."""

    process: subprocess.Popen[str]
    out: Path
    _loaded: dict[str, list[list[int]]] | None = None

    def result(self, name: str) -> list[list[int]]:
        """Waits for the process, then one reference by fixture name."""
        if self._loaded is None:
            raise_priority(self.process.pid)  # a test waits for it now
            _, err = self.process.communicate()
            if self.process.returncode != 0:
                raise RuntimeError(f"the oracle process failed:\n{err[-4000:]}")
            self._loaded = json.loads(self.out.read_text())
        return self._loaded[name]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def start_oracle(out: Path) -> OracleRun:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.oracle", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lowest_priority,
    )
    return OracleRun(process, out)


def main() -> None:
    from pdserve.core.model.source import resolve_model

    (out,) = sys.argv[1:]
    Path(out).write_text(json.dumps(references(resolve_model(None))))


if __name__ == "__main__":
    main()
