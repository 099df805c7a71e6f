"""Errors that cross from the engines to the gRPC edge, each with one status code (grpc_errors)."""

from __future__ import annotations


class QueueFullError(RuntimeError):
    """Every queue is full: the caller should back off (RESOURCE_EXHAUSTED)."""


class UnknownRequestError(KeyError):
    """No such request here, or the caller's transfer token does not match (NOT_FOUND)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown request"


class KVNotArrivedError(RuntimeError):
    """The prompt's KV never reached the decode worker (ABORTED: retry the whole request)."""


class NotServedHereError(RuntimeError):
    """The call needs another tier's engine (FAILED_PRECONDITION): Decode.Reserve on a prefill
    worker, which serves only the Decode calls that run a request end to end."""


class DrainingError(RuntimeError):
    """The worker is shutting down and takes no new work (UNAVAILABLE)."""


class TransferTokenError(PermissionError):
    """The caller's transfer token does not match the reservation (PERMISSION_DENIED)."""


class KVNotOnDeviceError(RuntimeError):
    """A suspended request's KV is not all on the device, so it cannot move as it is
    (FAILED_PRECONDITION: re-prefill it elsewhere)."""


class RequestSuspended(Exception):
    """Ends a suspended request's stream on this worker (not an error: the request goes on on
    another worker after the tokens already streamed)."""
