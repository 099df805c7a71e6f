"""Which code a cancelled handler is counted under: the client's deadline fires on its own clock
and reaches the router as a plain cancel a moment before the router's copy of the deadline."""

from __future__ import annotations

import grpc

from pdserve.router.servicer import _cancel_code


def test_a_cancel_at_the_deadline_is_deadline_exceeded() -> None:
    assert _cancel_code(window=0.5, remaining=0.0) is grpc.StatusCode.DEADLINE_EXCEEDED
    # Transit and the grpc-timeout header's rounding: still the deadline.
    assert _cancel_code(window=0.5, remaining=0.03) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert _cancel_code(window=60.0, remaining=0.9) is grpc.StatusCode.DEADLINE_EXCEEDED


def test_an_earlier_cancel_or_one_without_deadline_is_cancelled() -> None:
    assert _cancel_code(window=0.5, remaining=0.3) is grpc.StatusCode.CANCELLED
    assert _cancel_code(window=60.0, remaining=30.0) is grpc.StatusCode.CANCELLED
    assert _cancel_code(window=None, remaining=None) is grpc.StatusCode.CANCELLED
