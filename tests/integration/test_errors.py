"""Bad input gets INVALID_ARGUMENT naming the field; a layout mismatch is refused; the service
keeps serving; a client that knows only the address finds the API by reflection."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster
from pdserve.v1 import common_pb2, generation_pb2, prefill_pb2, prefill_pb2_grpc

pytestmark = pytest.mark.integration

BAD_REQUESTS = {
    "prompt": generation_pb2.GenerateRequest(prompt=""),
    "prompt_token_ids": generation_pb2.GenerateRequest(
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 999_999])
    ),
    "sampling.temperature": generation_pb2.GenerateRequest(
        prompt="Hi", sampling=SamplingParams(temperature=-1.0)
    ),
    "sampling.top_p": generation_pb2.GenerateRequest(
        prompt="Hi", sampling=SamplingParams(top_p=1.5)
    ),
    "sampling.top_k": generation_pb2.GenerateRequest(
        prompt="Hi", sampling=SamplingParams(top_k=-3)
    ),
    "sampling.max_tokens": generation_pb2.GenerateRequest(
        prompt="Hi", sampling=SamplingParams(max_tokens=100_000)
    ),
}


@pytest.mark.parametrize("field", BAD_REQUESTS)
def test_bad_input_names_the_field_and_service_goes_on(cluster: Cluster, field: str) -> None:
    async def bad_then_good() -> str:
        async with GenerationClient.connect(cluster.router.address) as client:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await client.generate(BAD_REQUESTS[field])
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert field in (caught.value.details() or "")
            reply = await client.generate(
                build_request("Hello", sampling=SamplingParams(max_tokens=2))
            )
            return str(reply.text)

    assert asyncio.run(bad_then_good())


def test_layout_mismatch_is_refused_naming_both_layouts(cluster: Cluster) -> None:
    """A decode tier with another block size: prefill refuses before any byte moves."""
    foreign = common_pb2.TransferDescriptor(
        request_id="layout-check",
        worker_address=b"unused",
        block_ids=[0],
        layout=common_pb2.KVLayout(
            num_layers=30, num_kv_heads=3, head_dim=64, block_size=32, dtype="float32"
        ),
        transfer_token=b"0" * 16,
    )
    work = common_pb2.WorkRequest(request_id="layout-check", prompt_token_ids=[1, 2, 3])
    request = prefill_pb2.PrefillRequest(request=work, destination=foreign)
    with (
        grpc.insecure_channel(cluster.prefill[0].address) as channel,
        pytest.raises(grpc.RpcError) as caught,
    ):
        prefill_pb2_grpc.PrefillStub(channel).Prefill(request, timeout=30)
    error = caught.value
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert "block_size=32" in error.details() and "block_size=16" in error.details()  # type: ignore[attr-defined]


def test_a_client_knowing_only_the_address_discovers_and_calls(cluster: Cluster) -> None:
    with grpc.insecure_channel(cluster.router.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert "pdserve.v1.Generation" in database.get_services()
        pool = descriptor_pool.DescriptorPool(database)
        method = pool.FindServiceByName("pdserve.v1.Generation").methods_by_name["Generate"]
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        request = request_class(prompt="Hello", sampling={"max_tokens": 3})
        call = channel.unary_unary(
            "/pdserve.v1.Generation/Generate",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        reply = call(request, timeout=60)
    assert len(reply.token_ids) == 3
