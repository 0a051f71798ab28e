"""Agent rollouts: a user's async `rollout(model, scenario)` or `rollout(client, scenario)` played on the engine.

The alternative to an environment (`--env`): agent code written as ART writes it, an async function
that talks to the policy through an OpenAI client and returns a trajectory (`messages_and_choices`,
`reward`, `metrics`, `metadata`: ART's field names, so the same function runs under ART's own
backends). `--rollout module:function` (or `path/to/file.py:function`) names it; its first argument
is an `AgentModel` (ART's `rollout(model: art.Model, scenario)`) or the OpenAI client itself, as its
first parameter says (`agent_code.py`). `--scenarios` names what each group plays: a JSONL file (one
scenario per line) or `module:name` of a list or of a function returning an iterable. Group k of an
actor plays scenario `seed % len(scenarios)` (seeds are random per actor); without scenarios the
scenario is `{"seed": seed}`.

`AgentRollouts.play` runs the G rollouts of every group of a batch concurrently on one asyncio loop.
Their client is the real `openai.AsyncOpenAI` talking to `artmlx serve`'s API in-process (httpx's
ASGI transport, no socket), and the server's scheduler batches every concurrent request into one
forward per decode step: the same engine the server uses. The model is named `policy`. Trajectories
become token-exact episodes (`rollout/choices.py`).

Failures: an exception in user code, or a trajectory that cannot be made token-exact, is left out of
its group (the group is dropped when fewer than `min_group_size` remain; by default it needs all G)
and goes into `failures` (`FailureLog`): the first failure of
each kind is reported with its traceback, repeats only counted. After `failure_limit` failed
rollouts in a row (no success between them) `play` raises `RolloutsFailing`, whose message names
the function, its signature, what its first argument was and the first of those failures.

`tick`, called every `tick_s` while agents play, keeps the caller's socket alive and may stop the
batch: when it returns True the running rollouts are cancelled and the batch gives no groups.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..hints import set_directive_hint
from ..model.families import vocab_size
from ..trajectory import Group
from .agent_code import AgentModel, signature_text, takes_model
from .base import FailureLog
from .choices import TrajectoryRefused, messages_before, trajectory_episode

MODEL_NAME = "policy"
BASE_URL = "http://policy/v1"  # the in-process client's address: httpx hands requests to the API, no socket
API_KEY = "in-process"
EVAL_CHUNK = 256


@dataclass
class Trajectory:
    """ART's `Trajectory` fields, for agent code that runs without the openpipe-art package."""

    messages_and_choices: list = field(default_factory=list)
    tools: list | None = None
    reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    additional_histories: list = field(default_factory=list)

    def messages(self) -> list[dict]:
        """The chat messages to send next, each choice as its assistant message."""
        return messages_before(self.messages_and_choices)

    def set_directive_hint(self, hint: str) -> None:
        """What should have been different, in words: trained token by token (`learner/distill.py`)."""
        set_directive_hint(self, hint)


class RolloutsFailing(RuntimeError):
    """The rollout function failed `failure_limit` times in a row; the message says which, how and where."""


class AgentRollouts:
    """An actor's (or the learner's evaluation) rollouts when the run names an agent instead of an environment."""

    def __init__(self, server, rollout: Callable, scenarios: list, temperature: float,
                 tick: Callable[[], bool] | None = None, tick_s: float = 0.5, failure_limit: int = 0,
                 spec: str = "", min_group_size: int = 0, hint_form: str = "instruction"):
        """`tick` is called every `tick_s` while agents play (the actor's socket: heartbeats and acks must
        flow while a batch of agents runs for minutes); True from it stops the batch. `failure_limit`
        failed rollouts in a row raise `RolloutsFailing` (0: never). `spec` is how the run named the rollout.
        A group whose failed or refused rollouts leave at least `min_group_size` trajectories is kept with
        those (0: a group needs all of its rollouts). `hint_form` places a trajectory's directive hint in its
        teacher's prompt (`hints.HINT_FORMS`)."""
        import httpx
        import openai

        from ..serve.openai_api import Api

        self.server = server
        self.rollout = rollout
        self.spec = spec or signature_text(rollout)
        self.scenarios = scenarios
        self.temperature = temperature
        self.hint_form = hint_form
        self.failures = FailureLog()
        self.failure_limit = failure_limit
        self.min_group_size = min_group_size
        self.played = self.groups_dropped = self.groups_short = 0
        self.tick, self.tick_s = tick, tick_s
        self.loop = asyncio.new_event_loop()  # one loop for the actor's life: the client's pool lives on it
        asyncio.set_event_loop(self.loop)
        transport = httpx.ASGITransport(app=Api(server).app())
        self.client = openai.AsyncOpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0,
                                         http_client=httpx.AsyncClient(transport=transport, timeout=None))
        self.model = AgentModel(self.client, lambda: server.step, name=MODEL_NAME, base_model=server.config.model,
                                inference_base_url=BASE_URL, inference_api_key=API_KEY)
        self.takes_model = takes_model(rollout)
        self.scheduler_thread = server.call(threading.get_native_id).result()

    @property
    def max_rows(self) -> int:
        return self.server.config.max_rows

    def groups_per_batch(self, group_size: int) -> int:
        return max(1, self.max_rows // group_size)

    def scenario(self, seed: int):
        return self.scenarios[seed % len(self.scenarios)] if self.scenarios else {"seed": seed}

    def set_adapter(self, make_tensors: Callable[[], dict], version: int) -> None:
        """Swap in a new adapter between decode steps (requests in flight finish on theirs); its arrays are
        made on the scheduler's thread, which owns the MLX stream."""
        self.server.serve_adapter(version, make_tensors).result()

    def play(self, seeds: list[int], group_size: int, key=None, policy_version: int = 0) -> list[Group]:
        """Play `group_size` rollouts of each seed's scenario, all concurrently; groups whose rollouts all
        succeeded, in seed order (none if `tick` stopped the batch). `key` is unused: sampling is the server's."""
        work = [self._group(seed, group_size, policy_version) for seed in seeds]
        results = self.loop.run_until_complete(self._until_stopped(work)) or []
        if self.failure_limit and self.failures.consecutive >= self.failure_limit:
            raise RolloutsFailing(self.failing_message())
        return [group for group in results if group is not None]

    def play_once(self, scenarios: list) -> list | None:
        """Each scenario's trajectory from one rollout (None where it failed), `EVAL_CHUNK` concurrently;
        None if `tick` stopped it. For evaluation: trajectories are not made into episodes."""
        played: list = []
        for start in range(0, len(scenarios), EVAL_CHUNK):
            chunk = scenarios[start : start + EVAL_CHUNK]
            work = [self._rollout(scenario, start + i) for i, scenario in enumerate(chunk)]
            results = self.loop.run_until_complete(self._until_stopped(work))
            if results is None:
                return None
            for trajectory in results:
                if trajectory is not None:
                    self.failures.succeeded()
            played += results
        return played

    async def _until_stopped(self, coroutines: list):
        """The coroutines' results, run concurrently, or None once `tick` says stop (they are then cancelled)."""
        work = asyncio.gather(*coroutines)
        while True:
            done, _ = await asyncio.wait([work], timeout=self.tick_s)
            if done:
                return work.result()
            if self.tick is not None and self.tick():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                return None

    async def _rollout(self, scenario, seed: int):
        """One rollout's trajectory, or None (recorded in `failures`) if the agent's code raised."""
        try:
            trajectory = await self.rollout(self.model if self.takes_model else self.client, scenario)
        except Exception as error:
            self._failed(seed, error)
            return None
        return trajectory

    async def _group(self, seed: int, group_size: int, version: int) -> Group | None:
        scenario = self.scenario(seed)
        outcomes = await asyncio.gather(*(self._rollout(scenario, seed) for _ in range(group_size)))
        episodes, dropped = [], False
        for outcome in outcomes:  # every usable trajectory is a success, even in a group that is dropped
            if outcome is None:
                dropped = True
                continue
            try:
                episodes.append(trajectory_episode(outcome, self.server.chat, self.temperature,
                                                   vocab_size(self.server.model), self.hint_form))
                self.failures.succeeded()
            except (TrajectoryRefused, AttributeError, TypeError, ValueError) as error:
                self._refused(seed, outcome, error)
                dropped = True
        self.played += group_size
        if dropped and len(episodes) < (self.min_group_size or group_size):
            self.groups_dropped += 1
            return None
        self.groups_short += dropped
        # the group is as old as its oldest sampled token (the learner's staleness bound applies to it)
        oldest = min(e.info["adapter_version"] if e.info.get("adapter_version") is not None else version
                     for e in episodes)
        return Group(seed=seed, episodes=episodes, policy_version=oldest)

    def _failed(self, seed: int, error: Exception) -> None:
        reason = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"[:300]
        frames = error.__traceback__.tb_next if error.__traceback__ else None  # from the agent's own frame
        details = "".join(traceback.format_exception(type(error), error, frames)).rstrip()
        self.failures.failed(reason, f"rollout failed on scenario {seed}: {reason}\n{details}")

    def _refused(self, seed: int, outcome, error: Exception) -> None:
        if hasattr(outcome, "trajectories"):
            reason = (f"the rollout returned a {type(outcome).__name__}; it must return one Trajectory "
                      "(artmlx calls it group_size times per group)")
        elif isinstance(error, TrajectoryRefused):
            reason = f"trajectory refused: {error}"[:300]
        else:
            reason = f"trajectory refused: {type(outcome).__name__} is not a Trajectory ({type(error).__name__}: {error})"[:300]
        self.failures.failed(reason, f"trajectory of scenario {seed}: {reason}")

    @property
    def stats(self) -> dict:
        """Totals for the actor's heartbeat (`protocol.admission.AGENT_STATS`)."""
        counts = self.failures.counts
        refused = sum(n for reason, n in counts.items() if reason.startswith("trajectory refused"))
        return {"rollouts_played": self.played, "rollout_failures": sum(counts.values()) - refused,
                "trajectories_refused": refused, "groups_dropped": self.groups_dropped,
                "groups_short": self.groups_short, **self.server.token_counts}

    def failing_message(self) -> str:
        function = inspect.unwrap(self.rollout)
        try:
            where = f"{inspect.getsourcefile(function)}:{function.__code__.co_firstlineno}"
        except (TypeError, AttributeError):
            where = "unknown file"
        given = ("an AgentModel (ART's model interface: openai_client(), get_inference_name(), name, get_step())"
                 if self.takes_model else
                 "an openai.AsyncOpenAI client (name the first parameter `model` or annotate it art.Model to get "
                 "ART's model interface instead)")
        reasons = "; ".join(f"{reason} (x{count:,})" for reason, count in self.failures.counts.most_common(5))
        first = "\n".join("    " + line for line in self.failures.first_of_streak.splitlines())
        return (f"rollout {self.spec} failed {self.failures.consecutive:,} times in a row "
                f"(rollout_failure_limit = {self.failure_limit}); stopping.\n"
                f"  function: {signature_text(self.rollout)}, defined at {where}\n"
                f"  its first argument: {given}\n"
                f"  failures so far: {reasons}\n"
                f"  the first of these failures:\n{first}")

    def close(self) -> None:
        """Close the client and stop the server's scheduler thread, waiting until that thread is gone."""
        self.loop.run_until_complete(self.client.close())
        self.loop.close()
        self.server.close()
        wait_for_thread_exit(self.scheduler_thread)


def serve_policy(rollouts: AgentRollouts, model, version: int) -> None:
    """Give the agents' server (its own copy of the base) the adapter `model` trains now, as `version`. The
    weights pass as NumPy arrays: the server's thread makes its MLX arrays itself (it owns their stream)."""
    import mlx.core as mx
    import numpy as np

    from ..model.policy import adapter_weights

    weights = {name: np.array(value) for name, value in adapter_weights(model, mx.float32).items()}
    rollouts.set_adapter(lambda: {name: mx.array(value) for name, value in weights.items()}, version)


def agent_rollouts(config, rows: int, seed: int, scenarios: list | None = None, tick=None,
                   failure_limit: int = 0, budget: int = 0) -> AgentRollouts:
    """The run's rollout function on a new in-process server of `rows` concurrent requests; with a memory
    `budget` (bytes), as many of those as fit it beside a prefix cache holding a finished turn for each
    (`MemoryPlan.agent_sizes`), instead of the server's default 1 GB prefix cache."""
    from ..engine.memory import plan_for, slots_for
    from ..model.policy import LoraSpec
    from ..serve.model_server import ModelServer, ServeConfig
    from .agent_code import load_rollout, load_scenarios

    rollout = load_rollout(config.rollout)
    scenarios = load_scenarios(config.scenarios) if scenarios is None else scenarios
    server = ModelServer(ServeConfig(model=config.model, name=MODEL_NAME, max_rows=rows,
                                     max_prompt_tokens=config.max_episode_tokens,
                                     max_tokens=config.max_episode_tokens, seed=seed, decode_chunk=config.decode_chunk),
                         LoraSpec.from_config(config))
    if budget:  # sized once the model is loaded, before any request (the scheduler reads these between steps)
        plan = plan_for(server.model, budget)
        rows, prefix_bytes = plan.agent_sizes(slots_for(config.max_episode_tokens, config.max_reply_tokens), rows)
        server.scheduler.max_rows = rows
        if server.scheduler.prefix is not None:
            server.scheduler.prefix.max_bytes = prefix_bytes
    return AgentRollouts(server, rollout, scenarios, config.temperature, tick=tick, failure_limit=failure_limit,
                         spec=config.rollout, min_group_size=config.min_group_size, hint_form=config.hint_form)


def wait_for_thread_exit(native_id: int, timeout_s: float = 5.0) -> None:
    """Wait until this process's OS thread `native_id` has ended.

    `Thread.join()` returns once a thread's Python state is gone, before its C++ thread-local
    destructors run; MLX's take the GIL. If the main thread reaches interpreter shutdown first,
    that thread is made to exit inside a destructor and the process aborts ("terminate called
    without an active exception", exit -6): measured on one exit in two after `ModelServer.close()`
    before the scheduler's thread cleared its MLX streams on the way out (61df8e3). Waiting here
    covers any thread-local state that is left. Linux lists live threads in /proc/self/task;
    elsewhere a short sleep has to do.
    """
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        time.sleep(0.1)
        return
    deadline = time.monotonic() + timeout_s
    while (tasks / str(native_id)).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
