"""`artmlx status`: ask a running learner for its state (needs no hello, only access)."""

from __future__ import annotations

import time
from pathlib import Path

from .messages import StatusReply, StatusRequest
from .sockets import ActorSocket


def query_status(address: str, keys: Path | None = None, actor_key: str = "actor", timeout_s: float = 5.0) -> dict:
    socket = ActorSocket(address, keys=keys, actor_key=actor_key, linger_ms=0)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            socket.send(StatusRequest())  # resent until the connection is up (no queueing before)
            reply = socket.receive(200)
            if isinstance(reply, StatusReply):
                return reply.state
        raise TimeoutError(f"no answer from a learner at {address} within {timeout_s:g} s "
                           "(is it running? does it need --keys?)")
    finally:
        socket.close()


def optional(value, spec: str) -> str:
    """A figure the learner may not have yet (no update, no eval): '-' until it does."""
    return "-" if value is None else format(value, spec)


def by_lag(histogram: dict[str, int]) -> list[tuple[str, int]]:
    """Staleness histogram entries ordered by lag (keys are strings on the wire)."""
    return sorted(histogram.items(), key=lambda item: int(item[0]))


def format_status(state: dict) -> str:
    """Plain-text status: the learner's state, group counters, staleness and each actor."""
    lines = [(f"learner: step {state.get('step', '?')}/{state.get('steps', '?')}, policy v{state['policy_version']}, "
              f"{state.get('phase', 'running')}, {len(state['actors'])} actor(s), {state['waiting']} group(s) waiting, "
              f"{state['rejected_messages']} message(s) rejected"),
             (f"reward {optional(state.get('reward_mean'), '+.3f')}, eval {optional(state.get('eval_score'), '.3f')}, "
              f"gen {optional(state.get('gen_tokens_per_s'), ',.0f')} tok/s, "
              f"train {optional(state.get('train_tokens_per_s'), ',.0f')} tok/s, "
              f"queue {state.get('queue_depth', '-')}, idle {optional(state.get('learner_idle_frac'), '.0%')}"),
             "groups: " + (", ".join(f"{k} {v}" for k, v in sorted(state["counts"].items())) or "none yet")]
    histogram = state.get("staleness_histogram")
    if histogram:
        lines.append("staleness of trained groups: " + ", ".join(
            f"{lag}: {count}" for lag, count in by_lag(histogram)))
    for actor in sorted(state["actors"], key=lambda a: a["name"]):
        rate = actor["stats"].get("gen_tokens_per_s")
        lines.append(f"  {actor['name']:<20} {actor['host']:<16} v{actor['policy_version']:<5} "
                     f"in flight {actor['in_flight']:<3} seen {actor['seen_s_ago']}s ago"
                     + (f"  {rate:.0f} gen tok/s" if rate else ""))
    hosts: dict[str, list] = {}
    for actor in state["actors"]:
        hosts.setdefault(actor["host"], []).append(actor)
    if len(hosts) > 1:
        lines.append("per host: " + "; ".join(
            f"{host} {len(actors)} actor(s) "
            f"{sum(a['stats'].get('gen_tokens_per_s') or 0 for a in actors):,.0f} gen tok/s"
            for host, actors in sorted(hosts.items())))
    return "\n".join(lines)
