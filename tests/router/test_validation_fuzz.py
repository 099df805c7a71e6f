"""Property: any GenerateRequest the proto can carry, extreme values included, either passes the
router's validation or is refused with InvalidRequestError naming a real field of the proto (a
dotted path such as `sampling.top_p`). Nothing else may escape: no other exception, no field name
a client could not look up."""

from __future__ import annotations

import asyncio

from google.protobuf.descriptor import Descriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.router.validation import RequestValidator
from pdserve.v1 import common_pb2, generation_pb2

UINT32 = st.integers(0, 2**32 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
# float fields are 32-bit on the wire: NaN, infinities, subnormals and the extremes included.
FLOAT32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
# Small ids (valid) and the whole uint32 range (mostly outside the vocabulary).
TOKEN_IDS = st.lists(st.one_of(st.integers(0, 1000), UINT32), max_size=12)
TEXT = st.text(max_size=40)


@st.composite
def sampling_params(draw: st.DrawFn) -> common_pb2.SamplingParams:
    message = common_pb2.SamplingParams(
        max_tokens=draw(st.one_of(st.integers(0, 64), UINT32)),
        temperature=draw(st.one_of(st.sampled_from([0.0, 0.7, 1.0]), FLOAT32)),
        top_p=draw(st.one_of(st.sampled_from([0.0, 0.9, 1.0]), FLOAT32)),
        top_k=draw(st.one_of(st.integers(0, 50), INT32)),
        stop=draw(st.lists(st.text(max_size=300), max_size=6)),
        stop_token_ids=draw(st.lists(UINT32, max_size=20)),
        ignore_eos=draw(st.booleans()),
    )
    if draw(st.booleans()):
        message.seed = draw(st.integers(0, 2**64 - 1))
    return message


@st.composite
def generate_requests(draw: st.DrawFn) -> generation_pb2.GenerateRequest:
    request = generation_pb2.GenerateRequest(priority=draw(INT32))
    which = draw(st.sampled_from(["prompt", "prompt_token_ids", "none"]))
    if which == "prompt":
        request.prompt = draw(TEXT)
    elif which == "prompt_token_ids":
        request.prompt_token_ids.ids.extend(draw(TOKEN_IDS))
    if draw(st.booleans()):
        request.sampling.CopyFrom(draw(sampling_params()))
    if draw(st.booleans()):
        request.request_id = draw(st.one_of(TEXT, st.text(min_size=250, max_size=300)))
    return request


def is_proto_field(descriptor: Descriptor, dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    field = descriptor.fields_by_name.get(head)
    if field is None:
        return False
    if not rest:
        return True
    return field.message_type is not None and is_proto_field(field.message_type, rest)


def test_field_paths_resolve_against_the_proto() -> None:
    descriptor = generation_pb2.GenerateRequest.DESCRIPTOR
    assert is_proto_field(descriptor, "sampling.top_p")
    assert is_proto_field(descriptor, "prompt_token_ids")
    assert not is_proto_field(descriptor, "top_p") and not is_proto_field(descriptor, "input")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=generate_requests())
def test_any_request_passes_or_names_a_real_field(
    validator: RequestValidator, request: generation_pb2.GenerateRequest
) -> None:
    try:
        valid = asyncio.run(validator.validate(request))
    except InvalidRequestError as refusal:
        assert is_proto_field(generation_pb2.GenerateRequest.DESCRIPTOR, refusal.field), refusal
        assert str(refusal).startswith(f"{refusal.field}: ")
        return
    assert valid.prompt_token_ids and valid.sampling.max_tokens >= 1
