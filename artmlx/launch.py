"""`artmlx run`: the learner and N actor processes on one machine, supervised.

The learner binds a free loopback port; actors connect to it. An actor that dies is restarted (and
logged); when the learner exits, actors are told to stop (SIGTERM) and are killed if they linger;
Ctrl-C stops the learner first (it checkpoints) and then the actors. No process is left behind,
and the exit status is the learner's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from .config import TrainConfig, config_to_toml


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def default_actor_count() -> int:
    """One actor per two cores beyond the learner's, at least one."""
    return max(1, ((os.cpu_count() or 2) - 1) // 2)


def run_pipeline(config: TrainConfig, actors: int, resume: bool = False) -> int:
    run_dir = config.resolved_out()
    config.out = str(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file = run_dir / "launch-config.toml"
    config_file.write_text(config_to_toml(config))
    address = f"tcp://127.0.0.1:{free_port()}"
    python = [sys.executable, "-m", "artmlx"]
    learner_cmd = [*python, "learner", "--bind", address, "--config", str(config_file)] + (["--resume"] if resume else [])
    learner = subprocess.Popen(learner_cmd)
    actor_procs: dict[int, subprocess.Popen] = {}
    restarts = 0

    def start_actor(index: int) -> None:
        actor_procs[index] = subprocess.Popen([*python, "actor", "--connect", address, "--name", f"actor-{index}"])

    for index in range(actors):
        start_actor(index)
    interrupted = False
    try:
        while learner.poll() is None:
            for index, process in list(actor_procs.items()):
                if process.poll() is not None:
                    restarts += 1
                    print(f"[run] actor-{index} exited with {process.returncode}; restarting it "
                          f"({restarts} restarts)", flush=True)
                    start_actor(index)
            time.sleep(0.5)
    except KeyboardInterrupt:
        interrupted = True
        learner.send_signal(signal.SIGTERM)
    finally:
        _stop(learner, grace=60)
        deadline = time.monotonic() + 5  # actors leave by themselves on the learner's shutdown message
        while time.monotonic() < deadline and any(p.poll() is None for p in actor_procs.values()):
            time.sleep(0.1)
        for process in actor_procs.values():
            _stop(process, grace=10)
        config_file.unlink(missing_ok=True)
    code = learner.returncode
    print(f"[run] learner exited with {code}; actors stopped; {restarts} actor restarts", flush=True)
    return 130 if interrupted and code == 0 else code


def _stop(process: subprocess.Popen, grace: float) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
