"""The learner's live terminal view (rich), or plain lines when stdout is not a terminal.

Both render the state dict that `artmlx status` also prints (`LearnerHub.status()` plus what the
learner adds: step, reward, eval, throughput, idle fraction, staleness histogram). The view is
redrawn at most `refresh_s` apart from the learner's own loop, so no thread touches the hub.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..protocol.status import by_lag, optional


def _bar(fraction: float, width: int) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def render(state: dict) -> Group:
    """A rich renderable of the learner's state."""
    steps = state.get("steps") or 0
    elapsed = time.time() - state["started_unix"] if "started_unix" in state else None
    step = state.get("step", 0)
    header = Text.assemble(
        ("artmlx learner ", "bold"), f"{state.get('run_dir', '')}  ",
        f"step {step}/{steps} ", (_bar(step / steps if steps else 0, 20), "cyan"),
        f"  v{state['policy_version']}  {optional(elapsed, '.0f')} s  ",
        (state.get("phase", ""), "yellow"),
    )
    eval_text = (f"{state['eval_score']:.3f} (step {state['eval_step']})" if state.get("eval_score") is not None
                 else "-")
    figures = Table.grid(padding=(0, 3))
    figures.add_row(
        f"reward {optional(state.get('reward_mean'), '+.3f')}", f"eval {eval_text}",
        f"gen {optional(state.get('gen_tokens_per_s'), ',.0f')} tok/s",
        f"train {optional(state.get('train_tokens_per_s'), ',.0f')} tok/s",
        f"queue {state.get('queue_depth', state['waiting'])}",
        f"idle {optional(state.get('learner_idle_frac'), '.0%')}",
    )
    histogram = state.get("staleness_histogram") or {}
    total = max(1, sum(histogram.values()))
    staleness = Text("staleness ")
    for lag, count in by_lag(histogram):
        staleness.append(f" {lag}:", "bold").append(_bar(count / total, 10), "green").append(f" {count}")
    staleness.append(f"   dropped (> bound): {state['counts'].get('stale', 0)}")
    counts = state["counts"]
    groups = Text("groups    " + "  ".join(f"{k} {counts.get(k, 0)}" for k in
                                          ("received", "trained", "stale", "rejected", "duplicate"))
                  + f"  waiting {state['waiting']}  messages rejected {state['rejected_messages']}"
                  + f"  actors lost {counts.get('actors_lost', 0)}")
    actors = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("actor", "host", "version", "in flight", "gen tok/s", "sent", "seen"):
        actors.add_column(column, justify="left" if column in ("actor", "host") else "right")
    for actor in sorted(state["actors"], key=lambda a: a["name"]):
        stats = actor["stats"]
        # Text cells are never parsed as markup (names come from actors; the hub made them printable too).
        actors.add_row(Text(actor["name"]), Text(actor["host"]), f"v{actor['policy_version']}", str(actor["in_flight"]),
                       optional(stats.get("gen_tokens_per_s"), ",.0f"), str(stats.get("groups_sent", "-")),
                       f"{actor['seen_s_ago']} s ago")
    if not state["actors"]:
        actors.add_row("(no actor connected)", "", "", "", "", "", "")
    return Group(header, figures, staleness, groups, actors)


class LiveView:
    """Redraws `render(state())` on a terminal; on a pipe it prints nothing (rows are logged as lines)."""

    def __init__(self, live: bool | None = None, refresh_s: float = 0.5):
        self.console = Console()
        self.live_enabled = sys.stdout.isatty() if live is None else live
        self.refresh_s = refresh_s
        self._live: Live | None = None
        self._last = 0.0

    def __enter__(self) -> LiveView:
        if self.live_enabled:
            # Prints from this process (the metrics lines) scroll above the view.
            self._live = Live(console=self.console, auto_refresh=False, redirect_stdout=True, redirect_stderr=True)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def update(self, state: Callable[[], dict], force: bool = False) -> None:
        now = time.monotonic()
        if self._live is None or (not force and now - self._last < self.refresh_s):
            return
        self._last = now
        self._live.update(render(state()), refresh=True)
