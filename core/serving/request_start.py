"""How a worker starts a Decode request, whichever stream carries its deltas: its own Generate /
GenerateLocal call, or the router's Multiplex stream (one preparation, two relays).

Any worker starts a local request (GenerateLocal: prefilled and decoded here; a prefill worker
runs these when the router lends it streams). A transferred one (Generate: prefill's first token
for a reservation made earlier) needs a decode worker, which passes its own `StartTransferred`;
elsewhere it is refused (FAILED_PRECONDITION).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from pdserve.core.engine import LLMEngine
from pdserve.core.errors import NotServedHereError
from pdserve.core.serving import stream_metrics
from pdserve.core.serving.tier_runtime import TierRuntime
from pdserve.core.serving.work_request import work_from_proto
from pdserve.core.structured.params import StructuredOutputsParams
from pdserve.v1 import common_pb2, decode_pb2


@dataclass(frozen=True)
class RequestStart:
    # Tokens counted before this stream (the prompt, a migration's resumed output); a
    # transferred request's are known once `start` has run.
    usage: common_pb2.Usage
    start: Callable[[], None]  # runs on the engine thread
    movable: bool  # once this worker drains, the router may move the request elsewhere
    # Its structured constraint, to compile (TierRuntime.compile_grammar) before `start`; None
    # where there is none or it was compiled earlier (a reservation's).
    structured: StructuredOutputsParams | None = None
    # The tokens `start` gives the engine to compute: a local prompt's (and a migration's
    # resumed output); 0 for a transferred request, whose KV arrived.
    prompt_tokens: int = 0


StartTransferred: TypeAlias = Callable[[TierRuntime, decode_pb2.DecodeRequest], RequestStart]


def local_start(runtime: TierRuntime, request: decode_pb2.GenerateLocalRequest) -> RequestStart:
    """Decode.GenerateLocal's request. Raises what the call ends with (validation, not
    accepting)."""
    runtime.check_accepting()
    work = work_from_proto(request.request)
    engine = runtime.engine(LLMEngine)
    usage = common_pb2.Usage(
        prompt_tokens=len(work.prompt_token_ids),
        completion_tokens=len(work.resumed_output_token_ids),
    )

    def start() -> None:
        engine.add_local(
            work.request_id, work.prompt_token_ids, work.params, work.resumed_output_token_ids
        )

    stream_metrics.LOCAL_PREFILLS.inc()
    return RequestStart(
        usage,
        start,
        movable=engine.streams_move_on_drain,
        structured=work.params.structured_outputs,
        prompt_tokens=len(work.prompt_token_ids) + len(work.resumed_output_token_ids),
    )


def refuse_transferred(runtime: TierRuntime, request: decode_pb2.DecodeRequest) -> RequestStart:
    """A worker without reservations (a lent prefill worker) has no KV to continue from."""
    raise NotServedHereError(
        f"request_id: {request.request_id!r}: Decode.Generate needs a decode worker's reservation"
    )
