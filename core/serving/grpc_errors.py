"""One mapping from pdserve's exceptions to gRPC status codes, used by every servicer."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from pdserve.core.errors import (
    DrainingError,
    KVNotArrivedError,
    KVNotOnDeviceError,
    NotServedHereError,
    QueueFullError,
    TransferTokenError,
    UnknownRequestError,
)
from pdserve.core.sampling_params import DuplicateRequestError, InvalidRequestError
from pdserve.core.transfer.interface import LayoutMismatchError, TransferError

log = logging.getLogger(__name__)

_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (DuplicateRequestError, grpc.StatusCode.ALREADY_EXISTS),  # before its base class
    (TransferTokenError, grpc.StatusCode.PERMISSION_DENIED),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (LayoutMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (NotServedHereError, grpc.StatusCode.FAILED_PRECONDITION),
    (KVNotOnDeviceError, grpc.StatusCode.FAILED_PRECONDITION),
    (QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UnknownRequestError, grpc.StatusCode.NOT_FOUND),
    (KVNotArrivedError, grpc.StatusCode.ABORTED),
    (DrainingError, grpc.StatusCode.UNAVAILABLE),
    (TransferError, grpc.StatusCode.UNAVAILABLE),
)


def status_code_for(error: BaseException) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


@asynccontextmanager
async def grpc_errors(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:  # type: ignore[type-arg]
    """Turns an engine exception into the call's status; the server keeps serving."""
    try:
        yield
    except grpc.aio.AbortError:
        raise
    except Exception as error:  # every failure ends the call with a status, never a hang
        code = status_code_for(error)
        if code is grpc.StatusCode.INTERNAL:
            log.error("internal error", exc_info=error)  # a bug: keep the traceback
        await context.abort(code, str(error) or type(error).__name__)
