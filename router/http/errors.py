"""Failures in OpenAI's error shape, with the HTTP status that matches the gRPC code.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": "INVALID_ARGUMENT"}}

The code comes from the same `errors.to_status` as the gRPC door, so a request refused there with
RESOURCE_EXHAUSTED is refused here with 429, UNAVAILABLE with 503, INVALID_ARGUMENT with 400.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import grpc
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.router import metrics
from pdserve.router.errors import retry_after, to_status

_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,  # nginx's "client closed request": nobody reads it
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_ERROR_TYPE = {
    400: "invalid_request_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}
# The router's validator names proto fields; the client sent OpenAI's names.
_PARAMS = {
    "prompt_token_ids": "prompt",
    "sampling.stop": "stop",
    "sampling.structured": "structured_outputs",
    **{
        f"sampling.structured.{field}": f"structured_outputs.{field}"
        for field in ("json", "json_object", "regex", "grammar", "choice")
    },
}
_NO_RENAMES: Mapping[str, str] = {}
_FIELD_FIRST = re.compile(r"^([a-z_][a-z0-9_.]*): ")


class UnknownModelError(InvalidRequestError):
    """The body names a model this router does not serve (404, as OpenAI answers)."""

    def __init__(self, requested: str, served: str) -> None:
        super().__init__("model", f"{requested!r} is not served here (try {served!r})")


@dataclass(frozen=True)
class ApiError:
    code: grpc.StatusCode
    message: str
    param: str | None = None
    retry_after_s: float | None = None  # sent as Retry-After (whole seconds, rounded up)

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS.get(self.code, 500)

    def body(self) -> dict[str, object]:
        error_type = _ERROR_TYPE.get(self.http_status, "server_error")
        return {
            "error": {
                "message": self.message,
                "type": error_type,
                "param": self.param,
                "code": self.code.name,
            }
        }

    def response(self) -> JSONResponse:
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(math.ceil(self.retry_after_s))
        return JSONResponse(self.body(), status_code=self.http_status, headers=headers)


def api_error(error: BaseException, params: Mapping[str, str] = _NO_RENAMES) -> ApiError:
    """The OpenAI-shaped error for `error`; `params` renames validator fields to what this
    request called them (`prompt` -> `messages` on the chat endpoint)."""
    if isinstance(error, UnknownModelError):
        return ApiError(grpc.StatusCode.NOT_FOUND, str(error), "model")
    code, message = to_status(error)
    param = param_of(error.field, params) if isinstance(error, InvalidRequestError) else None
    if param is None and code is grpc.StatusCode.INVALID_ARGUMENT:
        named = _FIELD_FIRST.match(message)  # a worker's refusal: "sampling.x: problem"
        param = param_of(named.group(1), params) if named else None
    if param is not None and not message.startswith(param):
        message = f"{param}: {message.split(': ', 1)[-1]}"
    return ApiError(code, message, param, retry_after(error))


def param_of(field: str, params: Mapping[str, str]) -> str:
    """`sampling.max_tokens` -> `max_tokens`, unless `params` names it otherwise."""
    return params.get(field) or _PARAMS.get(field, field.removeprefix("sampling."))


async def on_validation_error(request: Request, error: Exception) -> JSONResponse:
    """FastAPI's body validation: 400 (not FastAPI's 422) naming the first bad parameter."""
    assert isinstance(error, RequestValidationError)  # registered for this type only
    first = error.errors()[0]
    location = [str(part) for part in first["loc"] if part != "body"]
    param = location[0] if location else "body"  # OpenAI names the top-level parameter
    message = f"{'.'.join(location) or 'body'}: {first['msg']}"
    metrics.REQUESTS.labels(request.url.path, grpc.StatusCode.INVALID_ARGUMENT.name).inc()
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, message, param).response()
