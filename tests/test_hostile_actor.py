"""A real learner process, an honest actor process, and a client with a valid key sending poison."""

import time

import numpy as np
import pytest

from artmlx.metrics import read_metrics
from artmlx.protocol.codec import encode
from artmlx.protocol.messages import Ack, Heartbeat, Hello, Welcome
from artmlx.protocol.sockets import ActorSocket
from tests.protocol.helpers import make_group
from tests.test_pipeline import learner_and_actors, train_rows


def poison(fingerprint, group_size, vocab):
    """Groups the codec accepts that would crash or poison a learner that trusted them."""
    def group(edit, **kwargs):
        g = make_group(fingerprint=fingerprint, episodes=kwargs.pop("episodes", group_size), length=8)
        g.actor = "hostile"
        edit(g)
        return g

    return {
        "group size": group(lambda g: None, episodes=group_size + 1),
        "token id": group(lambda g: g.tokens.__setitem__(0, vocab + 7)),
        "logprob": group(lambda g: g.logprobs.__setitem__(int(np.flatnonzero(g.policy_mask)[0]), -1e30)),
        "reward": group(lambda g: g.rewards.__setitem__(0, 3e38)),
        "length": _long(fingerprint, group_size),
        "impostor": group(lambda g: setattr(g, "actor", "steady")),
    }


def _long(fingerprint, group_size):
    g = make_group(fingerprint=fingerprint, episodes=group_size, length=5000)
    g.actor = "hostile"
    return g


@pytest.mark.slow
def test_a_hostile_actor_cannot_crash_poison_or_stall_training(tmp_path):
    run = tmp_path / "run"
    address, learner, (honest,) = learner_and_actors(run, 4, ["steady"])
    hostile = ActorSocket(address)
    try:
        welcome = None
        deadline = time.monotonic() + 120
        while welcome is None and time.monotonic() < deadline:
            hostile.send(Hello(actor="hostile", host="[/x]evil\x1b", artmlx_version="0"))
            reply = hostile.receive(500)
            welcome = reply if isinstance(reply, Welcome) else None
        assert welcome is not None
        hostile.send(Hello(actor="hostile", host="h", artmlx_version="0", fingerprint=welcome.fingerprint))
        config = welcome.run_config
        groups = poison(welcome.fingerprint, config["group_size"], vocab=151_936)
        reasons = {}
        hostile.send(Heartbeat(sender="hostile", session=welcome.session, stats={"gen_tokens_per_s": "[/]"}))
        for name, group in groups.items():
            hostile.send(None, frames=encode(group))
        while len(reasons) < len(groups) and time.monotonic() < deadline:
            message = hostile.receive(500)
            if isinstance(message, Ack):
                reasons[message.group_id] = (message.status, message.reason)
        hostile.close()
        output, _ = learner.communicate(timeout=600)
        honest_output, _ = honest.communicate(timeout=120)
    finally:
        for process in (learner, honest):
            if process.poll() is None:
                process.kill()
    assert learner.returncode == 0, output
    by_name = {name: reasons.get(group.group_id) for name, group in groups.items()}
    assert all(status == "rejected" for status, _ in by_name.values()), by_name
    assert "group_size" in by_name["group size"][1] and "vocabulary" in by_name["token id"][1]
    assert "below" in by_name["logprob"][1] and "rewards" in by_name["reward"][1]
    assert "more than the run allows" in by_name["length"][1] and "sent by" in by_name["impostor"][1]
    rows = train_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in rows)
    final = read_metrics(run)[-1]
    assert final["stop_reason"] == "training finished after 4 updates"
    assert final["groups_rejected"] == len(groups) and final["groups_trained"] == 16
    assert "training finished" in honest_output
