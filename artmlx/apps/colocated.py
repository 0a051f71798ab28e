"""Colocated actors: actors as threads of the learner's process, for a single device.

One device (a Mac, one GPU) running a learner process and actor processes holds the base model once per
process, and the processes take turns on the device without knowing of each other. Here the actors run in
the learner's process instead: each plays with a second module tree over the learner's own arrays
(`model.policy.share_base`: the base held once, the adapter tensors its own, replaced as broadcasts arrive)
on its own MLX stream (streams belong to threads), so its decode steps and the learner's training can be on
the device at the same time, and the interpreter's lock is released while either waits for the device.

Everything else is the pipeline unchanged: a colocated actor connects to the learner's socket over loopback
and speaks the protocol like any actor (hello with the fingerprint, the admission window, policy versions and
the staleness bound, the ledger, shutdown), so checkpoints, resume and remote actors joining the same learner
work as they do with actor processes.

Memory: the process's budget holds the weights once; what is left is split between the learner's training
(`LEARNER_SHARE`) and the actors' KV caches, each role's plan sized from its share (`role_budgets`).

An actor thread that raises is restarted like a crashing actor process (`apps/launch.py`'s delays), and
given up after `MAX_QUICK_CRASHES` crashes in a row, each within `STABLE_S` of its start; once every one has
given up the learner stops, unless other actors are connected. What a thread cannot survive (a segfault, an
abort in MLX) ends the whole process, learner included: the price of sharing it.

`artmlx run --placement auto` does not choose it: measured, actor processes were as fast or faster everywhere
(`benchmarks/RESULTS.md`). On this 2-core CPU one colocated actor ran about as fast as one actor process; on one
H200, 1.13x `train` against 1.21x for processes on the 0.5B 4-turn workload, and 0.79x against 0.98x
on the 1.5B workload of long prefills, where the learner's update slows fourfold beside the actor
thread in MLX's CUDA-graph bookkeeping.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from pathlib import Path

import mlx.core as mx
import zmq.auth

from ..engine.loading import OpenPolicy
from ..engine.memory import plan_for
from ..model.policy import evaluate_all, share_base
from .actor import ActorService
from .launch import MAX_QUICK_CRASHES, RESTART_DELAY_MAX_S, RESTART_DELAY_S, STABLE_S

LEARNER_SHARE = 0.5  # of the budget beyond the weights: the learner's activations; the rest the actors' KV
JOIN_S = 30.0  # an actor told to stop leaves at its batch's next turn
ACTOR_KEY = "actor"  # the key pair colocated actors take from the learner's --keys folder


def role_budgets(budget: int, weight_bytes: int, actors: int) -> tuple[int, int]:
    """(the learner's budget, each actor's): the weights counted once in each, the rest split between roles."""
    free = max(budget - weight_bytes, 0)
    return (weight_bytes + int(free * LEARNER_SHARE),
            weight_bytes + int(free * (1 - LEARNER_SHARE) / max(actors, 1)))


def check_actor_pair(keys: Path) -> None:
    """Colocated actors connect with the `actor` pair of the learner's --keys folder, which the learner must allow
    (a handshake it refuses is dropped without an answer: the actors would wait for ever)."""
    from ..protocol.security import allowed_keys

    if not (keys / f"{ACTOR_KEY}.key_secret").exists():
        raise ValueError(f"colocated actors connect with an actor key pair from --keys, and {keys} has no "
                         f"{ACTOR_KEY}.key_secret: run `artmlx keygen {keys}` (it writes one), or use actor processes")
    public, _ = zmq.auth.load_certificate(str(keys / f"{ACTOR_KEY}.key"))
    if public.decode("ascii") not in allowed_keys(keys):
        raise ValueError(f"{keys}/{ACTOR_KEY}.key is not in {keys}/allowed/: copy it there to let the colocated "
                         "actors connect")


class ColocatedActors:
    """`count` actor threads playing with `model`'s base, each inside `actor_budget` bytes. `keys`: the learner's
    CURVE folder, which must then hold an actor pair (`artmlx keygen` writes `actor.key` and `actor.key_secret`)."""

    def __init__(self, model, tokenizer, actor_budget: int, count: int, keys: Path | None = None, echo: bool = True):
        if keys is not None:
            check_actor_pair(Path(keys))
        # On the learner's thread, before it trains: nothing lazy may reach the actors' streams, and the tree the
        # actors copy must be the policy at rest (a copy made during a step would take its training mode, a
        # zeroed LoRA scale under `lora_disabled`, or a compile trace's arrays).
        evaluate_all(model)
        self.template = share_base(model)
        self.template.eval()
        self.tokenizer, self.actor_budget, self.keys, self.echo = tokenizer, actor_budget, keys, echo
        self.address = ""
        self.services: dict[int, ActorService] = {}
        self.gave_up: set[int] = set()
        self.threads = [threading.Thread(target=self._serve, args=(index,), name=f"colocated-actor-{index}",
                                         daemon=True) for index in range(count)]
        self.stopping = threading.Event()
        self.log_dir: Path | None = None  # set by a learner with a live view: each actor's lines go to LOG_DIR/NAME.log

    @property
    def all_gave_up(self) -> bool:
        return len(self.gave_up) == len(self.threads)

    def start(self, address: str) -> None:
        """Connect to the learner's bound `address` (a wildcard bind is reached over loopback)."""
        for wildcard, loopback in (("//0.0.0.0:", "//127.0.0.1:"), ("//*:", "//127.0.0.1:"), ("//[::]:", "//[::1]:")):
            address = address.replace(wildcard, loopback)
        self.address = address
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        """After the learner's shutdown: ask any actor still playing to stop, wait for the threads to end."""
        self.stopping.set()
        for service in list(self.services.values()):
            service.request_stop("the learner stopped")
        deadline = time.monotonic() + JOIN_S
        for thread in self.threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))

    def say(self, text: str) -> None:
        if self.log_dir is not None:
            with open(self.log_dir / "run.log", "a") as log:
                print(f"[colocated] {text}", file=log)
        elif self.echo:
            print(f"[colocated] {text}", flush=True)

    def _serve(self, index: int) -> None:
        name, crashes, seen = f"actor-{index}", 0, collections.Counter()
        with mx.stream(mx.new_thread_local_stream(mx.default_device())):
            while not self.stopping.is_set():
                started = time.monotonic()
                try:
                    twin = share_base(self.template)
                    policy = OpenPolicy(twin, self.tokenizer, 0, self.actor_budget, plan_for(twin, self.actor_budget))
                    log = self.log_dir / f"{name}.log" if self.log_dir is not None else None
                    service = ActorService(self.address, name, self.keys, ACTOR_KEY, echo=self.echo, policy=policy,
                                           log=log)
                    self.services[index] = service
                    if self.stopping.is_set():  # stop() may have looked at `services` before this one was there
                        service.request_stop("the learner stopped")
                    service.run()
                    break
                except SystemExit:  # ActorService's way of ending before the learner welcomed it
                    break
                except Exception as error:  # the thread's edge: said (its traceback the first time), then restarted
                    crashes = crashes + 1 if time.monotonic() - started < STABLE_S else 1
                    kind = f"{type(error).__name__}: {error}"
                    seen[kind] += 1
                    self.say(f"{name} failed: {kind}\n{traceback.format_exc()}" if seen[kind] == 1
                             else f"{name} failed again ({seen[kind]} times so far): {kind}")
                    if crashes >= MAX_QUICK_CRASHES:
                        self.say(f"{name} failed {crashes} times in a row, each within {STABLE_S:.0f} s of starting; "
                                 "not restarting it")
                        self.gave_up.add(index)
                        break
                    delay = min(RESTART_DELAY_MAX_S, RESTART_DELAY_S * 2 ** (crashes - 1))
                    self.say(f"restarting {name} in {delay:.1f} s")
                    self.stopping.wait(delay)
            mx.synchronize()
        # this thread's streams go with it, not in C++ thread-local teardown at exit (see engine/scheduler.py)
        mx.clear_streams()
