"""The offline API, in the style of vLLM: `LLM(model).generate(prompts, params)`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.core.model.source import resolve_model
from pdserve.core.outputs import CompletionOutput, TokenDelta
from pdserve.core.sampling_params import SamplingParams, sample_ids
from pdserve.core.scheduler import Scheduler
from pdserve.core.static_scheduler import StaticScheduler

Prompt = str | list[int]


class LLM:
    """Loads a model once and generates for batches of prompts (continuous batching)."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        model_cache: Path | None = None,
        static_batching: bool = False,
        **engine_config: object,
    ) -> None:
        config = EngineConfig(**engine_config)  # type: ignore[arg-type]
        scheduler = StaticScheduler if static_batching else Scheduler
        self.engine = LLMEngine(resolve_model(model, model_cache), config, scheduler)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """Runs every prompt to completion; outputs come back in the order of `prompts`, the n
        samples of a prompt with `SamplingParams(n=...)` one after another."""
        prompt_list = _as_prompt_list(prompts)
        param_list = _as_params_list(params, len(prompt_list))
        added = self._add_all(prompt_list, param_list)
        ids = [
            sample_id
            for request_id, sampling in zip(added, param_list, strict=True)
            for sample_id in sample_ids(request_id, sampling.n)
        ]
        prompt_ids = {rid: tuple(self.engine.requests[rid].prompt_token_ids) for rid in ids}
        tokens: dict[str, list[int]] = {rid: [] for rid in ids}
        texts: dict[str, list[str]] = {rid: [] for rid in ids}
        finished: dict[str, CompletionOutput] = {}
        for delta in self.stream():
            tokens[delta.request_id].extend(delta.new_token_ids)
            texts[delta.request_id].append(delta.text)
            if delta.finish_reason is not None:
                finished[delta.request_id] = CompletionOutput(
                    request_id=delta.request_id,
                    prompt_token_ids=prompt_ids[delta.request_id],
                    token_ids=tuple(tokens[delta.request_id]),
                    text="".join(texts[delta.request_id]),
                    finish_reason=delta.finish_reason,
                )
        return [finished[rid] for rid in ids]

    def _add_all(self, prompts: list[Prompt], params: list[SamplingParams]) -> list[str]:
        """Queues every prompt, or none: a bad one takes back those queued before it."""
        ids: list[str] = []
        try:
            for prompt, sampling in zip(prompts, params, strict=True):
                ids.append(self.engine.add_request(prompt, sampling))
        except Exception:
            for request_id in ids:
                self.engine.abort(request_id)
            raise
        return ids

    def stream(self) -> Iterator[TokenDelta]:
        """Steps the engine until every queued request has finished, yielding each delta."""
        while self.engine.has_unfinished():
            yield from self.engine.step()


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if prompts and all(isinstance(token, int) for token in prompts):
        return [list(prompts)]  # type: ignore[arg-type]  # one prompt given as token ids
    return list(prompts)  # type: ignore[arg-type]


def _as_params_list(
    params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    if len(params) != count:
        raise ValueError(f"params: got {len(params)} for {count} prompts")
    return list(params)
