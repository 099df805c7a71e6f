"""What every KV sender does whatever carries the bytes: its counters, and the push of one
transfer piece by piece (checks, the gather into the staging piece, timing, the result).

`KVSender` (UCX) and the in-process fake of the engine tests (tests/fakes/local_transfer.py) differ
only in how a gathered piece reaches the receiver (`PieceSendBase._send`) and in when `done()`
learns that it did; keeping the rest here means the fake cannot drift from what prefill runs.
"""

from __future__ import annotations

import abc
import threading
import time

from pdserve.core.kv.cache import KVCache
from pdserve.core.transfer.interface import (
    SendResult,
    TransferDescriptor,
    TransferError,
    misplaced_push,
)
from pdserve.core.transfer.staging import Piece, Staging, block_index


class SendCounters:
    """Totals of delivered transfers (read by /metrics from other threads)."""

    def __init__(self) -> None:
        self.bytes_sent = 0  # whole blocks delivered, K and V of every layer
        self.pieces_sent = 0  # messages delivered (one per group of layers)
        self.seconds = 0.0  # summed first push -> delivered time (gathers + wire)
        self._count_lock = threading.Lock()

    def count(self, nbytes: int, pieces: int, seconds: float) -> None:
        with self._count_lock:
            self.bytes_sent += nbytes
            self.pieces_sent += pieces
            self.seconds += seconds


class PieceSendBase(abc.ABC):
    """One transfer being pushed: `push(piece)` per group of layers, then `done()` exactly once."""

    def __init__(
        self, descriptor: TransferDescriptor, cache: KVCache, src: list[int], staging: Staging
    ) -> None:
        self.descriptor = descriptor
        self._cache = cache
        self._index = block_index(cache, src)
        self._staging = staging
        self._started: float | None = None  # the first push: open() precedes the forward
        self._gather_s = 0.0
        self._pushed: set[int] = set()
        self._errors: list[BaseException] = []

    def push(self, piece: int) -> None:
        """Gathers piece `piece` and hands it to the wire; never raises (a failure fails
        `done()`), so the prefill engine can call it from inside the forward pass."""
        misplaced = misplaced_push(piece, self.descriptor.num_pieces, self._pushed)
        if misplaced is not None:
            self._errors.append(misplaced)
            return
        self._pushed.add(piece)
        started = time.perf_counter()
        self._started = self._started or started
        target = self._staging.pieces[piece]
        target.gather_from(self._cache, self._index, self.descriptor.token)
        self._gather_s += time.perf_counter() - started
        self._send(piece, target)

    @abc.abstractmethod
    def _send(self, piece: int, target: Piece) -> None:
        """Hands a gathered piece to the wire; a failure goes to `self._errors`."""

    def _note_missing_pieces(self) -> None:
        missing = sorted(set(range(self.descriptor.num_pieces)) - self._pushed)
        if missing and not self._errors:
            self._errors.append(TransferError(f"pieces {missing} were never pushed"))

    def _delivered(self, counters: SendCounters) -> SendResult:
        """Counts the whole transfer as delivered and describes it."""
        seconds = time.perf_counter() - (self._started or time.perf_counter())
        nbytes = self._staging.payload_nbytes
        counters.count(nbytes, len(self._pushed), seconds)
        return SendResult(self.descriptor.request_id, nbytes, seconds, self._gather_s)
