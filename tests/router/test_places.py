"""The router's --max-queue places among tenants and priorities (router/places.py), alone: free
places go to anyone; short ones go by priority, then by weighted fair share, displacing only
holders that have not streamed a token."""

from __future__ import annotations

from pdserve.router.places import Holder, Places, Refused

WEIGHTS = {"alice": 1.0, "bob": 1.0, "heavy": 3.0}


def places(capacity: int) -> Places:
    return Places(capacity, lambda tenant: WEIGHTS.get(tenant, 1.0))


def fill(pool: Places, tenant: str, count: int, priority: int = 0) -> list[Holder]:
    holders = [Holder(tenant, priority, streams=1) for _ in range(count)]
    for holder in holders:
        assert pool.take(holder) is None
    return holders


def test_free_places_go_to_anyone_even_past_their_share() -> None:
    pool = places(4)
    fill(pool, "alice", 4)  # alone: work-conserving
    assert pool.in_flight == 4


def test_a_higher_priority_request_displaces_the_latest_lowest_priority_unstarted_one() -> None:
    pool = places(3)
    low = fill(pool, "alice", 2, priority=0)
    mid = fill(pool, "alice", 1, priority=1)
    low[1].started = True  # streaming: never displaced
    displaced: list[Holder] = []
    low[0].on_displaced = lambda: displaced.append(low[0])
    assert pool.take(Holder("alice", 5, streams=1)) is None
    assert displaced == [low[0]] and low[0].displaced_by == "a request of higher priority"
    assert mid[0].displaced_by is None and pool.in_flight == 3


def test_equal_priority_never_displaces_within_one_tenant() -> None:
    pool = places(2)
    fill(pool, "alice", 2)
    assert pool.take(Holder("alice", 0, streams=1)) is Refused.QUEUE_FULL  # no other tenant
    assert pool.in_flight == 2


def test_a_tenant_within_its_share_displaces_one_over_its_share() -> None:
    pool = places(4)
    alice = fill(pool, "alice", 4)
    bob = Holder("bob", 0, streams=1)
    assert pool.take(bob) is None  # bob's share is 2 of 4: alice holds all 4
    assert sum(h.displaced_by is not None for h in alice) == 1
    assert alice[-1].displaced_by == "tenant 'bob' within its fair share"  # the latest first
    assert pool.take(Holder("bob", 0, streams=1)) is None  # bob at 2: still within
    assert pool.take(Holder("bob", 0, streams=1)) is Refused.FAIR_SHARE  # 3 > 2
    assert pool.held_by("alice") == 2 and pool.held_by("bob") == 2


def test_weights_set_the_shares() -> None:
    pool = places(8)
    fill(pool, "bob", 8)
    for _ in range(6):  # heavy's share: 8 x 3 / 4
        assert pool.take(Holder("heavy", 0, streams=1)) is None
    assert pool.take(Holder("heavy", 0, streams=1)) is Refused.FAIR_SHARE
    assert (pool.held_by("heavy"), pool.held_by("bob")) == (6, 2)


def test_nothing_displaceable_refuses_the_newcomer_and_changes_nothing() -> None:
    pool = places(2)
    holders = fill(pool, "alice", 2)
    for holder in holders:
        holder.started = True
    assert pool.take(Holder("bob", 9, streams=1)) is Refused.QUEUE_FULL
    assert all(h.displaced_by is None for h in holders) and pool.in_flight == 2


def test_a_request_of_several_streams_displaces_enough_for_all() -> None:
    pool = places(3)
    fill(pool, "alice", 3)
    assert pool.take(Holder("bob", 1, streams=2)) is None
    assert pool.held_by("alice") == 1 and pool.in_flight == 3
