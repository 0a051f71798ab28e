"""The learner's live view: rendered from a real hub's state, and drawn on a real pseudo-terminal."""

import os
import pty
import select
import subprocess
import sys
import time

import pytest
from rich.console import Console

from artmlx.apps.learner_view import render
from artmlx.metrics import read_metrics
from artmlx.protocol.client import ActorClient
from artmlx.protocol.sockets import ActorSocket
from artmlx.protocol.status import format_status
from tests.protocol.helpers import HubThread, make_group


def test_view_and_status_show_the_actors_and_the_learner_state():
    hub = HubThread()
    client = ActorClient(ActorSocket(hub.address), "mac-studio", heartbeat_s=0.05)
    try:
        client.hello("fp")
        client.stats = {"gen_tokens_per_s": 1234.0}
        client.submit(make_group())
        reported = lambda: hub.call(lambda h: h.status()["actors"][0]["stats"]).get("groups_sent") == 1  # noqa: E731
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (client.outbox or not reported()):
            client.pump(20)
        hub.call(lambda h: h.extra_status.update(step=3, steps=10, reward_mean=0.25, eval_score=0.7, eval_step=2,
                                                 staleness_histogram={"0": 5, "1": 2}, queue_depth=1))
        state = hub.call(lambda h: h.status())
    finally:
        client.socket.close()
        hub.stop()
    console = Console(width=140, record=True, file=open(os.devnull, "w"))
    console.print(render(state))
    text = console.export_text()
    for expected in ("mac-studio", "step 3/10", "eval 0.700 (step 2)", "1,234", "0:", "trained 1"):
        assert expected in text, (expected, text)
    plain = format_status(state)
    assert "mac-studio" in plain and "staleness of trained groups: 0: 5, 1: 2" in plain


def read_all(fd, process, timeout):
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the terminal closes when the last process holding it exits
                break
            if not chunk:
                break
            chunks.append(chunk)
        elif process.poll() is not None:
            break
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_run_on_a_terminal_draws_the_live_view(tmp_path):
    run = tmp_path / "run"
    main, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "artmlx", "run", "--actors", "1", "--out", str(run), "--steps", "2",
         "--set", "groups_per_step=2", "--set", "group_size=4", "--set", "actor_groups_per_batch=2",
         "--set", "eval_episodes=10", "--set", "eval_every=2"],
        stdin=terminal, stdout=terminal, stderr=terminal, env=dict(os.environ, COLUMNS="140"))
    os.close(terminal)
    output = read_all(main, process, timeout=600)
    process.wait(60)
    os.close(main)
    assert process.returncode == 0, output
    assert "artmlx learner" in output and "step 2/2" in output and "staleness" in output, output
    assert "actor-0" in output  # the actors table
    # The actor's own lines went to its log, not over the view.
    assert "connected: model tiny" in (run / "logs" / "actor-0.log").read_text()
    assert read_metrics(run)[-1]["groups_unaccounted"] == 0
