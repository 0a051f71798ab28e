"""Actors of different speeds get shares of an update in proportion to the rate the hub measured."""

import math
import time

from artmlx.protocol.client import ActorClient
from artmlx.protocol.flow import counted_as
from artmlx.protocol.sockets import ActorSocket
from tests.protocol.helpers import HubThread, make_group, wait_for


def test_shares_follow_measured_rates_once_every_producer_is_measured():
    # Reference: the share of actor i is update * rate_i / sum(rates), i.e. update / (sum / rate_i).
    assert counted_as([1.0, 3.0], 1.0) == 4.0
    assert math.isclose(counted_as([1.0, 3.0], 3.0), 4 / 3)
    assert counted_as([1.0, None], 1.0) == 2  # one not measured yet: equal shares
    assert counted_as([2.0, 2.0], 2.0) == 2.0  # equal speeds: the plain rule
    assert counted_as([5.0], 5.0) == 1.0


def test_a_slow_actor_is_asked_for_less_than_a_fast_one():
    update = 16
    hub = HubThread(share=lambda producers: math.ceil(update / producers), groups_per_update=update,
                    max_in_flight=lambda producers, batch: math.ceil(update / producers) + 1)
    fast = ActorClient(ActorSocket(hub.address), "a", heartbeat_s=0.1)
    slow = ActorClient(ActorSocket(hub.address), "a", heartbeat_s=0.1)
    fast.hello("fp")
    slow.hello("fp")
    started = time.monotonic()
    sent = {"fast": 0, "slow": 0}
    while time.monotonic() - started < 3.0:
        fast.submit(make_group())
        sent["fast"] += 1
        if sent["fast"] % 4 == 0:
            slow.submit(make_group())
            sent["slow"] += 1
        for client in (fast, slow):
            client.pump(25)
    assert wait_for(lambda: fast.share is not None and slow.share is not None and fast.share > slow.share,
                    fast, slow, timeout=5)
    # about 4:1 in rate, so about 13 and 4 of 16 (the slow actor's rate is measured over a longer span)
    assert fast.share >= 2 * slow.share, (fast.share, slow.share)
    assert fast.share + slow.share <= update + 2
    state = hub.call(lambda h: h.status())
    rates = sorted(a["groups_per_s"] for a in state["actors"])
    assert rates[1] > 2 * rates[0]
    fast.socket.close()
    slow.socket.close()
    hub.stop()
