"""Turns a config's `data` objects (protobuf JSON, as ghz takes them) into request messages."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeAlias

from google.protobuf import json_format

from pdserve.loadtest.config import LoadConfigError, Method
from pdserve.v1 import generation_pb2

RequestMessage: TypeAlias = generation_pb2.GenerateRequest | generation_pb2.InfoRequest


def build_messages(
    method: Method, data: tuple[Mapping[str, Any], ...]
) -> tuple[RequestMessage, ...]:
    """One message per data item; request number i uses item i % len (ghz's round robin)."""
    return tuple(_build_one(method, item, index) for index, item in enumerate(data))


def _build_one(method: Method, item: Mapping[str, Any], index: int) -> RequestMessage:
    if "{{" in json.dumps(item):
        # ghz would expand Go templates here; sending them verbatim would mislead.
        raise LoadConfigError(f"data[{index}]: ghz call templates ({{{{...}}}}) are not supported")
    message: RequestMessage = (
        generation_pb2.InfoRequest() if method is Method.INFO else generation_pb2.GenerateRequest()
    )
    try:
        json_format.ParseDict(dict(item), message)
    except json_format.ParseError as error:
        raise LoadConfigError(f"data[{index}]: {error}") from error
    return message
