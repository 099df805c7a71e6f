"""The router bench's child-process servers: the zero-work fake tiers and the bare relay.

`pdserve.bench.router.cli` starts each in a process of its own (its hidden `--serve-fakes` and
`--serve-relay` flags call `serve_fakes` and `serve_relay`); `TierStubs` is also the client's own
"direct" path, the router's three internal calls made with no router in between.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import grpc

from pdserve.testing.fake_tiers import fake_tiers
from pdserve.v1 import (
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    prefill_pb2,
    prefill_pb2_grpc,
)


def serve_fakes(address_file: Path, step_seconds: float = 0.0) -> None:
    """One fake prefill and one fake decode (pdserve.testing.fake_tiers) until SIGTERM; their
    addresses go to `address_file` once both serve. Decode steps every `step_seconds` (0: once
    the router has read the last step); each of its answers and tokens takes that long, on the
    per-request path too, so both relay paths are offered the same tokens per second."""

    async def body() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with fake_tiers() as tiers:
            tiers.decode[0].knobs.step_seconds = 0.0
            tiers.decode[0].knobs.delay_seconds = step_seconds
            addresses = [tiers.prefill_addresses[0], tiers.decode_addresses[0]]
            # Whole or not at all: a reader polls for the file.
            partial = address_file.with_name(address_file.name + ".partial")
            partial.write_text(json.dumps(addresses))
            partial.replace(address_file)
            await stop.wait()

    asyncio.run(body())


class TierStubs:
    """Stubs to one fake prefill and one fake decode worker."""

    def __init__(self, prefill_target: str, decode_target: str) -> None:
        self.prefill = prefill_pb2_grpc.PrefillStub(grpc.aio.insecure_channel(prefill_target))
        self.decode = decode_pb2_grpc.DecodeStub(grpc.aio.insecure_channel(decode_target))

    async def generate(
        self, request_id: str, ids: list[int], sampling: common_pb2.SamplingParams
    ) -> list[int]:
        """What the router does for one request, minus everything else it does."""
        work = common_pb2.WorkRequest(
            request_id=request_id, prompt_token_ids=ids, sampling=sampling
        )
        descriptor = await self.decode.Reserve(decode_pb2.ReserveRequest(request=work))
        prefill = prefill_pb2.PrefillRequest(request=work, destination=descriptor)
        result = await self.prefill.Prefill(prefill)
        generate = decode_pb2.DecodeRequest(
            request_id=request_id,
            transfer_token=descriptor.transfer_token,
            first_token_id=result.first_token_id,
        )
        return [
            token async for delta in self.decode.Generate(generate) for token in delta.token_ids
        ]


# unused-ignore: the ignore is needed only while mypy cannot resolve pdserve.v1 (then Any).
class BareRelay(generation_pb2_grpc.GenerationServicer):  # type: ignore[misc, unused-ignore]
    """Reserve -> Prefill -> Generate per call and nothing else: the floor of a gRPC hop."""

    def __init__(self, prefill_target: str, decode_target: str) -> None:
        self.tiers = TierStubs(prefill_target, decode_target)
        self.count = 0

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: object
    ) -> generation_pb2.GenerateResponse:
        self.count += 1
        request_id = f"relay-{self.count}"
        ids = list(request.prompt_token_ids.ids)
        tokens = await self.tiers.generate(request_id, ids, request.sampling)
        return generation_pb2.GenerateResponse(request_id=request_id, token_ids=tokens)


def serve_relay(port: int, prefill_target: str, decode_target: str) -> None:
    """Child process: the bare relay until SIGTERM."""

    async def body() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        server = grpc.aio.server()
        # Only Generate is relayed; the servicer's other methods stay unimplemented on purpose.
        relay = BareRelay(prefill_target, decode_target)  # type: ignore[abstract]
        generation_pb2_grpc.add_GenerationServicer_to_server(relay, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await stop.wait()
        await server.stop(None)

    asyncio.run(body())
