"""`artmlx run`: the learner and N actor processes on one machine, supervised.

The learner binds a free loopback port; actors connect to it at lower CPU priority
(`actor_niceness`) and every process gets its share of the cores for OpenBLAS, so the learner's
update, the critical path, is never starved; the hub sizes their windows to share one update
between them (capacity-based admission). An actor that dies (non-zero exit) is restarted and
logged; when the learner exits, actors are told to stop (SIGTERM) and are killed if they linger;
Ctrl-C stops the learner (it checkpoints) and the actors. No process is left behind, and the
exit status is the learner's (1 when every actor gave up). On a terminal the learner draws its live view and the
actors write to RUN_DIR/logs/actor-N.log; on a pipe (or with `plain`) everyone prints lines.

Supervision: SIGTERM and SIGHUP stop a run like Ctrl-C: the learner and the actors are told at
once; the learner checkpoints, actors abandon the batch they are playing at its next turn and say
they leave, so the run ends in seconds, not when the longest batch would have. An actor that exits
with 2 (its agent code cannot be loaded) or 3 (its rollouts keep failing) is not restarted: that
would fail the same way. Children die with `artmlx run` even when it is killed outright: on Linux the kernel sends
them SIGTERM (`PR_SET_PDEATHSIG`), and on every system each child watches its parent
(`watch_parent`: when it is re-parented, it stops itself as if signalled). A crashing actor is
restarted after a pause that doubles from `RESTART_DELAY_S` (to `RESTART_DELAY_MAX_S`) while it
keeps crashing within `STABLE_S` of its start; after `MAX_QUICK_CRASHES` such crashes in a row
it is left down and the run says why (the other actors and the learner go on).

Placement: `actor_devices` gives actor i the entry i (cycling): a GPU index (the process sees only
that GPU, `CUDA_VISIBLE_DEVICES`, so a multi-GPU host stands in for several machines) or `cpu`
(MLX's CPU device, `ARTMLX_DEVICE=cpu`); `learner_device` pins the learner likewise. Each process is
told how many processes share its device (`ARTMLX_MEMORY_SHARING`), and its default memory budget is
its share of that device (`engine/memory.py`). On Apple silicon there is one GPU: every GPU process
shares it, and only `cpu` places a process elsewhere. `--placement colocated` runs the actors as threads of
the learner's process instead (`apps/colocated.py`); `choose_placement` says why `auto` chose what it chose.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

from ..config import TrainConfig, config_to_toml
from ..learner.checkpoint import latest_checkpoint
from ..netutil import free_port
from .learner_ranks import EXIT_RANK_LOST


RESTART_DELAY_S = 0.5
RESTART_DELAY_MAX_S = 30.0
STABLE_S = 60.0
MAX_QUICK_CRASHES = 5
PARENT_ENV = "ARTMLX_PARENT_PID"
ACTOR_GRACE_S = 10.0  # an actor told to stop ends its batch at the next turn; then it is killed
ACTOR_LEAVE_S = 30.0  # how long actors may take to leave by themselves once the learner is done
EXIT_UNUSABLE = 2  # the run's agent code or scenarios cannot be loaded (also click's status for bad usage)
EXIT_ROLLOUTS_FAILING = 3  # an actor's rollouts failed `rollout_failure_limit` times in a row
NOT_RESTARTED = {EXIT_UNUSABLE: "its agent code cannot be loaded", EXIT_ROLLOUTS_FAILING: "its rollouts keep failing"}


class _Stopped(Exception):
    """SIGTERM or SIGHUP reached `artmlx run`."""


def _die_with_parent() -> None:
    """In a child before exec: Linux sends it SIGTERM when the parent dies (a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def watch_parent(interval_s: float = 1.0) -> None:
    """In a child of `artmlx run`: stop (SIGTERM to itself) once its parent is gone, on any OS."""
    expected = os.environ.get(PARENT_ENV)
    if not expected or not expected.isdigit():
        return

    def watch():
        while os.getppid() == int(expected):
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def default_actor_count() -> int:
    """One actor per two cores beyond the learner's, at least two.

    Two, because on 2 cores two niced actors beat one (50 updates in 176 s against 224 s): one
    actor cannot keep up with the learner there.
    """
    return max(2, ((os.cpu_count() or 2) - 1) // 2)


def device_env(device: str) -> dict[str, str]:
    """Environment that confines a process to `device` (a GPU index or `cpu`)."""
    if device == "cpu":
        return {"ARTMLX_DEVICE": "cpu"}
    if not device.isdigit():
        raise ValueError(f"a device is a GPU index or 'cpu', got {device!r}")
    return {"CUDA_VISIBLE_DEVICES": device}


def placements(actors: int, actor_devices: list[str], learner_device: str = "") -> tuple[dict, list[dict]]:
    """(learner environment, one environment per actor): device confinement and how many share each device."""
    learner_key = learner_device or "0"
    actor_keys = [actor_devices[i % len(actor_devices)] if actor_devices else "0" for i in range(actors)]
    sharing = {key: 1 + actor_keys.count(key) if key == learner_key else actor_keys.count(key)
               for key in {learner_key, *actor_keys}}
    learner_env = {**(device_env(learner_device) if learner_device else {}),
                   "ARTMLX_MEMORY_SHARING": str(sharing[learner_key])}
    actor_envs = [{**(device_env(key) if actor_devices else {}), "ARTMLX_MEMORY_SHARING": str(sharing[key])}
                  for key in actor_keys]
    return learner_env, actor_envs


def choose_placement(requested: str, actor_devices: list[str], learner_device: str, rollout: str) -> tuple[str, str]:
    """(`processes` or `colocated`, why) for `artmlx run --placement requested` on the devices this process sees.

    `auto` is processes for now: on this 2-core CPU they are what measured best, and colocated actors have not
    been measured on a GPU (or a Mac) yet, so they are not made the default there before they are."""
    if requested == "colocated":
        if actor_devices or learner_device:
            raise ValueError("--placement colocated runs every role on one device: drop --actor-devices and "
                             "--learner-device, or use --placement processes")
        if rollout:
            raise ValueError("--placement colocated plays environment rollouts; agent rollouts (--rollout) run in "
                             "actor processes: use --placement processes")
        return "colocated", "asked for"
    if requested == "processes":
        return "processes", "asked for"
    import mlx.core as mx

    if actor_devices or learner_device:
        return "processes", "devices were given for the roles"
    if mx.default_device() == mx.cpu:
        return "processes", "a CPU device: learner and actors each get their share of the cores"
    gpus = mx.device_count(mx.gpu)
    if gpus > 1:
        return "processes", f"{gpus} GPUs: put actors on the others with --actor-devices"
    return "processes", ("one GPU: actor processes measured as fast as colocated actors or faster on an H200 "
                         "(--placement colocated holds the base model once)")


def run_pipeline(config: TrainConfig, actors: int, resume: bool = False, plain: bool = False,
                 actor_devices: list[str] | None = None, learner_device: str = "", colocated: int = 0,
                 learner_ranks: int = 1) -> int:
    """The learner and `actors` actor processes; with `colocated`, that many actor threads in the learner's
    process (and `actors` 0); with `learner_ranks` > 1, that many learner processes on a ring of loopback ports
    (`apps/learner_ranks.py`), rank 0 the one actors talk to. A lost rank restarts the learner's ranks from the last
    checkpoint (the actors stay and reconnect); one that keeps failing is left out, with fewer ranks."""
    if learner_ranks > 1 and colocated:
        raise ValueError("--learner-ranks and --placement colocated do not go together yet: use --placement processes")
    run_dir = config.resolved_out()
    config.out = str(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file = run_dir / "launch-config.toml"
    config_file.write_text(config_to_toml(config))
    address = f"tcp://127.0.0.1:{free_port()}"
    python = [sys.executable, "-m", "artmlx"]
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        # N + 1 processes share the cores: OpenBLAS threads beyond a process's share spin against the
        # others (2 cores, 8 updates, 2 actors: 48.7 s with OpenBLAS's default, 41.2 s with 1 thread;
        # the learner alone with 2 threads next to niced actors: 41.5 s, against 35.5 s with 1).
        os.environ["OPENBLAS_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // (actors + learner_ranks)))
    live = sys.stdout.isatty() and not plain
    learner_env, actor_envs = placements(actors, actor_devices or [], learner_device)
    learner_cmd = ([*python, "learner", "--bind", address, "--config", str(config_file)]
                   + (["--resume"] if resume else []) + ([] if live else ["--plain"])
                   + (["--colocated-actors", str(colocated)] if colocated else []))
    os.environ[PARENT_ENV] = str(os.getpid())

    def start_learner(count: int, command: list[str]) -> tuple[subprocess.Popen, list[subprocess.Popen]]:
        """Rank 0 and the learner's other ranks (none for one)."""
        envs = ranks_environments(run_dir, count)
        return (subprocess.Popen(command, env={**os.environ, **learner_env, **envs[0]}, preexec_fn=_die_with_parent),
                [subprocess.Popen(command, env={**os.environ, **learner_env, **env}, preexec_fn=_die_with_parent,
                                  stdout=subprocess.DEVNULL if live else None) for env in envs[1:]])

    learner, ranks = start_learner(learner_ranks, learner_cmd)
    ranks_started, rank_crashes = time.monotonic(), 0
    actor_procs: dict[int, subprocess.Popen] = {}
    started_at: dict[int, float] = {}
    quick_crashes: dict[int, int] = {}
    restart_at: dict[int, float] = {}  # actors waiting out their restart delay
    given_up: set[int] = set()
    restarts = 0
    logs = run_dir / "logs"
    if live:
        logs.mkdir(exist_ok=True)

    # The learner's update is the pipeline's critical path: actors take the cores it leaves.
    niceness = config.actor_niceness

    def actor_preexec() -> None:
        _die_with_parent()
        if niceness and hasattr(os, "nice"):
            os.nice(niceness)

    def start_actor(index: int) -> None:
        command = [*python, "actor", "--connect", address, "--name", f"actor-{index}"]
        env = {**os.environ, **actor_envs[index]}
        if live:  # keep the terminal to the learner's view; lines from a restarted actor are appended
            with open(logs / f"actor-{index}.log", "a") as log:
                actor_procs[index] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                      preexec_fn=actor_preexec)
        else:
            actor_procs[index] = subprocess.Popen(command, env=env, preexec_fn=actor_preexec)
        started_at[index] = time.monotonic()

    def say(note: str) -> None:
        if live:  # the terminal belongs to the learner's view (which counts lost actors)
            with open(logs / "run.log", "a") as log:
                print(note, file=log)
        else:
            print(note, flush=True)

    def stopped(number, frame):
        raise _Stopped(f"signal {number}")

    previous = {sig: signal.signal(sig, stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for index in range(actors):
        start_actor(index)
    interrupted = all_failed = rank_lost = False
    try:
        while True:
            now = time.monotonic()
            lost = [(i, p.returncode) for i, p in enumerate(ranks, 1) if p.poll() is not None and p.returncode != 0]
            if learner.poll() is not None:  # rank 0 ended: a finished run, a crash, or a peer lost in its collective
                if learner.returncode != EXIT_RANK_LOST:
                    break
                lost = lost or [(0, EXIT_RANK_LOST)]
            if lost:  # the others wait on it in their next collective: restart the ranks from the last checkpoint
                rank_crashes = rank_crashes + 1 if now - ranks_started < STABLE_S else 1
                count = len(ranks) + (rank_crashes < MAX_QUICK_CRASHES)  # one that keeps failing is left out
                rank_crashes = rank_crashes if count > len(ranks) else 0
                learner.send_signal(signal.SIGUSR1)  # checkpoint between updates; the actors stay
                _stop([learner], grace=10, ask_after=10)  # killed when it waits inside a collective
                _stop(ranks, grace=5)
                checkpoint = latest_checkpoint(run_dir)
                if checkpoint is None:
                    say(f"[run] learner rank {lost[0][0]} exited with {lost[0][1]} before the first checkpoint: "
                        "stopping the run")
                    rank_lost = True
                    for process in actor_procs.values():
                        process.send_signal(signal.SIGTERM)
                    break
                fewer = (f" (a rank failed {MAX_QUICK_CRASHES} times within {STABLE_S:.0f} s of a start: one rank "
                         "fewer)") if count <= len(ranks) else ""
                say(f"[run] learner rank {lost[0][0]} exited with {lost[0][1]}: the learner goes on from "
                    f"{checkpoint.name} with {count} rank{'s' * (count > 1)}{fewer}")
                learner, ranks = start_learner(count, [*learner_cmd, *(["--resume"] if not resume else [])])
                ranks_started = time.monotonic()
                continue
            for index, process in list(actor_procs.items()):
                # Exit status 0 is an actor leaving on the learner's shutdown: not a crash.
                if index in given_up or index in restart_at or process.poll() is None or process.returncode == 0:
                    continue
                if process.returncode in NOT_RESTARTED:  # restarting cannot help: the agent's code is at fault
                    given_up.add(index)
                    say(f"[run] actor-{index} stopped: {NOT_RESTARTED[process.returncode]} (exit status "
                        f"{process.returncode}; its message is above{' and in ' + str(logs / f'actor-{index}.log') if live else ''}); "
                        "not restarting it")
                    continue
                quick = now - started_at[index] < STABLE_S
                quick_crashes[index] = quick_crashes.get(index, 0) + 1 if quick else 1
                if quick_crashes[index] >= MAX_QUICK_CRASHES:
                    given_up.add(index)
                    say(f"[run] actor-{index} exited with {process.returncode} {quick_crashes[index]} times in a row, "
                        f"each within {STABLE_S:.0f} s of starting; not restarting it (see its output above"
                        f"{' or ' + str(logs / f'actor-{index}.log') if live else ''}); the run goes on without it")
                    continue
                delay = min(RESTART_DELAY_MAX_S, RESTART_DELAY_S * 2 ** (quick_crashes[index] - 1))
                restart_at[index] = now + delay
                say(f"[run] actor-{index} exited with {process.returncode}; restarting it in {delay:.1f} s")
            if actors and len(given_up) == actors:
                say("[run] every actor has given up: nothing can produce groups; stopping the learner")
                all_failed = True
                learner.send_signal(signal.SIGTERM)
                break
            for index, when in list(restart_at.items()):
                if now >= when:
                    del restart_at[index]
                    restarts += 1
                    start_actor(index)
            time.sleep(0.2)
    except (KeyboardInterrupt, _Stopped) as reason:
        interrupted = True
        say(f"[run] stopping ({reason or 'interrupted'}): the learner checkpoints, the actors end their batches")
        # Both at once: an actor stopped mid-batch leaves at its next turn and tells the learner, which
        # then does not wait for it (on a terminal, Ctrl-C has reached every process already).
        for process in [learner, *actor_procs.values()]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            _stop([learner], grace=60)  # a checkpoint of a large model takes a while
            _stop(ranks, grace=10, ask_after=5)  # they leave on rank 0's last word, or wait in a collective
            # actors leave by themselves on the learner's shutdown message, at their next turn (an agent's batch
            # on loaded cores can take tens of seconds); the rest are told to
            _stop(list(actor_procs.values()), grace=ACTOR_GRACE_S, ask_after=ACTOR_LEAVE_S)
        finally:
            config_file.unlink(missing_ok=True)
    code = learner.returncode
    actor_codes = [actor_procs[index].returncode for index in sorted(actor_procs)]
    print(f"[run] learner exited with {code}"
          + (f" (its other ranks with {[p.returncode for p in ranks]})" if ranks else "")
          + f"; actors exited with {actor_codes}; {restarts} actor restarts", flush=True)
    if all_failed or rank_lost:
        return 1
    return 130 if interrupted and code == 0 else code


def ranks_environments(run_dir, ranks: int) -> list[dict[str, str]]:
    """Each learner rank's environment, as `mlx.launch` gives it (MLX_RANK, and MLX_HOSTFILE: a ring hostfile of
    free loopback ports, written in the run directory); one empty environment for a single learner."""
    if ranks < 2:
        return [{}]
    hostfile = run_dir / "learner-ranks.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(ranks)]))
    return [{"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)} for rank in range(ranks)]


def _stop(processes: list[subprocess.Popen], grace: float, ask_after: float = 0.0) -> None:
    """Wait `ask_after` for the processes to end by themselves, then SIGTERM the rest together and give them
    `grace` seconds before killing them."""
    deadline = time.monotonic() + ask_after
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.1)
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.1)
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()
