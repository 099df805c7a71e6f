"""Live migration between two decode engines (in-process transfer): a suspended request's KV
moves to another decode worker, which continues it from the exact next token: the same tokens
(greedy and seeded) and the same text as the undisturbed run, no block left held anywhere. And
the move that comes before it: a prompt still queued for prefill redirected to another worker.

The real-process version (router, UCX, SIGTERM) is tests/chaos/test_live_migration.py.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.errors import KVNotOnDeviceError, RequestSuspended, UnknownRequestError
from pdserve.core.kv.cache import KVCache
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.transfer.interface import (
    KVSenderLike,
    PieceSendLike,
    SendResult,
    TransferDescriptor,
)
from pdserve.decode_service.engine import DecodeEngine, DecodeLimits, Suspension
from pdserve.prefill_service.engine import PrefillEngine
from tests.fakes.local_transfer import LocalKVReceiver, LocalKVSender, LocalTransferHub

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

MAX_TOKENS = 24
# Never in the output: the detokenizer holds back its length - 1 characters, which the draining
# worker never releases and the other one must.
NEVER = "@@ this never appears in the output @@"
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, stop=(NEVER,))
SEEDED = SamplingParams(
    max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=7, ignore_eos=True, stop=(NEVER,)
)


@dataclass
class Stream:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    suspended: bool = False


@dataclass
class Workers:
    prefill: PrefillEngine
    source: DecodeEngine
    target: DecodeEngine

    def start(self, request_id: str, prompt: list[int], params: SamplingParams) -> Stream:
        """Reserve on the source, prefill into it, Generate: the stream of its first token."""
        destination = self.source.reserve(request_id, prompt, params).result(timeout=0)
        outcome = self.prefill.submit(request_id, prompt, params, destination)
        while not outcome.done():
            self.prefill.step()
        self.source.start(request_id, destination.token, outcome.result().first_token_id)
        return Stream()

    def all_free(self) -> bool:
        engines = (self.prefill, self.source, self.target)
        pools = [engine.scheduler.kv_manager.block_pool for engine in engines]
        return all(pool.num_free == pool.num_blocks for pool in pools)


def _drive(engine: DecodeEngine, stream: Stream, until_tokens: int | None = None) -> None:
    """Polls and steps `engine` until the stream finishes, is suspended, or has the tokens."""
    while not (stream.finished or stream.suspended):
        if until_tokens is not None and len(stream.tokens) >= until_tokens:
            return
        for _, item in engine.poll():
            _take(stream, item)
        for delta in engine.step() if engine.has_unfinished() else []:
            _take(stream, delta)


def _take(stream: Stream, item: object) -> None:
    if isinstance(item, RequestSuspended):
        stream.suspended = True
        return
    assert not isinstance(item, BaseException), item
    stream.tokens.extend(item.new_token_ids)  # type: ignore[attr-defined]
    stream.text += item.text  # type: ignore[attr-defined]
    stream.finished = item.finished  # type: ignore[attr-defined]


def _engines(
    model_dir: Path,
    ttl_s: float = 120.0,
    migration_sender: Callable[[LocalKVSender], KVSenderLike] = lambda sender: sender,
) -> Workers:
    hub = LocalTransferHub()
    config = EngineConfig(num_kv_blocks=96)
    prefill = PrefillEngine(model_dir, config, LocalKVSender(hub))

    def decode(limits: DecodeLimits) -> DecodeEngine:
        return DecodeEngine(
            model_dir,
            config,
            lambda cache: LocalKVReceiver(hub, cache, 4),
            limits,
            sender_factory=lambda: migration_sender(LocalKVSender(hub)),
        )

    return Workers(prefill, decode(DecodeLimits(reservation_ttl_s=ttl_s)), decode(DecodeLimits()))


@pytest.fixture(scope="module")
def workers(model_dir: Path) -> Workers:
    return _engines(model_dir)


def _move(
    workers: Workers,
    request_id: str,
    prompt: list[int],
    params: SamplingParams,
    streamed: list[int],
) -> TransferDescriptor:
    """Reserve live on the target, push the KV from the source, Generate there."""
    reservation = workers.target.reserve(request_id, prompt, params, streamed[:-1], True)
    destination = reservation.result(timeout=0)
    sent = workers.source.migrate(request_id, destination).result(timeout=5)
    assert sent.nbytes == destination.nbytes > 0
    workers.target.start(request_id, destination.token, streamed[-1])
    return destination


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("cut", [1, 9, 16])
def test_a_moved_stream_continues_exactly(
    workers: Workers, prompts: list[list[int]], params: SamplingParams, cut: int
) -> None:
    prompt = prompts[3]
    undisturbed = workers.start(f"whole-{cut}", prompt, params)
    _drive(workers.source, undisturbed)
    assert len(undisturbed.tokens) == MAX_TOKENS

    request_id = f"moved-{cut}"
    before = workers.start(request_id, prompt, params)
    _drive(workers.source, before, until_tokens=cut)
    assert workers.source.suspend(request_id) is Suspension.KV_READY
    _drive(workers.source, before)  # the suspension reaches the stream after its last token
    assert before.suspended and cut <= len(before.tokens) < MAX_TOKENS  # a step may add one
    _move(workers, request_id, prompt, params, before.tokens)
    after = Stream()
    _drive(workers.target, after)
    assert before.tokens + after.tokens == undisturbed.tokens
    assert before.text + after.text == undisturbed.text
    assert workers.all_free()


def test_a_request_not_caught_up_is_freed_and_refuses_migrate(
    workers: Workers, prompts: list[list[int]]
) -> None:
    """Queued, its prompt not yet prefilled here: no KV to move; the router re-prefills it."""
    request_id = "waiting"
    workers.target.add_local(request_id, prompts[4], GREEDY)  # queued, not yet prefilled
    assert workers.target.suspend(request_id) is Suspension.KV_FREED
    with pytest.raises(KVNotOnDeviceError):
        workers.target.migrate(request_id, _any_destination(workers))
    with pytest.raises(UnknownRequestError):
        workers.target.migrate(request_id, _any_destination(workers))
    assert workers.target.suspend("unknown") is Suspension.NOT_RUNNING
    workers.target.poll()  # delivers the suspension
    assert workers.all_free()


def test_a_suspended_request_nobody_moves_is_freed(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    workers = _engines(model_dir, ttl_s=0.05)
    stream = workers.start("forgotten", prompts[3], GREEDY)
    _drive(workers.source, stream, until_tokens=3)
    assert workers.source.suspend("forgotten") is Suspension.KV_READY
    assert workers.source.pending()
    time.sleep(0.1)
    workers.source.poll()
    assert not workers.source.pending() and workers.all_free()


class _HeldSender:
    """Pushes whose completion waits for `release` (a slow link)."""

    def __init__(self, inner: LocalKVSender, release: concurrent.futures.Future[None]) -> None:
        self.inner = inner
        self.release = release
        self.bytes_sent = self.pieces_sent = 0
        self.seconds = 0.0

    def open(
        self, descriptor: TransferDescriptor, kv_cache: KVCache, blocks: list[int], tokens: int
    ) -> PieceSendLike:
        return _HeldSend(self.inner.open(descriptor, kv_cache, blocks, tokens), self.release)

    def close(self) -> None:
        self.inner.close()


class _HeldSend:
    def __init__(self, inner: PieceSendLike, release: concurrent.futures.Future[None]) -> None:
        self.inner = inner
        self.release = release
        self.descriptor = inner.descriptor

    def push(self, piece: int) -> None:
        self.inner.push(piece)

    def done(self) -> concurrent.futures.Future[SendResult]:
        sent, settled = self.inner.done(), concurrent.futures.Future[SendResult]()
        self.release.add_done_callback(lambda _: settled.set_result(sent.result()))
        return settled


def test_a_draining_worker_stays_busy_until_its_pushes_settle(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    """Stopping the server would cut a Migrate still pushing KV (a slow link): the drain, which
    waits while the engine is pending, must see the push."""
    release = concurrent.futures.Future[None]()
    workers = _engines(model_dir, migration_sender=lambda sender: _HeldSender(sender, release))
    stream = workers.start("slow-link", prompts[3], GREEDY)
    _drive(workers.source, stream, until_tokens=3)
    assert workers.source.suspend("slow-link") is Suspension.KV_READY
    _drive(workers.source, stream)
    reservation = workers.target.reserve("slow-link", prompts[3], GREEDY, stream.tokens[:-1], True)
    sending = workers.source.migrate("slow-link", reservation.result(timeout=0))
    assert not sending.done() and workers.source.pending()  # nothing suspended, a push on its way
    release.set_result(None)
    assert sending.result(timeout=5).nbytes > 0
    assert not workers.source.pending()
    workers.target.start("slow-link", reservation.result().token, stream.tokens[-1])
    after = Stream()
    _drive(workers.target, after)
    assert after.finished and len(stream.tokens) + len(after.tokens) == MAX_TOKENS
    assert workers.all_free()


def test_a_live_reservation_leaves_room_for_a_token(
    workers: Workers, prompts: list[list[int]]
) -> None:
    params = SamplingParams(max_tokens=4, temperature=0.0)
    with pytest.raises(InvalidRequestError, match="resumed_output_token_ids"):
        workers.target.reserve("full", prompts[3], params, [1, 2, 3], True)


def test_a_queued_prompt_redirected_to_another_decode_worker_continues_there(
    workers: Workers, prompts: list[list[int]]
) -> None:
    """Prefill.Redirect at the engine: a prompt queued for a decode worker that leaves is
    pointed at another worker's reservation; its KV lands there and decodes as undisturbed.
    Once prefilled it is no longer here to redirect; a destination that does not fit the prompt
    is refused naming the field."""
    prompt = prompts[3]
    undisturbed = workers.start("not-redirected", prompt, GREEDY)
    _drive(workers.source, undisturbed)
    request_id = "redirected"
    first = workers.source.reserve(request_id, prompt, GREEDY).result(timeout=0)
    outcome = workers.prefill.submit(request_id, prompt, GREEDY, first)
    with pytest.raises(InvalidRequestError, match=r"destination\.block_ids"):
        workers.prefill.redirect(request_id, _any_destination(workers))
    second = workers.target.reserve(request_id, prompt, GREEDY).result(timeout=0)
    assert workers.prefill.redirect(request_id, second)
    workers.source.abort(request_id)  # the router gives the first reservation back
    while not outcome.done():
        workers.prefill.step()
    assert not workers.prefill.redirect(request_id, second)
    workers.target.start(request_id, second.token, outcome.result().first_token_id)
    after = Stream()
    _drive(workers.target, after)
    assert after.tokens == undisturbed.tokens and after.text == undisturbed.text
    assert workers.all_free()


def _any_destination(workers: Workers) -> TransferDescriptor:
    return TransferDescriptor(
        request_id="x",
        peer_address=b"nowhere",
        block_ids=(0,),
        layout=workers.target.layout,
        token=bytes(16),
    )
