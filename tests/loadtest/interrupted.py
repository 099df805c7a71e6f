"""Load drives in a process of their own, for the Ctrl-C tests (tests/loadtest/test_interrupt.py):

    python -m tests.loadtest.interrupted TARGET MODE

MODE `loadtest`: one interruptible drive, as `pdserve loadtest` runs it, printing its end reason;
`phases`: two drives gathered in one event loop, as `bench autoscale` runs its trace's phases.
Each stream asks for 1,000 tokens, far more than the tests wait; "started" is printed once the
drives are running."""

from __future__ import annotations

import asyncio
import sys

from pdserve.loadtest.config import LoadConfig, config_from_dict
from pdserve.loadtest.driver import drive


def _streams(target: str) -> LoadConfig:
    return config_from_dict(
        {
            "call": "pdserve.v1.Generation.GenerateStream",
            "host": target,
            "insecure": True,
            "total": 2,
            "concurrency": 2,
            "data": [{"prompt": "ok", "sampling": {"max_tokens": 1000}}],
        }
    )


async def _loadtest(config: LoadConfig) -> None:
    running = asyncio.ensure_future(drive(config, interruptible=True))
    await asyncio.sleep(0.2)
    print("started", flush=True)
    outcome = await running
    print(outcome.end_reason.value, flush=True)


async def _phases(config: LoadConfig) -> None:
    running = asyncio.gather(drive(config), drive(config))
    await asyncio.sleep(0.2)
    print("started", flush=True)
    await running


def main() -> None:
    target, mode = sys.argv[1:]
    config = _streams(target)
    asyncio.run(_loadtest(config) if mode == "loadtest" else _phases(config))


if __name__ == "__main__":
    main()
