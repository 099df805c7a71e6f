"""A decode pod that vanished without an answer (its process SIGKILLed, its network deleted, as
`pdserve up --netns` and Kubernetes do) costs a prefill worker seconds, not minutes.

UCX connects on its progress thread, and nothing else on that worker moves meanwhile. A connect
to an address that drops packets used to wait for the kernel's SYN retries (127 s): under load a
killed decode pod stopped every KV transfer of the prefill worker that long, and reservations on
healthy decode workers expired behind it (tests/chaos/test_elastic.py). Now the connect gives up
after `UcxConfig.tcp_syn_retries`, runs off the pushing thread, and a transfer to a live pod
pushed meanwhile is delayed by that, not failed. Real processes in real pods; skipped where
network namespaces cannot be made."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ucx_peers import LAYOUT, TRANSPORTS, Peer

from pdserve.local.netns import PodNetwork, choose_subnet, host_routes

from ..chaos.netns_up import require_netns

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

PREFIX = "pdsvp"  # no router port: a name no `pdserve up` uses
SEND_TIMEOUT_S = 30.0  # the tiers' default: the live transfer must not need a longer one
PUSHES_RETURN_WITHIN_S = 1.0  # the engine thread's part: gathers and posts
VANISHED_FAILS_WITHIN_S = 15.0  # 2 SYN retries: 7 s, plus process jitter on a busy host
LIVE_DELIVERED_WITHIN_S = 15.0


@pytest.fixture
def network() -> Iterator[PodNetwork]:
    require_netns()
    with PodNetwork(PREFIX, choose_subnet(4343, host_routes())) as made:
        yield made


def test_a_vanished_decode_pod_delays_a_live_transfer_by_seconds_and_fails_its_own(
    network: PodNetwork,
) -> None:
    prefill_pod, live_pod, gone_pod = (network.add_pod(n) for n in ("prefill", "live", "gone"))
    peers: list[Peer] = []
    try:
        for role, pod in (("decode", live_pod), ("decode", gone_pod), ("prefill", prefill_pod)):
            peers.append(Peer(role, TRANSPORTS["tcp"], pod=pod, send_timeout_s=SEND_TIMEOUT_S))
        live, gone, prefill = peers
        blocks = [0, 1, 2]
        to_live = live.call("expect", "to-live", blocks, LAYOUT)
        to_gone = gone.call("expect", "to-gone", blocks, LAYOUT)
        prefill.call("resolve", gone_pod.address)
        gone.process.kill()
        gone.process.join(timeout=10)
        network.remove_pod(gone_pod)  # its address now drops packets without an answer

        pushed_s, outcomes = prefill.call(
            "send_all", [(to_gone, blocks), (to_live, blocks)], timeout_s=120
        )
        (gone_outcome, gone_s), (live_outcome, live_s) = outcomes
        assert pushed_s < PUSHES_RETURN_WITHIN_S
        assert gone_outcome.startswith("TransferError") and gone_s < VANISHED_FAILS_WITHIN_S
        assert live_outcome == "ok" and live_s < LIVE_DELIVERED_WITHIN_S
        assert live.call("wait", "to-live", 5.0) == "done"
    finally:
        for peer in peers:
            peer.stop()
