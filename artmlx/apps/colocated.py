"""Colocated actors: actors as threads of the learner's process, for a single device.

One device (a Mac, one GPU) running a learner process and actor processes holds the base model once per
process, and the processes take turns on the device without knowing of each other. Here the actors run in
the learner's process instead: each plays with a second module tree over the learner's own arrays
(`model.policy.share_base`: the base held once, the adapter tensors its own, replaced as broadcasts arrive)
on its own MLX stream (streams belong to threads), so its decode steps and the learner's training run side by
side on the device, and the interpreter's lock is released while either waits for the device.

Everything else is the pipeline unchanged: a colocated actor connects to the learner's socket over loopback
and speaks the protocol like any actor (hello with the fingerprint, the admission window, policy versions and
the staleness bound, the ledger, shutdown), so checkpoints, resume and remote actors joining the same learner
work as they do with actor processes.

Memory: the process's budget holds the weights once; what is left is split between the learner's training
(`LEARNER_SHARE`) and the actors' KV caches, each role's plan sized from its share (`role_budgets`).

An actor thread that raises is restarted like a crashing actor process (`apps/launch.py`'s delays), and
given up after `MAX_QUICK_CRASHES` crashes in a row, each within `STABLE_S` of its start.
"""

from __future__ import annotations

import threading
import time
import traceback
from pathlib import Path

import mlx.core as mx

from ..engine.loading import OpenPolicy
from ..engine.memory import MemoryPlan, plan_for
from ..model.policy import evaluate_all, share_base
from .actor import ActorService
from .launch import MAX_QUICK_CRASHES, RESTART_DELAY_MAX_S, RESTART_DELAY_S, STABLE_S

LEARNER_SHARE = 0.5  # of the budget beyond the weights: the learner's activations; the rest the actors' KV
JOIN_S = 30.0  # an actor told to stop leaves at its batch's next turn


def role_budgets(budget: int, weight_bytes: int, actors: int) -> tuple[int, int]:
    """(the learner's budget, each actor's): the weights counted once in each, the rest split between roles."""
    free = max(budget - weight_bytes, 0)
    return (weight_bytes + int(free * LEARNER_SHARE),
            weight_bytes + int(free * (1 - LEARNER_SHARE) / max(actors, 1)))


class ColocatedActors:
    """`count` actor threads playing with `model`'s base for the learner at `address`."""

    def __init__(self, address: str, model, tokenizer, plan: MemoryPlan, count: int, echo: bool = True):
        self.address = address
        evaluate_all(model)  # here, on the learner's thread: nothing lazy may reach the actors' streams
        self.model, self.tokenizer = model, tokenizer
        self.count = count
        self.echo = echo
        _, self.actor_budget = role_budgets(plan.budget, plan.shape.weight_bytes, count)
        self.services: dict[int, ActorService] = {}
        self.threads = [threading.Thread(target=self._serve, args=(index,), name=f"colocated-actor-{index}",
                                         daemon=True) for index in range(count)]
        self.stopping = False
        self.log_dir: Path | None = None  # set by a learner with a live view: each actor's lines go to LOG_DIR/NAME.log

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        """After the learner's shutdown: ask any actor still playing to stop, wait for the threads to end."""
        self.stopping = True
        for service in list(self.services.values()):
            service._request_stop("the learner stopped")
        deadline = time.monotonic() + JOIN_S
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def say(self, text: str) -> None:
        if self.log_dir is not None:
            with open(self.log_dir / "run.log", "a") as log:
                print(f"[colocated] {text}", file=log)
        elif self.echo:
            print(f"[colocated] {text}", flush=True)

    def _serve(self, index: int) -> None:
        name, crashes = f"actor-{index}", 0
        with mx.stream(mx.new_thread_local_stream(mx.default_device())):
            while not self.stopping:
                twin = share_base(self.model)
                policy = OpenPolicy(twin, self.tokenizer, 0, self.actor_budget, plan_for(twin, self.actor_budget))
                started = time.monotonic()
                try:
                    log = self.log_dir / f"{name}.log" if self.log_dir is not None else None
                    self.services[index] = ActorService(self.address, name, echo=self.echo, policy=policy, log=log)
                    self.services[index].run()
                    break
                except SystemExit:  # stopped before the learner welcomed it
                    break
                except Exception as error:  # the thread's edge: said with its traceback, then restarted
                    crashes = crashes + 1 if time.monotonic() - started < STABLE_S else 1
                    self.say(f"{name} failed: {type(error).__name__}: {error}\n{traceback.format_exc()}")
                    if crashes >= MAX_QUICK_CRASHES:
                        self.say(f"{name} failed {crashes} times in a row, each within {STABLE_S:.0f} s of starting; "
                                 "not restarting it")
                        break
                    delay = min(RESTART_DELAY_MAX_S, RESTART_DELAY_S * 2 ** (crashes - 1))
                    self.say(f"restarting {name} in {delay:.1f} s")
                    time.sleep(delay)
            mx.synchronize()
        # this thread's streams go with it, not in C++ thread-local teardown at exit (see engine/scheduler.py)
        mx.clear_streams()
