"""The pipeline with real processes: `artmlx run`, actor crashes, learner crash and resume."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from artmlx.netutil import free_port
from artmlx.metrics import read_metrics

SMALL = ["--set", "groups_per_step=4", "--set", "group_size=4", "--set", "actor_groups_per_batch=2",
         "--set", "eval_episodes=20", "--set", "checkpoint_every=1"]


def artmlx_process(*args, **kwargs):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "artmlx", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def learner_and_actors(run, steps, names):
    """A learner process on a free loopback port (small updates, no evaluation) and named actor processes."""
    address = f"tcp://127.0.0.1:{free_port()}"
    learner = artmlx_process("learner", "--bind", address, "--out", str(run), "--steps", str(steps),
                             "--set", "eval_every=0", "--set", "max_episode_tokens=512", *SMALL)
    return address, learner, [artmlx_process("actor", "--connect", address, "--name", name) for name in names]


def children_of(pid):
    try:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    except FileNotFoundError:
        pytest.skip("ps is not available")
    return [int(p) for p in out.split()]


def role_of(pid):
    """`artmlx ROLE`'s role from a child's command line ("" before it has exec'd or after it ended)."""
    try:
        words = open(f"/proc/{pid}/cmdline").read().split("\0")
    except OSError:
        return ""
    return words[3] if len(words) > 3 else ""


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = open(f"/proc/{pid}/stat").read().split()[2] if os.path.exists(f"/proc/{pid}/stat") else "R"
    return stat != "Z"


def train_rows(run):
    return [r for r in read_metrics(run) if "reward_mean" in r]


@pytest.mark.slow
def test_run_trains_and_leaves_no_processes(tmp_path):
    run = tmp_path / "run"
    launcher = artmlx_process("run", "--actors", "2", "--out", str(run), "--steps", "3", "--set", "eval_every=3",
                              "--actor-devices", "cpu", *SMALL)
    deadline = time.monotonic() + 120  # the launcher starts its three processes once it has imported MLX
    while True:
        children = children_of(launcher.pid)
        roles = {pid: role_of(pid) for pid in children}
        if sorted(roles.values()) == ["actor", "actor", "learner"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    priority = {pid: os.getpriority(os.PRIO_PROCESS, pid) for pid in children}
    environ = {pid: open(f"/proc/{pid}/environ").read().split("\0") for pid in children}
    learner = next(pid for pid, role in roles.items() if role == "learner")
    # Actors yield the cores to the learner (actor_niceness, default 10).
    assert all(priority[pid] == priority[learner] + 10 for pid, role in roles.items() if role == "actor")
    # Placement: both actors on the CPU device (sharing it), the learner alone on the default device.
    for pid, role in roles.items():
        expected = ["ARTMLX_DEVICE=cpu", "ARTMLX_MEMORY_SHARING=2"] if role == "actor" else ["ARTMLX_MEMORY_SHARING=1"]
        assert set(expected) <= set(environ[pid]), (role, [e for e in environ[pid] if e.startswith("ARTMLX")])
    output, _ = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, output
    assert len(children) == 3
    assert not [pid for pid in children if alive(pid)], "orphan processes left behind"
    rows = train_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("staleness_max", "staleness_mean", "groups_received", "groups_trained", "groups_stale",
                "groups_rejected", "groups_duplicate", "actors", "learner_idle_frac", "gen_tokens_per_s",
                "train_tokens_per_s"):
        assert key in rows[-1], key
    assert all(r["staleness_max"] <= 2 for r in rows)
    final = read_metrics(run)[-1]
    assert final.get("final") and final["groups_trained"] == 12
    assert final["actors_unconfirmed"] == 0  # every actor's final counts are in the ledger
    # The ledger: every group the actors sent is trained, stale, rejected, a duplicate or still unacknowledged.
    assert final["groups_sent"] >= 12 and final["groups_unaccounted"] == 0, final
    assert "actor-0" in output and "actor-1" in output
    assert (run / "adapters" / "adapters.safetensors").exists()
    # Memory is reported: the learner's per update, each actor's peak in the final row.
    assert all(r["peak_memory_gb"] > 0 for r in rows)
    assert len(final["actors_peak_memory_gb"]) == 2 and all(p > 0 for p in final["actors_peak_memory_gb"])
    assert "memory budget" in output and "rows per batch" in output


@pytest.mark.slow
def test_killed_actor_is_restarted_and_training_continues(tmp_path):
    run = tmp_path / "run"
    launcher = artmlx_process("run", "--actors", "2", "--out", str(run), "--steps", "6", "--set", "eval_every=0", *SMALL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ((run / "metrics.jsonl").exists() and train_rows(run)):
        time.sleep(0.5)
    actors = [pid for pid in children_of(launcher.pid)
              if open(f"/proc/{pid}/cmdline").read().split("\0")[3] == "actor"]
    os.kill(actors[0], signal.SIGKILL)
    output, _ = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, output
    assert "restarting it" in output
    assert [r["step"] for r in train_rows(run)][-1] == 6


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_learner_stopped_and_resumed_with_running_actors(tmp_path, stop):
    """kill -9: the actor stays across the restart and resends what was unacknowledged. SIGTERM: the learner
    checkpoints and stops its actors, and the resumed learner gets a new one. The ledger is exact either way."""
    run = tmp_path / "run"
    address = f"tcp://127.0.0.1:{free_port()}"
    learner = artmlx_process("learner", "--bind", address, "--out", str(run), "--steps", "8", "--set", "eval_every=0",
                             *SMALL)
    actors = [artmlx_process("actor", "--connect", address, "--name", "steady")]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (run / "metrics.jsonl").exists() or len(train_rows(run)) < 3:
            time.sleep(0.2)
        learner.send_signal(stop)
        learner.communicate(timeout=60)
        if stop == signal.SIGTERM:  # a graceful stop ends the actors too
            first_output, _ = actors[0].communicate(timeout=60)
            assert actors[0].returncode == 0 and "exiting: signal 15" in first_output, first_output
            actors.append(artmlx_process("actor", "--connect", address, "--name", "next"))
        checkpoint = json.loads(sorted((run / "checkpoints").glob("step_*"))[-1].joinpath("trainer_state.json").read_text())
        resumed = artmlx_process("learner", "--bind", address, "--out", str(run), "--steps", "8", "--resume")
        output, _ = resumed.communicate(timeout=600)
        assert resumed.returncode == 0, output
        actor_output, _ = actors[-1].communicate(timeout=60)
        assert actors[-1].returncode == 0, actor_output
    finally:
        for process in (learner, *actors):
            if process.poll() is None:
                process.kill()
    final = assert_resumed(run, checkpoint, 8)
    assert "training finished" in actor_output
    # the whole run's ledger, carried by the checkpoint: every update's groups trained once, over two processes
    assert final["run_groups_trained"] == 4 * 8 and final["run_learner_starts"] == 2, final
    assert final["groups_unaccounted"] == 0 and final["groups_in_flight"] == 0, final


def assert_resumed(run, checkpoint: dict, steps: int) -> dict:
    """A run killed after `checkpoint` and resumed to `steps`: each update once, in order, the versions going on
    from the checkpoint's, and the resumed session's groups (4 an update) trained; returns its final row."""
    rows = train_rows(run)
    done = [r["step"] for r in rows]
    assert done == sorted(done) and done[-1] == steps and len(done) == len(set(done))
    first_resumed = [r for r in rows if r["step"] == checkpoint["step"] + 1][0]
    assert first_resumed["policy_version"] == checkpoint["policy_version"] + 1
    final = read_metrics(run)[-1]
    assert final["final"] and final["groups_trained"] == 4 * (steps - checkpoint["step"])
    return final


def _wait_gone(pids, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.2)
    return [pid for pid in pids if alive(pid)]


def _wait_children(launcher, count, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = children_of(launcher.pid)
        if len(children) >= count:
            return children
        time.sleep(0.2)
    raise AssertionError("children did not start")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_run_stops_everything_on_sigterm_and_sighup(tmp_path, sig):
    run = tmp_path / "run"
    launcher = artmlx_process("run", "--actors", "2", "--out", str(run), "--steps", "500", "--set", "eval_every=0",
                              *SMALL)
    children = _wait_children(launcher, 3)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ((run / "metrics.jsonl").exists() and train_rows(run)):
        time.sleep(0.5)
    launcher.send_signal(sig)
    output, _ = launcher.communicate(timeout=120)
    assert "stopping (signal" in output, output
    assert not _wait_gone(children, 30), "children left behind"
    final = read_metrics(run)[-1]
    assert final["final"] and final["stop_reason"] == "signal 15"  # the learner was asked to stop, not crashed


@pytest.mark.slow
def test_killing_run_outright_takes_its_children_with_it(tmp_path):
    run = tmp_path / "run"
    launcher = artmlx_process("run", "--actors", "2", "--out", str(run), "--steps", "500", "--set", "eval_every=0",
                              *SMALL)
    children = _wait_children(launcher, 3)
    launcher.kill()
    launcher.communicate(timeout=30)
    assert not _wait_gone(children, 60), "orphans survived their supervisor"


@pytest.mark.slow
def test_an_actor_that_keeps_crashing_is_given_up_with_the_reason(tmp_path):
    run = tmp_path / "run"
    launcher = artmlx_process("run", "--actors", "1", "--out", str(run), "--steps", "3", "--set", "eval_every=0",
                              "--env", "tests.crashing_env:CrashingEnv", *SMALL)
    output, _ = launcher.communicate(timeout=600)
    assert "restarting it in 0.5 s" in output and "restarting it in 1.0 s" in output, output
    assert "5 times in a row" in output and "not restarting it" in output, output
    assert "every actor has given up" in output and launcher.returncode == 1
    assert read_metrics(run)[-1]["stop_reason"] == "signal 15"


@pytest.mark.slow
def test_a_crashing_learner_says_so_in_its_final_row(tmp_path):
    run = tmp_path / "run"
    learner = artmlx_process("learner", "--bind", f"tcp://127.0.0.1:{free_port()}", "--out", str(run), "--steps", "3",
                             "--env", "tests.crashing_env:CrashingEnv", "--set", "eval_every=1", *SMALL)
    output, _ = learner.communicate(timeout=300)
    assert learner.returncode != 0, output
    final = read_metrics(run)[-1]
    assert final["final"] and final["stop_reason"].startswith("learner crashed: RuntimeError"), final
    assert "always fails in reset()" in final["stop_reason"]


PATIENT_ACTOR = """
import sys
from artmlx.apps.actor import ActorService
service = ActorService(sys.argv[1], "patient")
service.patience_s = 1.0
service.run()
"""


@pytest.mark.slow
def test_a_standalone_actor_waits_out_a_silent_learner(tmp_path):
    """A learner that stops answering (SIGSTOP here; a long evaluation or checkpoint in life) does not kill actors."""
    run = tmp_path / "run"
    address = f"tcp://127.0.0.1:{free_port()}"
    learner = artmlx_process("learner", "--bind", address, "--out", str(run), "--steps", "500", "--set", "eval_every=0",
                             *SMALL)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    actor = subprocess.Popen([sys.executable, "-c", PATIENT_ACTOR, address], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not ((run / "metrics.jsonl").exists() and train_rows(run)):
            time.sleep(0.2)
        learner.send_signal(signal.SIGSTOP)
        time.sleep(8)  # the actor's window fills and stays full: it reports after 1, 3 and 7 s
        assert actor.poll() is None, "the actor gave up on a silent learner"
        learner.send_signal(signal.SIGCONT)
        time.sleep(2)
        learner.send_signal(signal.SIGTERM)
        output, _ = actor.communicate(timeout=120)
        learner.communicate(timeout=120)
    finally:
        for process in (learner, actor):
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
    assert "still waiting" in output and actor.returncode == 0, output
    assert "exiting: signal 15" in output
