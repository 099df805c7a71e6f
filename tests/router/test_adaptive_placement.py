"""The adaptive placement's decision on synthetic loads, priced by a cost model simple enough to
check by hand: a step costs 50 ms, plus 1 ms per prompt token, plus 5 ms per decoding stream."""

from __future__ import annotations

import dataclasses

import pytest

from pdserve.costmodel.correction import StepPhase, StepWindow
from pdserve.costmodel.profile import BlockCosts, CostModel, Profile
from pdserve.costmodel.step_budget import StepCosts
from pdserve.costmodel.step_shape import StepShape
from pdserve.router.placement.adaptive import WorkerRole, WorkerState, place_adaptive
from pdserve.router.placement.prefill_place import PlacementReason, PrefillPlace

FIXED, PER_TOKEN, PER_STREAM = 0.05, 0.001, 0.005
PREFILL, DECODE = WorkerRole.PREFILL, WorkerRole.DECODE


def costs(delivery_per_block: float = 0.01, itl_slo: float | None = None) -> StepCosts:
    model = CostModel((FIXED, PER_TOKEN, 0.0, PER_STREAM, 0.0))
    blocks = BlockCosts(1, 0.0, 0.0, delivery_per_block, wire_bytes_per_s=1e30)
    return StepCosts(Profile(model, blocks, block_size=16), 2048, itl_slo)


def decode(running: int = 0, pending: int = 0, name: str = "d") -> WorkerState:
    prompts = 1 if pending else 0
    return WorkerState(name, DECODE, DECODE, running, running * 100, prompts, pending)


def prefill(running: int = 0, pending: int = 0, role: WorkerRole = PREFILL) -> WorkerState:
    prompts = 1 if pending else 0
    return WorkerState("p", PREFILL, role, running, running * 100, prompts, pending)


def test_without_a_prefill_worker_every_prompt_is_local() -> None:
    choice = place_adaptive(3000, 1, [decode(running=30)], costs())
    assert choice.placement.place is PrefillPlace.LOCAL
    assert choice.placement.reason is PlacementReason.NO_PREFILL_WORKER


def test_on_an_idle_pair_a_prompt_stays_where_it_decodes() -> None:
    """Same prefill time either way; remote adds the KV's delivery (7 blocks x 10 ms)."""
    choice = place_adaptive(100, 1, [decode(), prefill()], costs())
    assert (choice.option.place, choice.option.decode.address) == (PrefillPlace.LOCAL, "d")
    assert choice.placement.reason is PlacementReason.LOCAL_CHEAPER
    assert choice.option.ttft_s == pytest.approx(FIXED + 100 * PER_TOKEN)
    assert not choice.lends


def test_a_long_prompt_spares_the_streams_running_on_decode() -> None:
    """Local: 0.55 s to the first token (its step carries 20 decodes) but each of the 20 streams
    waits 0.45 s more that step. Remote, behind a 10-token prompt already there (so not lent):
    0.06 + 0.45 s of prefill, 0.07 s of delivery, then decode's step (0.15 s): later for this
    request, far cheaper for the others."""
    workers = [decode(running=20), prefill(pending=10)]
    choice = place_adaptive(400, 1, workers, costs(delivery_per_block=0.0028))
    assert choice.option.place is PrefillPlace.REMOTE
    assert choice.placement.reason is PlacementReason.SPARES_STREAMS
    assert choice.option.stall_s == 0.0


def test_a_prefill_tier_with_a_backlog_sends_a_chat_prompt_to_decode() -> None:
    """Remote would wait 3 s behind the queued prompt; local stalls two streams for 0.1 s."""
    choice = place_adaptive(100, 1, [decode(running=2), prefill(pending=3000)], costs())
    assert choice.option.place is PrefillPlace.LOCAL
    assert choice.option.decode.address == "d"
    assert choice.placement.reason is PlacementReason.LOCAL_CHEAPER


def test_decode_busy_prefilling_sends_the_prompt_to_the_prefill_tier() -> None:
    choice = place_adaptive(100, 1, [decode(pending=3000), prefill(pending=200)], costs())
    assert choice.option.place is PrefillPlace.REMOTE
    assert choice.placement.reason is PlacementReason.REMOTE_FASTER


def test_a_prompt_behind_short_queued_ones_shares_their_step() -> None:
    """Two 300-token prompts queued and this one of 100 take one step of 700 tokens (0.75 s),
    as the scheduler packs them, not a step each (0.85 s)."""
    worker = WorkerState("d", DECODE, DECODE, pending_prompts=2, pending_prompt_tokens=600)
    choice = place_adaptive(100, 1, [worker], costs())
    assert choice.option.ttft_s == pytest.approx(0.75)


def test_a_hand_off_waits_for_the_decode_workers_steps_in_progress() -> None:
    """Decode prefills a 6,000-token prompt in 2,048-token steps of 2.098 s. Its Reserve is
    answered at the end of the first (half of it left, on average); the prompt's prefill behind
    10 queued tokens and its delivery take 0.28 s, so its KV lands inside decode's second step
    and the stream starts at that step's end: 1.049 + 2.098 s, not the prefill plus one step."""
    workers = [decode(pending=6000), prefill(pending=10)]
    choice = place_adaptive(100, 1, workers, costs())
    assert choice.option.place is PrefillPlace.REMOTE
    assert choice.option.ttft_s == pytest.approx(2.098 / 2 + 2.098)


def test_a_hand_off_to_a_decoding_worker_starts_at_a_step_end() -> None:
    """Decode steps 0.1 s for its 10 streams: the Reserve waits 0.05 s, the prefill worker takes
    0.21 s (10 queued tokens, then these 100) and delivery 0.07 s, so the KV lands at 0.33 s and
    the stream starts at the end of decode's step running then, 0.35 s."""
    choice = place_adaptive(100, 1, [decode(running=10), prefill(pending=10)], costs())
    remote = choice.option
    assert remote.place is PrefillPlace.REMOTE
    assert remote.ttft_s == pytest.approx(0.35)


def test_an_idle_prefill_worker_is_lent_to_decode_when_decode_is_busy() -> None:
    choice = place_adaptive(100, 1, [decode(running=20), prefill()], costs())
    assert choice.option.place is PrefillPlace.LOCAL
    assert choice.option.decode.address == "p"
    assert choice.placement.reason is PlacementReason.PREFILL_IDLE
    assert choice.lends


def test_a_busy_prefill_worker_is_not_lent() -> None:
    """Prefilling for decode (its role), it takes no stream of its own."""
    choice = place_adaptive(100, 1, [decode(running=20), prefill(running=1, pending=10)], costs())
    assert choice.option.decode.address == "d"


def test_a_lent_prefill_worker_keeps_taking_streams() -> None:
    workers = [decode(running=20), prefill(running=2, role=DECODE)]
    choice = place_adaptive(100, 1, workers, costs())
    assert (choice.option.place, choice.option.decode.address) == (PrefillPlace.LOCAL, "p")
    assert choice.placement.reason is PlacementReason.LENT_PREFILL_WORKER
    assert not choice.lends


def test_under_an_itl_slo_a_prefill_worker_is_lent_only_when_decode_cannot_keep_it() -> None:
    """Decode's step with a 21st stream: 50 + 21 x 5 = 155 ms. Within a 200 ms SLO decode takes
    it, lent or idle prefill worker or not; past a 100 ms one the idle prefill worker is lent."""
    for prefill_worker in (prefill(), prefill(running=2, role=DECODE)):
        workers = [decode(running=20), prefill_worker]
        kept = place_adaptive(100, 1, workers, costs(itl_slo=0.2))
        assert kept.option.decode.address == "d" and not kept.lends
    lent = place_adaptive(100, 1, [decode(running=20), prefill()], costs(itl_slo=0.1))
    assert lent.option.decode.address == "p" and lent.lends


def test_under_an_itl_slo_a_decode_worker_prefilling_alone_cannot_keep_a_stream() -> None:
    """Decode prefills 3,000 queued tokens with no stream: whole chunks of 2,048 (2.1 s steps),
    which a stream handed to it waits through. Its step with the stream in (55 ms) fits a 200 ms
    SLO, the step it runs does not: the idle prefill worker is lent the chat. With streams of its
    own decode's chunks are capped to the SLO, and it keeps the stream."""
    prefilling_alone = [decode(pending=3000), prefill()]
    lent = place_adaptive(100, 1, prefilling_alone, costs(itl_slo=0.2))
    assert lent.option.decode.address == "p" and lent.lends
    capped = [decode(running=2, pending=3000), prefill()]
    kept = place_adaptive(100, 1, capped, costs(itl_slo=0.2))
    assert kept.option.decode.address == "d" and not kept.lends


def test_a_long_prompt_is_not_lent_past_a_decode_worker_prefilling_alone() -> None:
    """The same decode worker prefilling alone, and a prompt of more than one step (3,000
    tokens): its stream starts only after its own chunks, by when decode's are done, so decode
    keeps it (here remote through the prefill worker) and the prefill worker is not lent."""
    prefilling_alone = [decode(pending=3000), prefill()]
    choice = place_adaptive(3000, 1, prefilling_alone, costs(0.0001, itl_slo=0.2))
    assert choice.option.decode.address == "d" and not choice.lends


def test_under_an_itl_slo_a_long_prompt_is_prefilled_where_no_stream_waits() -> None:
    """3,000 tokens (two chunks: 2,048 + 952) with one stream on decode and 4,000 queued on the
    prefill worker. Local: 3.1 s to the first token, and the stream waits 3.0 s more; remote:
    7.2 s behind the queue and its own chunks, 1.9 s of delivery (188 blocks). Cheaper local
    in summed seconds, so without an SLO it goes local; under one, to the prefill worker, whose
    queue stalls no stream. A prompt of one step (2,048) stays priced as before."""
    workers = [decode(running=1), prefill(pending=4000)]
    assert place_adaptive(3000, 1, workers, costs()).option.place is PrefillPlace.LOCAL
    spared = place_adaptive(3000, 1, workers, costs(itl_slo=10.0))
    assert spared.option.place is PrefillPlace.REMOTE
    one_step = place_adaptive(2048, 1, workers, costs(itl_slo=10.0))
    assert one_step.option.place is PrefillPlace.LOCAL
    idle = place_adaptive(3000, 1, [decode(), prefill(pending=4000)], costs(itl_slo=10.0))
    assert idle.option.place is PrefillPlace.LOCAL  # an idle decode worker stalls no stream


def test_requests_expected_to_arrive_send_a_long_prompt_from_an_idle_decode_worker() -> None:
    """3,000 tokens, both workers idle: local 3.10 s to the first token (chunks of 2.098 and
    1.002 s), remote 0.019 s more (188 blocks delivered). With nothing arriving it stays local;
    at 0.2 requests a second each arrival that hands off meanwhile waits 1.5 of those steps
    (0.2 x 1.5 x 3.10 s x 1.55 s = 1.44 s), so the idle prefill worker prefills it: under an
    ITL SLO (lending only when needed) for decode to decode, without one lent it end to end."""
    workers = [decode(), prefill()]
    fast_wire = costs(delivery_per_block=0.0001, itl_slo=10.0)
    quiet = place_adaptive(3000, 1, workers, fast_wire)
    assert quiet.option.place is PrefillPlace.LOCAL and quiet.option.blocked_s == 0.0
    busy = place_adaptive(3000, 1, workers, fast_wire, arrivals_per_s=0.2)
    assert busy.option.place is PrefillPlace.REMOTE
    unbounded = place_adaptive(3000, 1, workers, costs(0.0001), arrivals_per_s=0.2)
    assert unbounded.placement.reason is PlacementReason.PREFILL_IDLE
    local = place_adaptive(3000, 1, [decode()], fast_wire, arrivals_per_s=0.2).option
    assert local.blocked_s == pytest.approx(0.2 * 1.5 * 3.1 * 1.55)


def test_only_a_decode_tier_worker_blocks_arrivals() -> None:
    """Lending an idle prefill worker a short prompt blocks no hand-off: it prices nothing."""
    choice = place_adaptive(100, 1, [decode(running=20), prefill()], costs(), arrivals_per_s=5.0)
    assert choice.lends and choice.option.blocked_s == 0.0


def test_the_least_loaded_decode_worker_takes_a_local_prompt() -> None:
    workers = [decode(running=8, name="d0"), decode(running=1, name="d1")]
    choice = place_adaptive(100, 1, workers, costs())
    assert choice.option.decode.address == "d1"


def test_an_itl_slo_predicts_the_chunks_a_worker_will_take() -> None:
    """Under a 0.2 s SLO a step with 20 decodes (0.15 s) takes 50 prompt tokens: 400 tokens take
    8 steps of 0.2 s locally, and each stream waits 8 x 50 ms more."""
    choice = place_adaptive(400, 1, [decode(running=20)], costs(itl_slo=0.2))
    assert choice.option.ttft_s == pytest.approx(8 * 0.2)
    assert choice.option.stall_s == pytest.approx(20 * 8 * 0.05)


def test_no_worker_that_can_take_the_request_is_an_error() -> None:
    with pytest.raises(ValueError, match="workers"):
        place_adaptive(10, 1, [], costs())


def _measured(factor: float) -> StepWindow:
    """Eight decode steps of 4 streams (400 tokens of context), each `factor` x the profile's."""
    step = StepShape.decodes(4, 400)
    seconds = 8 * factor * costs().profile.step_seconds(step)
    return StepWindow(StepPhase.DECODE, 8, StepShape.decodes(32, 3200), seconds)


def test_a_worker_whose_steps_run_slower_than_the_profile_is_priced_as_measured() -> None:
    """Two decode workers under the same load: the first of equals wins until the first one's
    Load shows its decode steps taking 3x what the profile says (a slower or busier worker)
    while the second's take what it says."""
    first, second = decode(running=4, name="a"), decode(running=4, name="b")
    assert place_adaptive(50, 16, [first, second], costs()).option.decode.address == "a"
    slow = dataclasses.replace(first, step_windows=(_measured(3.0),))
    as_profiled = dataclasses.replace(second, step_windows=(_measured(1.0),))
    choice = place_adaptive(50, 16, [slow, as_profiled], costs())
    assert choice.option.decode.address == "b"


def test_a_worker_that_has_not_stepped_is_priced_by_its_peers_steps() -> None:
    """Worker a measured its steps at half the profile's time (a faster host than the profile's);
    b has not stepped yet and runs one stream fewer. Priced by the bare profile b would cost
    twice its due and a would win; priced as its peer measured, the less loaded b wins."""
    fast = dataclasses.replace(decode(running=4, name="a"), step_windows=(_measured(0.5),))
    unmeasured = decode(running=3, name="b")
    assert place_adaptive(50, 16, [fast, unmeasured], costs()).option.decode.address == "b"
