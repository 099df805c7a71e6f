"""TierRuntime.wait: a caller cancelled while the engine's future is pending leaves it to resolve
later; its outcome is read then, so that a failure after the cancel (a prefill's send given up
30 s on) is not reported as a future whose exception was never retrieved."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
from types import SimpleNamespace
from typing import Any, cast

import pytest

from pdserve.core.serving.server import ServiceHost
from pdserve.core.serving.tier_runtime import TierRuntime


def test_an_error_after_the_callers_cancel_is_read_not_left_unretrieved() -> None:
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: reported.append(context)
        )
        runtime = TierRuntime(cast(ServiceHost, SimpleNamespace(draining=False)))
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        waiter = asyncio.ensure_future(runtime.wait(future, None))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        future.set_exception(RuntimeError("decode took no bytes"))
        await asyncio.sleep(0.05)  # the outcome is resolved on the loop
        del waiter
        gc.collect()  # an unread exception is reported when its future is collected

    asyncio.run(main())
    assert not reported, reported
