"""How the Decode service starts a request, whichever stream carries its deltas: its own
Generate / GenerateLocal call, or the router's Multiplex stream (one preparation, two relays)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdserve.core.engine import LLMEngine
from pdserve.core.serving.sampling_proto import sampling_from_proto
from pdserve.core.serving.tier_runtime import TierRuntime
from pdserve.decode_service import metrics
from pdserve.decode_service.engine import DecodeEngine
from pdserve.v1 import common_pb2, decode_pb2


@dataclass(frozen=True)
class RequestStart:
    # Tokens counted before this stream (the prompt, a migration's resumed output); a
    # transferred request's are known once `start` has run.
    usage: common_pb2.Usage
    start: Callable[[], None]  # runs on the engine thread
    movable: bool  # a decode worker's request: once it drains, the router may move it


def transferred_start(runtime: TierRuntime, request: decode_pb2.DecodeRequest) -> RequestStart:
    """Decode.Generate's request: prefill's first token for a reservation made earlier."""
    engine = runtime.engine(DecodeEngine)
    usage = common_pb2.Usage()

    def start() -> None:
        engine.start(request.request_id, request.transfer_token, request.first_token_id)
        usage.prompt_tokens, usage.completion_tokens = engine.token_counts(request.request_id)

    return RequestStart(usage, start, movable=True)


def local_start(runtime: TierRuntime, request: decode_pb2.GenerateLocalRequest) -> RequestStart:
    """Decode.GenerateLocal's request: prefilled and decoded here (a prefill worker runs these
    too). Raises what the call ends with (validation, not accepting)."""
    runtime.check_accepting()
    params = sampling_from_proto(request.sampling, request.priority)
    engine = runtime.engine(LLMEngine)
    prompt = list(request.prompt_token_ids)
    resumed = list(request.resumed_output_token_ids)
    usage = common_pb2.Usage(prompt_tokens=len(prompt), completion_tokens=len(resumed))

    def start() -> None:
        engine.add_local(request.request_id, prompt, params, resumed)

    metrics.LOCAL_PREFILLS.inc()
    return RequestStart(usage, start, movable=isinstance(engine, DecodeEngine))
