"""What a worker's Load counts (core/sched/engine_load.py): a prompt being computed is pending
work, not a stream."""

from __future__ import annotations

from pdserve.core.config import EngineConfig
from pdserve.core.request import Request
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.engine_load import load_of
from pdserve.core.sched.scheduler import Scheduler


def _request(request_id: str, prompt_tokens: int, order: int) -> Request:
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    prompt = list(range(order * 1000, order * 1000 + prompt_tokens))
    return Request(request_id, prompt, params, order, 0.0)


def _step(scheduler: Scheduler) -> None:
    output = scheduler.schedule()
    for request in list(scheduler.running):
        num_new = output.num_scheduled_tokens.get(request.request_id, 0)
        scheduler.record_computed(request, num_new)
        if request.num_computed_tokens == request.num_tokens:
            request.output_token_ids.append(1)


def test_a_prompt_in_chunks_is_pending_and_a_decoding_request_is_a_stream() -> None:
    scheduler = Scheduler(EngineConfig(num_kv_blocks=64, max_num_batched_tokens=64))
    scheduler.add(_request("chat", 20, 0))
    _step(scheduler)  # its whole prompt: it decodes from now on
    scheduler.add(_request("long", 200, 1))
    _step(scheduler)  # chat decodes a token, long's first chunk (63 tokens)
    load = load_of(scheduler)
    assert len(scheduler.running) == 2
    assert (load.num_running, load.num_waiting) == (1, 1)
    assert load.num_context_tokens == 22  # chat's prompt and two outputs; long's not yet
    assert load.num_pending_prompt_tokens == 200 - 63
