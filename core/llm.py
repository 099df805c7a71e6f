"""The offline API, in the style of vLLM: `LLM(model).generate(prompts, params)`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.core.model.source import resolve_model
from pdserve.core.outputs import CompletionOutput, RequestOutput, TokenDelta
from pdserve.core.sampling_params import SamplingParams, sample_ids
from pdserve.core.sched.scheduler import Scheduler
from pdserve.core.sched.static_scheduler import StaticScheduler

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
    ) -> list[RequestOutput]:
        """Runs every prompt to completion: one output per prompt, in the order of `prompts`, each
        with its n samples (`SamplingParams(n=...)`) in `.outputs`, as vLLM returns them."""
        prompt_list = _as_prompt_list(prompts)
        param_list = _as_params_list(params, len(prompt_list))
        added = self._add_all(prompt_list, param_list)
        samples = [
            sample_ids(rid, sampling.n) for rid, sampling in zip(added, param_list, strict=True)
        ]
        # Read before running: the engine forgets a request once it has finished.
        prompt_ids = [tuple(self.engine.requests[ids[0]].prompt_token_ids) for ids in samples]
        deltas: defaultdict[str, list[TokenDelta]] = defaultdict(list)
        for delta in self.stream():
            deltas[delta.request_id].append(delta)
        return [
            RequestOutput(
                request_id=request_id,
                prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=prompt_token_ids,
                outputs=tuple(_completion(index, deltas[sid]) for index, sid in enumerate(ids)),
                finished=True,
            )
            for request_id, prompt, prompt_token_ids, ids in zip(
                added, prompt_list, prompt_ids, samples, strict=True
            )
        ]

    def close(self) -> None:
        """Stops the engine's own threads (the KV disk tier's writer lands what it holds first)."""
        self.engine.close()

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


def _completion(index: int, deltas: list[TokenDelta]) -> CompletionOutput:
    """A sample's deltas joined; the last one carries its finish reason."""
    finish_reason = deltas[-1].finish_reason
    assert finish_reason is not None  # generate streams until every request has finished
    return CompletionOutput(
        index=index,
        text="".join(delta.text for delta in deltas),
        token_ids=tuple(token for delta in deltas for token in delta.new_token_ids),
        finish_reason=finish_reason,
    )


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
