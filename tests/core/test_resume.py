"""A request resumed after output another worker streamed (a migration) continues exactly as the
undisturbed run: the same tokens (greedy and seeded), the rest of the text including what the lost
worker held back, and a stop string that spans the resumption point."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pdserve.core.engine import LLMEngine
from pdserve.core.llm import LLM
from pdserve.core.outputs import FinishReason
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams


@dataclass(frozen=True)
class Run:
    token_ids: list[int]
    texts: list[str]  # released per delta: one token a delta offline
    finish: FinishReason | None

    @property
    def text(self) -> str:
        return "".join(self.texts)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> LLMEngine:
    return LLM(model_dir, num_kv_blocks=256).engine


def _run(
    engine: LLMEngine, prompt: list[int], params: SamplingParams, resumed: list[int] | None = None
) -> Run:
    engine.add_request(prompt, params, resumed_output=resumed or ())
    tokens: list[int] = []
    texts: list[str] = []
    finish = None
    while engine.has_unfinished():
        for delta in engine.step():
            tokens.extend(delta.new_token_ids)
            texts.append(delta.text)
            finish = delta.finish_reason
    return Run(tokens, texts, finish)


def _assert_continues(undisturbed: Run, resumed: Run, cut: int) -> None:
    assert undisturbed.token_ids[:cut] + resumed.token_ids == undisturbed.token_ids
    assert "".join(undisturbed.texts[:cut]) + resumed.text == undisturbed.text
    assert resumed.finish == undisturbed.finish


# A stop string that never occurs: the detokenizer holds back its length - 1 characters, text a
# lost worker never released.
NEVER = "@@ this never appears in the output @@"


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=(NEVER,)),
        SamplingParams(max_tokens=20, temperature=0.9, top_p=0.95, seed=1234, stop=(NEVER,)),
    ],
    ids=["greedy", "seeded"],
)
def test_resumed_run_continues_tokens_and_text(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams
) -> None:
    undisturbed = _run(engine, prompts[3], params)
    assert len(undisturbed.token_ids) == 20
    for cut in (1, 7, 13):
        resumed = _run(engine, prompts[3], params, undisturbed.token_ids[:cut])
        _assert_continues(undisturbed, resumed, cut)


def test_a_stop_string_spanning_the_resumption_point_is_found(
    engine: LLMEngine, prompts: list[list[int]], tokenizer: Any
) -> None:
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    tokens = _run(engine, prompts[4], free).token_ids
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    cut, stop = _stop_across_a_token_boundary(tokenizer, tokens, text)
    stopped = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=(stop,))
    undisturbed = _run(engine, prompts[4], stopped)
    assert undisturbed.finish is FinishReason.STOP
    assert undisturbed.text == text[: text.index(stop)]
    resumed = _run(engine, prompts[4], stopped, undisturbed.token_ids[:cut])
    _assert_continues(undisturbed, resumed, cut)


def _stop_across_a_token_boundary(tokenizer: Any, tokens: list[int], text: str) -> tuple[int, str]:
    """(cut, stop): a 6-character stop string whose first occurrence in `text` starts in the
    text of the first `cut` tokens and ends after it."""
    for cut in range(4, len(tokens) - 4):
        boundary = len(tokenizer.decode(tokens[:cut], skip_special_tokens=True))
        stop = text[boundary - 3 : boundary + 3]
        if len(stop) == 6 and text.find(stop) == boundary - 3:
            return cut, stop
    raise AssertionError(f"no stop string spans a token boundary once in {text!r}")


@pytest.mark.parametrize(
    ("params", "resumed", "why"),
    [
        (SamplingParams(max_tokens=8, n=2, temperature=1.0), [5], "one sample"),
        (SamplingParams(max_tokens=3), [5, 6, 7], "leave none of max_tokens"),
        (SamplingParams(max_tokens=8), [10**7], "outside the vocabulary"),
    ],
    ids=["n", "max_tokens", "vocabulary"],
)
def test_bad_resumed_output_names_its_field(
    engine: LLMEngine,
    prompts: list[list[int]],
    params: SamplingParams,
    resumed: list[int],
    why: str,
) -> None:
    with pytest.raises(InvalidRequestError, match=why) as raised:
        engine.add_request(prompts[2], params, resumed_output=resumed)
    assert raised.value.field == "resumed_output_token_ids"
    assert not engine.has_unfinished()
