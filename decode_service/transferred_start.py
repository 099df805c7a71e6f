"""Decode.Generate's start on a decode worker: prefill's first token for a reservation made
earlier (core/serving/request_start.py's `StartTransferred`)."""

from __future__ import annotations

from pdserve.core.serving.request_start import RequestStart
from pdserve.core.serving.tier_runtime import TierRuntime
from pdserve.decode_service.engine import DecodeEngine
from pdserve.v1 import common_pb2, decode_pb2


def transferred_start(runtime: TierRuntime, request: decode_pb2.DecodeRequest) -> RequestStart:
    engine = runtime.engine(DecodeEngine)
    usage = common_pb2.Usage()

    def start() -> None:
        engine.start(request.request_id, request.transfer_token, request.first_token_id)
        usage.prompt_tokens, usage.completion_tokens = engine.token_counts(request.request_id)

    return RequestStart(usage, start, movable=True)
