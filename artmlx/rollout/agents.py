"""Agent rollouts: a user's `async def rollout(client, scenario) -> Trajectory` played on the engine.

The alternative to an environment (`--env`): agent code written as ART writes it, an async function
that talks to the policy through an OpenAI client and returns a trajectory (`messages_and_choices`,
`reward`, `metrics`, `metadata`: ART's field names, so the same function runs under ART's own
backends). `--rollout module:function` (or `path/to/file.py:function`) names it; `--scenarios`
names what each group plays: a JSONL file (one scenario per line) or `module:name` of a list or of a
function returning an iterable. Group k of an actor plays scenario `seed % len(scenarios)` (seeds
are random per actor); without scenarios the scenario is `{"seed": seed}`.

`AgentRollouts.play` runs the G rollouts of every group of a batch concurrently on one asyncio loop.
Their client is the real `openai.AsyncOpenAI` talking to `artmlx serve`'s API in-process (httpx's
ASGI transport, no socket), and the server's scheduler batches every concurrent request into one
forward per decode step: the same engine the server uses. The model is named `policy`. Trajectories
become token-exact episodes (`art/tokens.py`). An exception in user code, or a trajectory that cannot
be made token-exact, drops that group (a group needs all G episodes); it is counted in
`failures` with its reason and the actor goes on.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..art.tokens import TrajectoryRefused, messages_before, trajectory_episode
from ..trajectory import Group

MODEL_NAME = "policy"


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


def load_object(spec: str, what: str):
    """`module:name` or `path/to/file.py:name`; the working directory is importable."""
    module_name, _, name = spec.rpartition(":")
    if not module_name or not name:
        raise ValueError(f"{what} {spec!r} must be module:name or path/to/file.py:name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            if loaded is None or not path.exists():
                raise ImportError(f"no file {path}")
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{what} {spec!r}: cannot import {module_name!r} ({error})") from error
    if not hasattr(module, name):
        raise ValueError(f"{what} {spec!r}: {module_name!r} has no {name!r}")
    return getattr(module, name)


def load_rollout(spec: str) -> Callable:
    function = load_object(spec, "rollout")
    if not asyncio.iscoroutinefunction(function):
        raise ValueError(f"rollout {spec!r} must be an async function: async def rollout(client, scenario)")
    return function


def load_scenarios(spec: str) -> list:
    if not spec:
        return []
    if spec.endswith(".jsonl") or Path(spec).is_file():
        lines = [line for line in Path(spec).read_text().splitlines() if line.strip()]
        try:
            scenarios = [json.loads(line) for line in lines]
        except json.JSONDecodeError as error:
            raise ValueError(f"scenarios {spec}: line {error.lineno} is not JSON ({error.msg})") from error
    else:
        source = load_object(spec, "scenarios")
        scenarios = list(source() if callable(source) else source)
    if not scenarios:
        raise ValueError(f"scenarios {spec!r} is empty")
    return scenarios


class AgentRollouts:
    """The actor's rollouts when the run names an agent (`rollout`) instead of an environment."""

    def __init__(self, server, rollout: Callable, scenarios: list, temperature: float,
                 tick: Callable[[], None] | None = None, tick_s: float = 0.5):
        """`tick` is called every `tick_s` while groups play (the actor's socket: heartbeats and acks must
        flow while a batch of agents runs for minutes)."""
        import httpx
        import openai

        from ..serve.openai_api import Api

        self.server = server
        self.rollout = rollout
        self.scenarios = scenarios
        self.temperature = temperature
        self.failures: list[str] = []
        self.tick, self.tick_s = tick, tick_s
        self.loop = asyncio.new_event_loop()  # one loop for the actor's life: the client's pool lives on it
        asyncio.set_event_loop(self.loop)
        transport = httpx.ASGITransport(app=Api(server).app())
        self.client = openai.AsyncOpenAI(base_url="http://policy/v1", api_key="in-process", max_retries=0,
                                         http_client=httpx.AsyncClient(transport=transport, timeout=None))

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
        self.server.call(lambda: self.server.scheduler.set_adapter(version, make_tensors())).result()

    def play(self, seeds: list[int], group_size: int, key=None, policy_version: int = 0) -> list[Group]:
        """Play `group_size` rollouts of each seed's scenario, all concurrently; groups whose rollouts all
        succeeded, in seed order. `key` is unused: sampling is the server's."""
        results = self.loop.run_until_complete(self._groups(seeds, group_size, policy_version))
        return [group for group in results if group is not None]

    async def _groups(self, seeds: list[int], group_size: int, version: int) -> list[Group | None]:
        ticking = asyncio.ensure_future(self._ticks()) if self.tick else None
        try:
            return await asyncio.gather(*(self._group(seed, group_size, version) for seed in seeds))
        finally:
            if ticking is not None:
                ticking.cancel()

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.tick()

    async def _group(self, seed: int, group_size: int, version: int) -> Group | None:
        scenario = self.scenario(seed)
        outcomes = await asyncio.gather(*(self.rollout(self.client, scenario) for _ in range(group_size)),
                                        return_exceptions=True)
        episodes = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # KeyboardInterrupt and the like are not the agent's
                self.failures.append(f"scenario {seed}: {type(outcome).__name__}: {outcome}")
                return None
            try:
                episodes.append(trajectory_episode(outcome, self.server.chat, self.temperature,
                                                   self.server.model.args.vocab_size))
            except (TrajectoryRefused, AttributeError, TypeError, ValueError) as error:
                self.failures.append(f"scenario {seed}: trajectory refused: {error}")
                return None
        # the group is as old as its oldest sampled token (the learner's staleness bound applies to it)
        oldest = min(e.info["adapter_version"] if e.info.get("adapter_version") is not None else version
                     for e in episodes)
        return Group(seed=seed, episodes=episodes, policy_version=oldest)

    def close(self) -> None:
        """Close the client and stop the server's scheduler thread (before the interpreter exits)."""
        self.loop.run_until_complete(self.client.close())
        self.loop.close()
        self.server.close()
