"""Bad input raises one exception type naming the field; the engine keeps serving."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.core.llm import LLM
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    return LLM(model_dir, num_kv_blocks=64)


@pytest.mark.parametrize(
    ("field", "make"),
    [
        ("max_tokens", lambda: SamplingParams(max_tokens=0)),
        ("temperature", lambda: SamplingParams(temperature=-0.5)),
        ("temperature", lambda: SamplingParams(temperature=float("inf"))),
        ("temperature", lambda: SamplingParams(temperature=float("nan"))),
        ("top_p", lambda: SamplingParams(top_p=float("nan"))),
        ("top_p", lambda: SamplingParams(top_p=float("-inf"))),
        ("top_p", lambda: SamplingParams(top_p=0.0)),
        ("top_p", lambda: SamplingParams(top_p=1.5)),
        ("top_k", lambda: SamplingParams(top_k=-1)),
        ("priority", lambda: SamplingParams(priority="high")),  # type: ignore[arg-type]
        ("priority", lambda: SamplingParams(priority=1.5)),  # type: ignore[arg-type]
        ("seed", lambda: SamplingParams(seed=-1)),
        ("stop", lambda: SamplingParams(stop=("",))),
    ],
)
def test_bad_sampling_params_name_the_field(field: str, make: object) -> None:
    with pytest.raises(InvalidRequestError, match=f"^{field}:"):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("field", "prompt", "max_tokens"),
    [
        ("prompt", "", 4),
        ("prompt_token_ids", [], 4),
        ("prompt_token_ids", [1, 49152], 4),
        ("prompt_token_ids", [1, -2], 4),
        ("sampling.max_tokens", [1] * 10, 8190),  # past the model's 8192-token context
        ("sampling.max_tokens", [1] * 10, 2000),  # more blocks than the whole (64-block) cache
    ],
)
def test_bad_requests_name_the_field_and_lose_nothing(
    llm: LLM, field: str, prompt: str | list[int], max_tokens: int
) -> None:
    with pytest.raises(InvalidRequestError, match=f"^{field}:"):
        llm.generate(["Hello", prompt], SamplingParams(max_tokens=max_tokens, temperature=0))
    assert not llm.engine.requests  # the good request queued before it was taken back
    assert llm.generate("Hello", SamplingParams(max_tokens=3))[0].outputs[0].token_ids


def test_abort_frees_blocks(llm: LLM) -> None:
    engine = llm.engine
    request_id = engine.add_request("Hello there", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.stats().num_free_blocks < engine.stats().num_total_blocks
    engine.abort(request_id)
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks and not engine.has_unfinished()
