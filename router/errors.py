"""One mapping from whatever went wrong to the status code and message the client sees."""

from __future__ import annotations

import asyncio
import logging

import grpc

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.router.registry import NoHealthyWorkerError

log = logging.getLogger(__name__)


class RouterError(Exception):
    """A failure the router decided on itself, with the code the client must get, and when a
    retry may succeed (None: not said)."""

    def __init__(
        self, code: grpc.StatusCode, message: str, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


def retry_after(error: BaseException) -> float | None:
    """Seconds after which a retry of the failed request may succeed, if the router said."""
    return error.retry_after_s if isinstance(error, RouterError) else None


# Worker codes the client sees unchanged, details included (FAILED_PRECONDITION names both KV
# layouts; INVALID_ARGUMENT names the field).
_PASSED_THROUGH = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
    }
)
# Codes of the internal contract that mean the router and a worker disagree: a server fault
# (ALREADY_EXISTS: the ids the workers see are the router's own, never the client's).
_INTERNAL = frozenset(
    {
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def to_status(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The client-facing code and message for `error`."""
    if isinstance(error, RouterError):
        return error.code, error.message
    if isinstance(error, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, NoHealthyWorkerError):
        return grpc.StatusCode.UNAVAILABLE, str(error)
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "router: deadline exceeded"
    if isinstance(error, grpc.aio.AioRpcError):
        return _worker_status(error)
    log.exception("router: unexpected error", exc_info=error)
    return grpc.StatusCode.INTERNAL, f"router: internal error ({type(error).__name__})"


def _worker_status(error: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    code, details = error.code(), error.details() or ""
    if code in _PASSED_THROUGH:
        return code, details
    if code == grpc.StatusCode.ABORTED:
        # Decode lost the prompt KV (it never arrived): nothing the client did; a retry may work.
        return grpc.StatusCode.UNAVAILABLE, details
    if code in _INTERNAL:
        return grpc.StatusCode.INTERNAL, f"router: worker answered {code.name}: {details}"
    return code, details
