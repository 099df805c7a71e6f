"""A one-line progress display on stderr while a load run is going."""

from __future__ import annotations

import asyncio
import time
from typing import TextIO

from pdserve.loadtest.calls import CallResult


class Progress:
    """Counts calls as they start and finish, and redraws one status line every `interval_s`."""

    def __init__(self, stream: TextIO | None, interval_s: float = 0.5) -> None:
        self._stream = stream
        self._interval_s = interval_s
        self._started_at = time.perf_counter()
        self.in_flight = 0
        self.done = 0
        self.errors = 0

    def call_started(self) -> None:
        self.in_flight += 1

    def call_finished(self, result: CallResult | None) -> None:
        """`result` None: the call was dropped from the report (duration-stop ignore)."""
        self.in_flight -= 1
        if result is not None:
            self.done += 1
            self.errors += 0 if result.ok else 1

    def line(self) -> str:
        elapsed = time.perf_counter() - self._started_at
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return (
            f"{elapsed:6.1f}s  {self.done} done  {self.errors} errors  "
            f"{self.in_flight} in flight  {rate:.1f} rps"
        )

    async def redraw_forever(self) -> None:
        """Redraw until cancelled; on a terminal in place, elsewhere one line per tick."""
        if self._stream is None:
            return
        end = "\r" if self._stream.isatty() else "\n"
        while True:
            await asyncio.sleep(self._interval_s)
            self._stream.write(self.line() + end)
            self._stream.flush()

    def finish(self) -> None:
        if self._stream is not None:
            self._stream.write(self.line() + "\n")
            self._stream.flush()
