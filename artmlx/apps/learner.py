"""`artmlx learner`: the learner process of the pipeline.

It binds the protocol's ROUTER socket, serves the run configuration to actors, buffers the groups
they stream in, drops (and counts) groups whose policy version lags the current one by more than
`max_staleness`, runs a GRPO update as soon as `groups_per_step` fresh groups are buffered,
broadcasts the new adapter, evaluates and checkpoints periodically (with the ids of consumed
groups, so a resumed learner recognises resends), and stops after `steps` updates. An agent run
(`rollout`) is evaluated with the agent itself on `eval_scenarios`, on the learner's own in-process
server of the policy (`_evaluate_agent`), or not at all: its `env` is not its task. SIGINT/SIGTERM
write a checkpoint first. Acknowledging a group only once it is consumed bounds the buffer to
`max_in_flight` groups per actor. On a terminal a live view (apps/learner_view.py) shows the state that
`artmlx status` prints; on a pipe the metrics rows are plain lines, with the status after each eval.
With `colocated_actors` it also runs that many actors as threads over its own base weights
(`apps/colocated.py`), which connect to its socket like any actor; its training plan then takes its share of
the budget. With `ranks` (several learner processes, `apps/learner_ranks.py`) this is rank 0: it hands each
update's groups to the other ranks, which train their share of it.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..config import TrainConfig
from ..engine.loading import open_policy
from ..engine.memory import plan_for
from ..envs.base import make_env, outcomes_of
from ..rollout.evaluation import evaluate, evaluate_agent, unevaluated_note
from ..metrics import check_sinks, open_metrics
from ..model.families import vocab_size
from ..model.policy import LoraSpec, adapter_weights, fingerprint
from ..protocol.admission import AGENT_STATS, SAMPLING_STATS, GroupLimits, inbound_message_limit
from ..protocol.convert import message_to_group
from ..protocol.hub import CONSUMED_KEPT_VERSIONS, LearnerHub
from ..procstats import process_stats
from ..protocol.ledger import RUN_SETTLED, checked_run_totals, run_totals
from ..protocol.sockets import LearnerSocket
from ..protocol.status import format_status
from ..rollout.episodes import EpisodeRollouts, SamplingParams
from ..rundir import prepare_run_dir
from ..learner.checkpoint import latest_checkpoint, load_checkpoint, save_run_state
from ..learner.settings import TrainerSettings
from ..learner.trainer import GRPOTrainer
from .colocated import ColocatedActors, role_budgets
from .learner_ranks import RankLink, RankLost, check_same_start, peer_lost
from .learner_view import LiveView


class LearnerService:
    def __init__(self, config: TrainConfig, bind: str, keys: Path | None = None, insecure: bool = False,
                 resume: bool = False, echo: bool = True, live: bool | None = None, colocated_actors: int = 0,
                 ranks: RankLink | None = None):
        """`colocated_actors`: actor threads in this process, sharing its base weights (`apps/colocated.py`);
        `ranks`: the learner's other ranks, when this is rank 0 of several (`apps/learner_ranks.py`)."""
        self.config = config
        self.ranks = ranks
        self.rank_count = 1 if ranks is None else ranks.size
        if ranks is not None and colocated_actors:
            raise ValueError("colocated actors and several learner ranks do not go together yet: use actor processes "
                             "(--placement processes) with --learner-ranks")
        if colocated_actors and config.rollout:
            raise ValueError("colocated actors play environment rollouts; agent rollouts (`rollout`) run in actor "
                             "processes: use `artmlx run --placement processes`")
        self.eval_scenarios: list = []
        if config.rollout:  # the agent's code before anything else (RolloutLoadError: exit status 2)
            from ..rollout.agent_code import load_rollout, load_scenarios

            load_rollout(config.rollout)
            load_scenarios(config.scenarios)
            self.eval_scenarios = load_scenarios(config.eval_scenarios, "eval_scenarios")
        self.unevaluated = unevaluated_note(config.rollout, config.eval_every, self.eval_scenarios, config.env)
        check_sinks(config)
        self.run_dir = prepare_run_dir(config, resume)
        self.spec = LoraSpec.from_config(config)
        opened = open_policy(config.model, self.spec, config.memory_budget_gb, training=True, seed=config.seed)
        self.model, tokenizer, self.trainable, self.plan = opened.model, opened.tokenizer, opened.trainable, opened.plan
        self.colocated = None
        if colocated_actors:  # one budget for both roles: the learner trains inside its share of it
            learner_budget, actor_budget = role_budgets(self.plan.budget, self.plan.shape.weight_bytes, colocated_actors)
            self.colocated = ColocatedActors(self.model, tokenizer, actor_budget, colocated_actors, keys, echo)
            self.plan = plan_for(self.model, learner_budget)
        self.wire_dtype = wire_dtype(config.adapter_wire_dtype, self.plan.shape.activation_bytes)
        self.trainer = GRPOTrainer(self.model, TrainerSettings.of(config), self.plan,
                                   group=ranks.group if ranks is not None else None)
        self.log = open_metrics(self.run_dir, config, echo)
        consumed: dict[str, int] | list[str] = {}
        self.elapsed_before, self.ledger_before = 0.0, {}
        resumed = latest_checkpoint(self.run_dir) if resume else None
        if resume:
            extra = load_checkpoint(resumed, self.trainer)
            consumed = extra.get("consumed", {})  # group id -> policy version (a list in older checkpoints)
            self.elapsed_before = extra.get("time", 0.0)
            self.ledger_before = checked_run_totals(extra.get("ledger"))  # settled by earlier learner processes
            before, now = extra.get("learner_ranks", 1), self.rank_count
            if echo and before != now:  # the checkpoint is one rank's state: any number of ranks goes on from it
                print(f"learner: resuming with {now} learner rank{'s' * (now > 1)}; the checkpoint was written by {before}",
                      flush=True)
            self.log.truncate_after(self.trainer.step)
        if ranks is not None:  # the other ranks take this one's state (a resumed checkpoint travels to them)
            ranks.send_state(resumed)
            check_same_start(ranks, self.trainer)
        self.fingerprint = fingerprint(config.model, self.spec)
        limits = GroupLimits(env=config.env, group_size=config.group_size, vocab_size=vocab_size(self.model),
                             max_tokens=config.max_episode_tokens + config.max_reply_tokens,
                             max_turns=config.max_turns, max_reply_tokens=config.max_reply_tokens,
                             min_group_size=config.min_group_size)
        socket = LearnerSocket(bind, keys=keys, insecure=insecure, max_message_bytes=inbound_message_limit(limits))
        self.hub = LearnerHub(socket, dataclasses.asdict(config),
                              self.fingerprint, max_in_flight=config.resolved_max_in_flight, consumed=consumed,
                              share=config.share_of_update, limits=limits, groups_per_update=config.groups_per_step,
                              actor_timeout_s=config.actor_timeout_s)
        self.hub.policy_version = self.trainer.policy_version
        self.agent_eval = None  # the agent's own rollouts on a server of the policy, made at the first evaluation
        if not config.rollout:
            self.eval_engine = EpisodeRollouts(self.model, tokenizer, lambda: make_env(config.env, config.env_args),
                                               SamplingParams.from_config(config), self.plan)
            self.outcomes = outcomes_of(make_env(config.env, config.env_args))
        self.buffer: list = []
        self.checkpointed_step = self.trainer.step if resume else -1
        self.stop_reason: str | None = None
        self.echo = echo
        self.view = LiveView(live=live if echo else False)
        if self.colocated is not None and self.view.live_enabled:  # the terminal is the view's, as under `artmlx run`
            self.colocated.log_dir = self.run_dir / "logs"
            self.colocated.log_dir.mkdir(exist_ok=True)
        self.staleness_histogram: collections.Counter[str] = collections.Counter()
        self.failed = False  # the run could not go on (every colocated actor gave up): a non-zero exit
        self.updating = False

    @property
    def address(self) -> str:
        return self.hub.socket.address

    def _now(self) -> float:
        return time.perf_counter() - self.started

    def run(self) -> Path:
        """Train to the end; a run that could not go on (`failed`) raises ValueError with the reason, after its
        final checkpoint and row."""
        with self.view:
            run_dir = self._run()
        if self.failed:
            raise ValueError(self.stop_reason)
        return run_dir

    def _show(self, **fields) -> None:
        """Update what the live view and `artmlx status` show, and redraw now."""
        self.hub.extra_status.update(fields)
        self.view.update(self.hub.status, force=True)

    def _run(self) -> Path:
        self.started = time.perf_counter() - self.elapsed_before
        self.hub.extra_status.update(run_dir=str(self.run_dir), steps=self.config.steps, step=self.trainer.step,
                                     started_unix=time.time() - self.elapsed_before,
                                     staleness_histogram=self.staleness_histogram)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda number, frame: self._request_stop(f"signal {number}"))
        self.reload_keys = False
        if hasattr(signal, "SIGHUP"):  # re-read the allowed actor keys: revocation without a restart
            signal.signal(signal.SIGHUP, lambda number, frame: setattr(self, "reload_keys", True))
        if self.ranks is not None and hasattr(signal, "SIGUSR1"):  # `artmlx run` restarts the ranks (one was lost)
            signal.signal(signal.SIGUSR1, lambda number, frame: self._request_stop(RESTART_REASON))
        self.hub.publish(self.trainer.policy_version, adapter_weights(self.model, self.wire_dtype))
        if self.colocated is not None:
            self.colocated.start(self.address)
        if self.echo:
            print(f"learner on {self.address}: run {self.run_dir}, fingerprint {self.fingerprint}, "
                  f"{self.trainable:,} LoRA parameters", flush=True)
            if self.unevaluated:
                print(f"learner: {self.unevaluated}", flush=True)
        window_start, idle = time.perf_counter(), 0.0
        received_tokens = 0
        try:
            if self.trainer.step == 0 and self.config.eval_every:
                self._evaluate()
                window_start = time.perf_counter()  # the first update's idle time starts after the evaluation
            while self.trainer.step < self.config.steps and self.stop_reason is None:
                if self.reload_keys:
                    self.reload_keys = False
                    allowed = self.hub.socket.reload_keys()
                    if self.echo:
                        print(f"learner: re-read the allowed keys on SIGHUP: {allowed} allowed", flush=True)
                waited = time.perf_counter()
                ready = len(self.buffer) >= self.config.groups_per_step  # then only take what is already here
                for _, message in self.hub.poll(0 if ready else 50):
                    self.buffer.append(message)
                    received_tokens += int(message.policy_mask.sum())
                self._drop_stale()
                self.hub.extra_status["queue_depth"] = len(self.buffer)
                idle += time.perf_counter() - waited
                if self.colocated is not None and self.colocated.all_gave_up and not self.hub.actors:
                    self.stop_reason = "every colocated actor failed and was given up (its errors are above)"
                    self.failed = True
                    break
                if len(self.buffer) < self.config.groups_per_step:
                    self.hub.extra_status["phase"] = "waiting for groups"
                    self.view.update(self.hub.status)
                    continue
                self._show(phase="training")
                row = self._update()
                span = time.perf_counter() - window_start
                row.update(learner_idle_frac=idle / max(span, 1e-9), gen_tokens_per_s=received_tokens / max(span, 1e-9))
                self.log.write(row)
                self.hub.extra_status.update({k: row[k] for k in (  # queue_depth is kept current by the loop
                    "step", "reward_mean", "learner_idle_frac", "gen_tokens_per_s", "train_tokens_per_s")})
                window_start, idle, received_tokens = time.perf_counter(), 0.0, 0
                self._after_update()
        except BaseException as error:  # the final row and the actors must say it crashed, not finished
            if self.ranks is not None and peer_lost(error):  # the ranks come back from the checkpoint; actors stay
                self.stop_reason = RESTART_REASON
                raise RankLost(f"learner rank 0: {error}") from error
            self.stop_reason = self.stop_reason or f"learner crashed: {type(error).__name__}: {error}"
            raise
        finally:
            self._finish()
        return self.run_dir

    def _request_stop(self, reason: str) -> None:
        self.stop_reason = reason

    def _drop_stale(self) -> None:
        version, limit = self.trainer.policy_version, self.config.max_staleness
        keep = []
        for message in self.buffer:
            if version - message.policy_version > limit:
                self.hub.consume(message.group_id, "stale", f"sampled at v{message.policy_version}, learner at v{version}",
                                 policy_version=message.policy_version)
            else:
                keep.append(message)
        self.buffer = keep

    def _update(self) -> dict:
        batch, self.buffer = self.buffer[: self.config.groups_per_step], self.buffer[self.config.groups_per_step:]
        staleness = [self.trainer.policy_version - m.policy_version for m in batch]
        self.staleness_histogram.update(str(lag) for lag in staleness)
        groups = [message_to_group(m) for m in batch]
        mx.reset_peak_memory()
        started = time.perf_counter()
        self.updating = True  # an update cut short (a lost rank) leaves no checkpoint of its half-made state
        if self.ranks is not None:
            self.ranks.send_update(batch)
        stats = self.trainer.train_step(groups)
        self.updating = False
        seconds = time.perf_counter() - started
        stats["peak_memory_gb"] = mx.get_peak_memory() / 2**30
        stats.update(process_stats())  # what a long run watches for growth (benchmarks/soak.py)
        for message in batch:
            self.hub.consume(message.group_id, "trained", policy_version=message.policy_version)
        # Ids are remembered for CONSUMED_KEPT_VERSIONS versions (bounded memory): a copy resent after a
        # cut link is then a duplicate, not a second settlement; an older copy is dropped as stale.
        kept = max(self.config.max_staleness, CONSUMED_KEPT_VERSIONS)
        self.hub.forget_consumed(self.trainer.policy_version - kept)
        self.hub.publish(self.trainer.policy_version, adapter_weights(self.model, self.wire_dtype))
        return {
            **self.trainer.position(), "time": self._now(),
            "tokens": sum(g.tokens for g in groups), "train_seconds": seconds,
            "train_tokens_per_s": stats["tokens_trained"] / max(seconds, 1e-9),
            "staleness_max": max(staleness), "staleness_mean": float(np.mean(staleness)),
            "learner_ranks": self.rank_count,
            **self._group_counts(), "actors": len(self.hub.actors), "queue_depth": len(self.buffer),
            **stats,
        }

    def _group_counts(self) -> dict:
        counts = self.hub.counts
        return {"groups_received": counts["received"], "groups_trained": counts["trained"],
                "groups_stale": counts["stale"], "groups_duplicate": counts["duplicate"],
                "groups_rejected": counts["rejected"], "groups_settled_earlier": counts["settled_earlier"],
                "messages_rejected": self.hub.socket.rejections.total}

    def _run_ledger(self) -> dict:
        """The whole run's settled groups, earlier learner processes included (`ledger.run_totals`)."""
        return {f"run_groups_{key}" if key in RUN_SETTLED else f"run_{key}": value
                for key, value in run_totals(self.ledger_before, self.hub.counts).items()}

    def _after_update(self) -> None:
        step, config = self.trainer.step, self.config
        if config.eval_due(step):
            self._evaluate()
        if config.checkpoint_due(step):
            self._checkpoint()

    def _evaluate(self) -> None:
        if self.unevaluated:
            return  # said once at the start
        self._show(phase="evaluating")
        if self.config.rollout:
            row = self._evaluate_agent()
            if row is None:  # stopped by a signal midway: no row
                return
        else:
            row = evaluate(self.eval_engine, self.config.eval_episodes, self.outcomes,
                           self.config.resolved_eval_temperature(), seed=self.config.seed)
        self.log.write({**self.trainer.position(), "time": self._now(), **row})
        self._show(eval_score=row["eval_score"], eval_step=self.trainer.step)
        if self.echo and not self.view.live_enabled:
            print(format_status(self.hub.status()), flush=True)

    def _evaluate_agent(self) -> dict | None:
        """The agent itself, on the held-out scenarios, through its own in-process server of the policy.

        That server holds a second copy of the base model (in this process) and gets the current adapter
        before each evaluation; sampling is the agent's (its requests' temperature)."""
        from ..rollout.agents import agent_rollouts, serve_policy

        if self.agent_eval is None:
            rows = min(len(self.eval_scenarios), self.config.share_of_update(1) * self.config.group_size)
            self.agent_eval = agent_rollouts(self.config, max(1, rows), seed=self.config.seed, scenarios=[],
                                             tick=lambda: self.stop_reason is not None)
        serve_policy(self.agent_eval, self.model, self.trainer.policy_version)
        row = evaluate_agent(self.agent_eval, self.eval_scenarios)
        if self.echo:
            for first in self.agent_eval.failures.firsts():
                print(f"learner: an evaluation rollout failed: {first}", flush=True)
        return row

    def _checkpoint(self) -> None:
        self._show(phase="checkpointing")
        self.checkpointed_step = self.trainer.step
        save_run_state(self.run_dir, self.trainer, self.spec, self.config.model,
                       {"time": self._now(), "seed": self.config.seed, "consumed": dict(sorted(self.hub.consumed.items())),
                        "learner_ranks": self.rank_count, "ledger": run_totals(self.ledger_before, self.hub.counts)},
                       self.config.keep_checkpoints)

    def _finish(self) -> None:
        if self.ranks is not None and self.stop_reason is None:  # finished: the other ranks stop with it (after a
            self.ranks.send_stop()  # fault or a signal their supervisor stops them: one of them may be gone)
        checkpoint_error = ""
        if self.checkpointed_step != self.trainer.step and not self.updating:
            try:
                self._checkpoint()
            except (OSError, RuntimeError) as error:  # a full disk (MLX: RuntimeError): the previous one stays; actors must still hear
                checkpoint_error = f"; the final checkpoint failed ({error}), the latest good one is kept"
        reason = (self.stop_reason or f"training finished after {self.trainer.step} updates") + checkpoint_error
        if reason != RESTART_REASON:  # a restart comes back from this checkpoint: actors stay, and no final row yet
            self._show(phase="stopping actors")
            try:
                unconfirmed = self.hub.shutdown(reason)
            finally:
                if self.colocated is not None:
                    self.colocated.stop()
            self._show(phase=f"done: {reason}")
            self.log.write({**self.trainer.position(), "time": self._now(), "final": True, **self._group_counts(),
                            **self.hub.ledger(), **self._run_ledger(), "actors_peak_memory_gb": self.hub.actor_memory(),
                            "actors_unconfirmed": unconfirmed, **self.hub.actor_totals(AGENT_STATS + SAMPLING_STATS),
                            "stop_reason": reason})
        self.log.close()
        self.hub.socket.close()
        if self.agent_eval is not None:
            self.agent_eval.close()


RESTART_REASON = "restarting the learner's ranks (one was lost)"


def wire_dtype(setting: str, activation_bytes: int) -> mx.Dtype:
    """The dtype adapters are broadcast in: the setting, or for `auto` bfloat16 when the base computes in 2 bytes."""
    if setting == "auto":
        return mx.bfloat16 if activation_bytes == 2 else mx.float32
    return getattr(mx, setting)
