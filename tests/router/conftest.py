"""A router (real servicer, registry and dispatcher on a grpc.aio server) over fake tiers.

`router_stack(...)` is an async context manager, used inside a test's own asyncio.run(), so
the fakes, the router and the client share one event loop on 127.0.0.1 ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest

from pdserve.client import GenerationClient
from pdserve.router.admission import Admission
from pdserve.router.config import RequestCaps, RouterConfig
from pdserve.router.dispatch import Dispatcher
from pdserve.router.registry import Registry
from pdserve.router.servicer import RouterServicer
from pdserve.router.validation import RequestValidator, load_validator
from pdserve.testing.fake_tiers import FakeTiers, fake_tiers
from pdserve.v1 import generation_pb2_grpc


@dataclass
class Stack:
    tiers: FakeTiers
    registry: Registry
    dispatcher: Dispatcher
    servicer: RouterServicer
    client: GenerationClient


StackFactory: TypeAlias = Callable[..., contextlib.AbstractAsyncContextManager[Stack]]


@pytest.fixture(scope="session")
def validator(model_dir: Path) -> RequestValidator:
    return load_validator(model_dir, RequestCaps(max_stop_strings=4))


@pytest.fixture
def router_stack(validator: RequestValidator) -> StackFactory:
    @contextlib.asynccontextmanager
    async def start(
        num_prefill: int = 1, num_decode: int = 1, **overrides: Any
    ) -> AsyncIterator[Stack]:
        async with fake_tiers(num_prefill, num_decode) as tiers:
            config = replace(
                RouterConfig(
                    prefill_targets=",".join(tiers.prefill_addresses),
                    decode_targets=",".join(tiers.decode_addresses),
                    # Tests poll by hand (registry.poll()) when they change a fake's load.
                    load_poll_interval_seconds=30.0,
                ),
                **overrides,
            )
            registry = Registry(config)
            await registry.start()
            dispatcher = Dispatcher(registry, config)
            admission = Admission(dispatcher, config)
            admission.validator = validator
            servicer = RouterServicer(admission)
            server = grpc.aio.server()
            generation_pb2_grpc.add_GenerationServicer_to_server(servicer, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            client = GenerationClient.connect(f"127.0.0.1:{port}")
            try:
                yield Stack(tiers, registry, dispatcher, servicer, client)
            finally:
                await client.close()
                await server.stop(None)
                await dispatcher.wait_aborts()
                await registry.close()

    return start


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Waits until `check()` holds (the router's cleanup runs in the background)."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    return eventually
