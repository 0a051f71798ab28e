"""`artmlx train`: the synchronous single-process loop (rollouts -> GRPO update -> eval).

It is the baseline that the distributed pipeline must beat. Each update's task seeds and sampling
key are pure functions of (seed, step), and checkpoints restore adapters, optimizer and RNG, so
`--resume` continues exactly where an uninterrupted run would be.

An agent (`rollout`, with `scenarios` and optionally `eval_scenarios`) plays against an in-process
OpenAI-compatible server of the policy, as in an actor: that server holds a second copy of the base
and gets the current adapter before every update and evaluation. Its sampling is the server's own
(seeded once per process), so a resumed agent run continues from the checkpoint but does not repeat
the uninterrupted run's samples exactly.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

import mlx.core as mx

from ..config import TrainConfig
from ..engine.loading import open_policy
from ..envs.base import make_env, outcomes_of
from ..rollout.evaluation import evaluate, evaluate_agent, unevaluated_note
from ..seeds import step_key, step_seed, train_seeds
from ..fast_blas import blas_description
from ..learner.checkpoint import latest_checkpoint, load_checkpoint, save_run_state
from ..learner.settings import TrainerSettings
from ..learner.trainer import GRPOTrainer
from ..metrics import check_sinks, open_metrics
from ..model.policy import LoraSpec, save_adapters
from ..rollout.agents import serve_policy
from ..rollout.dynamic_sampling import sample_with_signal
from ..rollout.episodes import EpisodeRollouts, SamplingParams
from ..rundir import prepare_run_dir


class StopRequest:
    """SIGINT and SIGTERM ask the loop to stop after the update in progress (which is then checkpointed, so
    `--resume` goes on from it); a second signal stops at once, losing that update. Installed only on the
    main thread (signals are delivered there)."""

    def __init__(self):
        self.reason: str | None = None

    def __call__(self, number, frame) -> None:
        if self.reason is not None:
            raise KeyboardInterrupt
        self.reason = f"stopped by signal {signal.Signals(number).name}"
        print(f"{self.reason}: finishing the update in progress, then checkpointing (again to stop now)",
              flush=True)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def train(config: TrainConfig, resume: bool = False, echo: bool = True) -> Path:
    eval_scenarios = _load_agent(config)  # the agent's code before anything else (RolloutLoadError)
    check_sinks(config)
    run_dir = prepare_run_dir(config, resume)
    spec = LoraSpec.from_config(config)
    opened = open_policy(config.model, spec, config.memory_budget_gb, training=True, seed=config.seed)
    model, tokenizer, trainable, plan = opened.model, opened.tokenizer, opened.trainable, opened.plan
    stop = StopRequest()
    if config.rollout:
        from ..rollout.agents import agent_rollouts

        engine = agent_rollouts(config, config.groups_per_step * config.group_size, seed=config.seed,
                                tick=lambda: stop.reason is not None, failure_limit=config.rollout_failure_limit)
        outcomes: tuple = ()
    else:
        engine = EpisodeRollouts(model, tokenizer, lambda: make_env(config.env, config.env_args),
                                 SamplingParams.from_config(config), plan)
        outcomes = outcomes_of(make_env(config.env, config.env_args))
    try:
        return _train(config, resume, echo, run_dir, spec, model, trainable, plan, engine, outcomes, eval_scenarios,
                      stop)
    finally:
        engine.close()


def _load_agent(config: TrainConfig) -> list:
    """An agent run's code and scenarios, loaded to fail early; its held-out scenarios ([] for environments)."""
    if not config.rollout:
        return []
    from ..rollout.agent_code import load_rollout, load_scenarios

    load_rollout(config.rollout)
    load_scenarios(config.scenarios)
    return load_scenarios(config.eval_scenarios, "eval_scenarios")


def _train(config, resume, echo, run_dir, spec, model, trainable, plan, engine, outcomes, eval_scenarios, stop):
    trainer = GRPOTrainer(model, TrainerSettings.of(config), plan)
    log = open_metrics(run_dir, config, echo)
    elapsed = 0.0
    if resume:
        extra = load_checkpoint(latest_checkpoint(run_dir), trainer)
        elapsed = extra.get("time", 0.0)
        log.truncate_after(trainer.step)
    task = f"agent {config.rollout}" if config.rollout else f"env {config.env}"
    unevaluated = unevaluated_note(config.rollout, config.eval_every, eval_scenarios, config.env)
    if echo:
        print(f"run {run_dir}: model {config.model}, {task}, {trainable:,} trainable LoRA parameters, "
              f"{config.groups_per_step}x{config.group_size} episodes per update; "
              f"{mx.default_device()}, BLAS: {blas_description()}; memory {_memory_line(plan, engine)}", flush=True)
        if unevaluated:
            print(unevaluated, flush=True)
    started = time.perf_counter() - elapsed
    eval_temperature = config.resolved_eval_temperature()

    def run_eval():
        if unevaluated:
            return
        if config.rollout:
            serve_policy(engine, model, trainer.policy_version)
            row = evaluate_agent(engine, eval_scenarios)
            if row is None:  # stopped by a signal midway
                return
        else:
            row = evaluate(engine, config.eval_episodes, outcomes, eval_temperature, seed=config.seed)
        log.write({**trainer.position(), "time": time.perf_counter() - started, **row})

    saved_step = trainer.step
    try:
        with stop.installed():
            if trainer.step == 0 and config.eval_every:
                run_eval()
            while trainer.step < config.steps and stop.reason is None:
                saved_step = _update(config, engine, trainer, log, started, spec, run_dir, outcomes, run_eval,
                                     saved_step)
                if config.rollout and echo:  # as an actor reports them: each kind once, then counts
                    for line in engine.failures.report("in this update"):
                        print(line, flush=True)
            if stop.reason is not None and trainer.step > saved_step:
                save_run_state(run_dir, trainer, spec, config.model,
                               {"time": time.perf_counter() - started, "seed": config.seed}, config.keep_checkpoints)
            if stop.reason is not None and echo:
                print(f"{stop.reason} after update {trainer.step}: checkpointed; continue with "
                      f"`artmlx train --out {run_dir} --resume`", flush=True)
    finally:
        log.close()  # ends the W&B run, if any
    if not (run_dir / "adapters").exists():  # a resumed run that had nothing left to do
        save_adapters(model, run_dir / "adapters", spec, config.model)
    return run_dir


def _update(config, engine, trainer, log, started, spec, run_dir, outcomes, run_eval, saved_step) -> int:
    """One update: play groups (with dynamic sampling), train, log, evaluate and checkpoint when due; returns
    the step of the latest checkpoint."""
    step = trainer.step
    mx.random.seed(step_seed(config.seed, step, stream=1))  # LoRA dropout's stream, restored by construction
    mx.reset_peak_memory()  # so each row reports its own update's peak
    t0 = time.perf_counter()
    if config.rollout:  # the agents' server samples from its own copy of the base: give it the current adapter
        serve_policy(engine, trainer.model, trainer.policy_version)
    groups, sampling = sample_with_signal(
        lambda sampling_round, count: engine.play(
            train_seeds(config.seed, step, count, sampling_round), config.group_size,
            step_key(config.seed, step, sampling_round), trainer.policy_version),
        config.groups_per_step, config.dynamic_sampling_rounds, config.hint_group_reward_below)
    t1 = time.perf_counter()
    stats = trainer.train_step(groups)
    t2 = time.perf_counter()
    generated = sum(g.policy_tokens for g in groups)
    log.write({
        **trainer.position(), "time": t2 - started,
        "tokens": sum(g.tokens for g in groups), "gen_tokens": generated,
        "gen_seconds": t1 - t0, "train_seconds": t2 - t1,
        # Per wall second of the whole update, as the learner reports it, so both modes compare.
        "gen_tokens_per_s": generated / max(t2 - t0, 1e-9),
        "train_tokens_per_s": stats["tokens_trained"] / max(t2 - t1, 1e-9),
        "peak_memory_gb": mx.get_peak_memory() / 2**30,
        "outcomes": _count_outcomes(groups, outcomes),
        **sampling, **stats,
    })
    if config.eval_due(trainer.step):
        run_eval()
    if config.checkpoint_due(trainer.step):
        save_run_state(run_dir, trainer, spec, config.model,
                       {"time": time.perf_counter() - started, "seed": config.seed}, config.keep_checkpoints)
        saved_step = trainer.step
    return saved_step


def _count_outcomes(groups, outcomes) -> dict:
    counts = {name: 0 for name in outcomes}
    for group in groups:
        for episode in group.episodes:
            outcome = episode.info.get("outcome")
            if outcome is not None:
                counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def _memory_line(plan, engine) -> str:
    """Budget, weights and the rows per batch the budget gives, for the run's first line."""
    if not isinstance(engine, EpisodeRollouts):  # agents: a server of the policy with its own copy of the base
        return (f"budget {plan.describe(1)['budget_gb']} GB; agents play on an in-process server of the policy "
                f"(a second copy of the base, {engine.max_rows} requests at once)")
    facts = plan.describe(engine.sampling.slots_per_row)
    return (f"budget {facts['budget_gb']} GB, weights {facts['weights_gb']} GB, "
            f"{facts['rows_per_batch']} rows per batch ({facts['kv_mb_per_row']} MB of KV cache each)")
