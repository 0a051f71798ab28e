"""`artmlx actor`: an actor process of the pipeline.

It needs only the learner's address (and keys): it says hello, receives the run configuration,
loads the base model itself, says hello again with the fingerprint of what it loaded (a mismatch is
refused with the reason and the actor exits with it), waits for the current adapter, then loops:
apply the newest adapter in place (no reload), play a batch of groups with the engine's batched
rollouts, tag them with the policy version they were sampled with, and submit them through the
flow-control window. A batch starts only when all of it fits the window, so it is sampled with the
newest adapter that arrived while the learner trained. With dynamic sampling on (the default), a
group whose episodes all got the same reward is counted and not sent (`rollout/dynamic_sampling.py`). Task seeds come from a per-process random
stream, so no two actors play the same episodes. It exits cleanly when the learner says shutdown.

Its memory budget is its own machine's (`--memory-budget-gb`, default 75 % of the device, shared
with the other processes `artmlx run` put on it), never the learner's. A batch is as many groups as
that budget's KV cache and the device hold (`engine/memory.py`), at most the share of one update
the learner asks of each actor, unless the run fixes `actor_groups_per_batch`. Its heartbeats report
groups per batch, generation rate, peak memory and device, which the learner shows.

Stopping: a signal or the learner's shutdown ends the batch being played at its next turn (agent
rollouts: within half a second); its groups were never sent, so the ledger does not miss them.
An actor that stops on its own tells the learner it leaves. Agent rollouts (`--rollout`) that fail
`rollout_failure_limit` times in a row stop the actor with one message naming the function, its
signature and the first error (`artmlx actor` exits with 3); agent code that cannot be loaded
exits with 2. Failed rollouts are reported once per kind, with the traceback, and then as counts.
"""

from __future__ import annotations

import os
import signal
import socket as socketlib
import time
import uuid
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..config import TrainConfig, validate
from ..engine.loading import OpenPolicy, open_policy
from ..engine.memory import apply_limits, resolve_budget
from ..envs.base import make_env
from ..seeds import EVAL_SEED_BASE
from ..model.policy import LoraSpec, fingerprint
from ..protocol.client import ActorClient, LearnerGone
from ..protocol.codec import to_mlx
from ..protocol.convert import group_to_message
from ..protocol.sockets import ActorSocket
from ..rollout.agents import RolloutsFailing
from ..rollout.base import Rollouts
from ..rollout.episodes import EpisodeRollouts, SamplingParams
from ..rollout.dynamic_sampling import skip_flat

FAILURE_REPORT_S = 30.0


class ActorService:
    def __init__(self, connect: str, name: str | None = None, keys: Path | None = None, actor_key: str = "actor",
                 echo: bool = True, memory_budget_gb: float = 0.0, host: str = "", policy: OpenPolicy | None = None,
                 log: Path | None = None):
        """`policy`: a colocated actor's (a thread of the learner's process, `apps/colocated.py`): the model it
        plays with, sharing the learner's base weights, inside its share of the learner's budget. It then
        installs no signal handlers (the learner's thread has them) and sets no process-wide memory limits.
        `log`: a file its lines are appended to instead of stdout (a colocated actor beside the live view)."""
        self.policy = policy
        self.log = log
        self.name = name or f"{socketlib.gethostname()}-{uuid.uuid4().hex[:6]}"
        self.client = ActorClient(ActorSocket(connect, keys=keys, actor_key=actor_key), self.name)
        self.client.host = host or self.client.host
        self.echo = echo
        self.stop = False
        self.nonce = uuid.uuid4().int & ((1 << 62) - 1)
        self.memory_budget_gb = memory_budget_gb
        self.patience_s = 60.0  # first report of a silent learner; the interval doubles up to 10 minutes
        self.next_failure_report = time.monotonic() + FAILURE_REPORT_S

    def say(self, text: str) -> None:
        if self.log is not None:
            with open(self.log, "a") as log:
                print(f"[{self.name}] {text}", file=log)
        elif self.echo:
            print(f"[{self.name}] {text}", flush=True)

    def run(self) -> str:
        """Serve the learner until it says shutdown or a signal stops us; the reason. Raises RolloutLoadError
        (the agent's code cannot be loaded) and RolloutsFailing (it failed `rollout_failure_limit` times in a
        row, said here) after leaving cleanly."""
        if self.policy is None:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda number, frame: self.request_stop(f"stopped by signal {number}"))
        welcome = self._hello_until_welcome()
        rollouts = None
        try:
            config = validate(TrainConfig(**welcome.run_config))
            if self.policy is None:
                budget = resolve_budget(self.memory_budget_gb)
                apply_limits(budget)
            else:
                budget = self.policy.budget
            spec = LoraSpec.from_config(config)
            rollouts = self._rollouts(config, spec, budget)
            self.client.hello(fingerprint(config.model, spec))  # raises ActorRefused on a mismatch
            task = f"rollout {config.rollout}" if config.rollout else f"env {config.env}"
            self.say(f"connected: model {config.model}, {task}, learner at v{welcome.policy_version}; "
                     f"{device_description()}, memory budget {budget / 2**30:.1f} GB, "
                     f"{rollouts.max_rows} rows per batch at most")
            self._play(config, rollouts)
        except RolloutsFailing as failing:
            self.say(str(failing))
            self.request_stop("its rollouts keep failing")
            raise
        finally:
            reason = self.client.shutdown_reason or "stopped by signal"
            self.client.leave()
            if rollouts is not None:
                self._report_failures(rollouts, final=True)
                rollouts.close()
            self.say(f"exiting: {reason} (sent {self.client.sent} groups, acks {dict(self.client.acks)})")
            self.client.socket.close()
        return reason

    def _play(self, config: TrainConfig, rollouts: Rollouts) -> None:
        version = self._apply_adapter(rollouts, wait=True)
        rng = np.random.default_rng([config.seed, self.nonce])
        batches, started = 0, time.perf_counter()
        policy_tokens = played = flat_skipped = flat_in_a_row = 0
        while not self.stop and self.client.shutdown_reason is None:
            per_batch = self.groups_per_batch(config, rollouts)
            # Generate only once the whole batch will fit the window, with the newest adapter by then:
            # a batch generated first and then held back would be one more policy version old.
            self._wait_for_room(per_batch)
            if self.stop or self.client.shutdown_reason is not None:
                break
            version = self._apply_adapter(rollouts, wait=False, current=version)
            seeds = rng.integers(0, EVAL_SEED_BASE, size=per_batch).tolist()
            key = mx.random.key(int(rng.integers(0, 2**62)))
            for group in rollouts.play(seeds, config.group_size, key, version):
                played += 1
                policy_tokens += group.policy_tokens
                signal = group.carries_signal(config.hint_group_reward_below)
                if skip_flat(signal, flat_in_a_row, config.dynamic_sampling_rounds):
                    flat_skipped += 1  # dynamic sampling: no gradient in it; the next batch plays new tasks
                    flat_in_a_row += 1
                    continue
                flat_in_a_row = 0
                group.group_id = f"{self.name}-{uuid.uuid4().hex}"
                self._wait_for_room(1)
                self.client.submit(group_to_message(group, self.name, config.env, self.client.fingerprint))
                if self.client.shutdown_reason:
                    break
            batches += 1
            self._report_failures(rollouts)
            self.client.stats = {"batches": batches, "groups_per_batch": per_batch, "groups_played": played,
                                 "groups_flat_skipped": flat_skipped,
                                 "gen_tokens_per_s": policy_tokens / max(time.perf_counter() - started, 1e-9),
                                 "peak_memory_gb": round(mx.get_peak_memory() / 2**30, 3),
                                 "device": device_description(), **rollouts.stats}
            self.client.pump(0)

    def _report_failures(self, rollouts: Rollouts, final: bool = False) -> None:
        """Each kind of failed rollout once with its traceback; repeats as counts every
        `FAILURE_REPORT_S` and at the end, never a line per failure."""
        now = time.monotonic()
        due = final or now >= self.next_failure_report
        if due:
            self.next_failure_report = now + FAILURE_REPORT_S
        for line in rollouts.failures.report("since the last report" if due else ""):
            self.say(line)

    def _tick(self) -> bool:
        """Called while a batch plays: read the socket (heartbeats, acks, a shutdown); True stops the batch."""
        self.client.pump(0)
        return self.stop or self.client.shutdown_reason is not None

    def _wait_for_room(self, count: int) -> None:
        """Wait for window room however long the learner is silent (an evaluation or checkpoint can take
        minutes; a restarted learner answers with a new session): report with growing intervals, never crash."""
        waited, patience = 0.0, self.patience_s
        while True:
            try:
                self.client.wait_for_room(count, timeout_s=patience)
                return
            except LearnerGone:
                waited += patience
                self.say(f"no acknowledgement from the learner for {waited:.0f} s (evaluating, checkpointing or "
                         "gone); still waiting")
                patience = min(2 * patience, 600.0)

    def groups_per_batch(self, config: TrainConfig, rollouts: Rollouts) -> int:
        """The run's fixed number, else what fits, at most the share of an update the learner asks for."""
        if config.actor_groups_per_batch:
            return config.actor_groups_per_batch
        share = self.client.share or config.share_of_update(1)
        return max(1, min(rollouts.groups_per_batch(config.group_size), share))

    def request_stop(self, reason: str) -> None:
        """Stop at the next turn of the batch being played (a signal, or a colocated actor's owner)."""
        self.stop = True
        if self.client.shutdown_reason is None:
            self.client.shutdown_reason = reason  # also ends a wait for a window slot

    def _hello_until_welcome(self):
        while not self.stop:
            try:
                welcome = self.client.hello(timeout_s=10)
            except LearnerGone:
                self.say("waiting for the learner ...")
                continue
            if welcome is None:
                self.say(f"not joining: {self.client.shutdown_reason}")
                break
            return welcome
        raise SystemExit(0)

    def _rollouts(self, config: TrainConfig, spec: LoraSpec, budget: int) -> Rollouts:
        """The environment's batched rollouts, or with `rollout` the agent's against an in-process server."""
        if not config.rollout:
            opened = self.policy or open_policy(config.model, spec, budget / 2**30)
            return EpisodeRollouts(opened.model, opened.tokenizer, lambda: make_env(config.env, config.env_args),
                                   SamplingParams.from_config(config), opened.plan, tick=self._tick)
        from ..rollout.agents import agent_rollouts

        rows = config.actor_groups_per_batch * config.group_size or config.share_of_update(1) * config.group_size
        return agent_rollouts(config, max(rows, config.group_size), seed=int(self.nonce % 2**31), tick=self._tick,
                              failure_limit=config.rollout_failure_limit, budget=budget)

    def _apply_adapter(self, rollouts: Rollouts, wait: bool, current: int = -1) -> int:
        while wait and self.client.adapter is None and not self.stop and self.client.shutdown_reason is None:
            self.client.pump(50)
        adapter = self.client.take_adapter()
        if adapter is None or adapter.policy_version == current:
            return current
        tensors = adapter.tensors
        rollouts.set_adapter(lambda: {name: to_mlx(array) for name, array in tensors.items()}, adapter.policy_version)
        return adapter.policy_version



def device_description() -> str:
    """The MLX device, with the GPU this process was given (CUDA_VISIBLE_DEVICES) where there is one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    device = str(mx.default_device())
    return f"{device}, CUDA_VISIBLE_DEVICES={visible}" if visible is not None and mx.default_device() != mx.cpu else device
