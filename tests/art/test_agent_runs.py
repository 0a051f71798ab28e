"""`artmlx run --rollout` with real processes, the real openai client and the tiny model: ART's signature
trains and is evaluated on held-out scenarios, failing agent code ends the run with one message, code
that cannot be loaded exits 2, and Ctrl-C stops everything in seconds with a checkpoint to resume."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from artmlx.netutil import free_port
from artmlx.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--set", "groups_per_step=4", "--set", "group_size=4", "--set", "actor_groups_per_batch=2"]

ART_AGENT = '''
import os
import sys

sys.path.insert(0, {root!r})
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import art

from examples.tictactoe_rollout import rollout as play


async def rollout(model: art.Model, scenario) -> art.Trajectory:
    """ART's signature, using what ART's examples use of the model."""
    assert model.trainable and model.name == model.get_inference_name() and await model.get_step() >= 0
    return await play(model.openai_client(), scenario, model=model.get_inference_name())
'''

FAILING_AGENT = '''
async def rollout(client, scenario):
    return await client.openai_client()  # ART's call, but this signature gets the openai client
'''

SOMETIMES_FAILING_AGENT = '''
import sys

sys.path.insert(0, {root!r})
from examples.tictactoe_rollout import rollout as play


async def rollout(client, scenario):
    if scenario["seed"] % 3 == 0:
        raise LookupError(f"no board for scenario {{scenario['seed'] % 3}}")
    return await play(client, scenario)
'''


def artmlx(*args, cwd=None, timeout=600):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "artmlx", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout)


def train_rows(run):
    return [r for r in read_metrics(run) if "reward_mean" in r]


@pytest.mark.slow
def test_an_art_signature_rollout_trains_and_is_evaluated_on_its_eval_scenarios(tmp_path):
    agent = tmp_path / "art_agent.py"
    agent.write_text(ART_AGENT.format(root=str(ROOT)))
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"seed": 10_000 + i}) + "\n" for i in range(6)))
    run = tmp_path / "run"
    result = artmlx("run", "--actors", "2", "--plain", "--out", str(run), "--steps", "3", "--rollout",
                    f"{agent}:rollout", "--eval-scenarios", str(held_out), "--set", "eval_every=3", *SMALL)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert [r["step"] for r in train_rows(run)] == [1, 2, 3]
    evals = [r for r in read_metrics(run) if "eval_score" in r]
    assert [r["step"] for r in evals] == [0, 3]
    for row in evals:  # the agent itself on the 6 held-out scenarios, not the tictactoe env's 200 seeds
        assert row["eval_episodes"] == 6 and row["eval_failed"] == 0 and "eval_illegal_rate" not in row
        assert 0 <= row["eval_metric_win"] <= 1 and -0.5 <= row["eval_reward_mean"] <= 1
    assert "group dropped" not in output and "terminate called" not in output
    assert "actors exited with [0, 0]" in output
    final = next(r for r in read_metrics(run) if r.get("final"))  # the actors' agent counts, summed
    assert final["rollouts_played"] >= final["groups_trained"] * 4 and final["trajectories_refused"] == 0
    assert final["groups_dropped"] == 0 and 0 < final["prefill_tokens"] <= final["prompt_tokens"]


@pytest.mark.slow
def test_train_plays_an_agent_in_one_process_and_evaluates_it_on_held_out_scenarios(tmp_path):
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"seed": 10_000 + i}) + "\n" for i in range(6)))
    run = tmp_path / "run"
    result = artmlx("train", "--out", str(run), "--steps", "2", "--rollout", "examples/tictactoe_rollout.py:rollout",
                    "--eval-scenarios", str(held_out), "--set", "eval_every=2", "--set", "groups_per_step=4",
                    "--set", "group_size=4", cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "agent examples/tictactoe_rollout.py:rollout" in output and "second copy of the base" in output
    updates = train_rows(run)
    assert [r["step"] for r in updates] == [1, 2] and [r["policy_version"] for r in updates] == [1, 2]
    for row in updates:  # groups of 4 tic-tac-toe games (dynamic sampling may bring a few more than 4)
        assert row["groups"] >= 4 and -0.5 <= row["reward_mean"] <= 1 and row["gen_tokens"] > 0
    evals = [r for r in read_metrics(run) if "eval_score" in r]
    assert [r["step"] for r in evals] == [0, 2]
    for row in evals:  # the agent on its 6 held-out scenarios, not the env's 200 seeds
        assert row["eval_episodes"] == 6 and row["eval_failed"] == 0 and 0 <= row["eval_metric_win"] <= 1
    assert (run / "adapters" / "adapters.safetensors").exists() and "terminate called" not in output


@pytest.mark.slow
def test_train_stops_on_an_agent_that_always_fails_with_one_message(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(FAILING_AGENT)
    result = artmlx("train", "--out", str(tmp_path / "run"), "--steps", "2", "--rollout", f"{agent}:rollout",
                    "--set", "eval_every=0", "--set", "rollout_failure_limit=8", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-4000:]
    assert output.count("rollout_failure_limit = 8); stopping.") == 1
    assert "AttributeError: 'AsyncOpenAI' object has no attribute 'openai_client'" in output
    assert "terminate called" not in output


@pytest.mark.slow
def test_train_reports_an_agents_failures_once_with_the_traceback_then_as_counts(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(SOMETIMES_FAILING_AGENT.format(root=str(ROOT)))
    result = artmlx("train", "--out", str(tmp_path / "run"), "--steps", "2", "--rollout", f"{agent}:rollout",
                    "--set", "eval_every=0", "--set", "groups_per_step=4", "--set", "group_size=4", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]  # a third of the groups dropped, the rest train
    assert output.count("group dropped: rollout failed on scenario") == 1, output[-4000:]
    assert output.count("LookupError: no board for scenario 0") >= 1 and 'agent.py", line 10' in output
    assert "rollout failures repeated in this update: LookupError: no board for scenario 0 (x" in output
    assert [r["step"] for r in train_rows(tmp_path / "run")] == [1, 2]


@pytest.mark.slow
def test_an_agent_run_without_eval_scenarios_is_said_to_be_not_evaluated():
    """In-process (this was a whole `artmlx run`: the learner prints the note once at its start and its
    `_evaluate` returns on the same note, so no evaluation row is written)."""
    from artmlx.rollout.evaluation import unevaluated_note

    note = unevaluated_note("examples/tictactoe_rollout.py:rollout", 5, [], "tictactoe")
    assert note.startswith("an agent run is evaluated only on eval_scenarios") and "'tictactoe'" in note
    assert unevaluated_note("agent.py:rollout", 5, [{"seed": 1}], "tictactoe") is None  # it has scenarios
    assert unevaluated_note("agent.py:rollout", 0, [], "tictactoe") is None  # evaluation is off anyway
    assert unevaluated_note("", 5, [], "tictactoe") is None  # an environment run is evaluated on its env


@pytest.mark.slow
def test_a_rollout_that_always_fails_ends_the_run_with_one_message_and_a_short_log(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(FAILING_AGENT)
    run = tmp_path / "run"
    result = artmlx("run", "--actors", "2", "--plain", "--out", str(run), "--steps", "3", "--rollout",
                    f"{agent}:rollout", "--set", "eval_every=0", *SMALL, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    # one message per actor, naming the function, its signature and the first traceback
    assert output.count("rollout_failure_limit = 32); stopping.") == 2, output[-4000:]
    assert "function: rollout(client, scenario), defined at" in output
    assert "AttributeError: 'AsyncOpenAI' object has no attribute 'openai_client'" in output
    assert "every actor has given up" in output and "actors exited with [3, 3]" in output
    assert "terminate called" not in output
    assert len(output.splitlines()) < 120, f"{len(output.splitlines())} lines: the log is not rate-limited"


@pytest.mark.slow
def test_agent_code_that_cannot_be_loaded_exits_2_before_any_work(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text("import a_module_that_is_not_installed\n\nasync def rollout(model, scenario):\n    pass\n")
    run = tmp_path / "run"
    result = artmlx("run", "--plain", "--out", str(run), "--rollout", f"{agent}:rollout", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"Error: rollout '{agent}:rollout': importing '{agent}' failed at {agent}:1: "
        "ModuleNotFoundError: No module named 'a_module_that_is_not_installed'"]
    assert not run.exists()  # nothing started
    agent.write_text("async def rollout(model, scenario):\n    pass\n")
    result = artmlx("learner", "--out", str(run), "--rollout", f"{agent}:nope", timeout=120)
    assert result.returncode == 2 and "has no 'nope'" in result.stderr


@pytest.mark.slow
def test_an_actor_that_cannot_load_the_runs_agent_exits_2_without_aborting(tmp_path):
    """A remote actor without the agent's file (relative to the learner's working directory)."""
    here, elsewhere = tmp_path / "learner", tmp_path / "actor"
    here.mkdir(), elsewhere.mkdir()
    (here / "agent.py").write_text(ART_AGENT.format(root=str(ROOT)))
    address = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    learner = subprocess.Popen([sys.executable, "-m", "artmlx", "learner", "--plain", "--bind", address, "--out",
                                str(tmp_path / "run"), "--rollout", "agent.py:rollout", "--set", "eval_every=0"],
                               cwd=here, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        actor = artmlx("actor", "--connect", address, cwd=elsewhere, timeout=300)
    finally:
        learner.send_signal(signal.SIGTERM)
        learner.communicate(timeout=120)
    assert actor.returncode == 2, actor.stdout + actor.stderr
    assert "rollout 'agent.py:rollout': there is no file agent.py" in actor.stderr
    assert "terminate called" not in actor.stdout + actor.stderr


def _children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and ps --ppid")
@pytest.mark.parametrize("task", [["--rollout", "examples/tictactoe_rollout.py:art_rollout"], ["--env", "tictactoe"]],
                         ids=["agent", "env"])
def test_ctrl_c_stops_every_process_within_seconds_and_the_run_resumes(tmp_path, task):
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # its own session, so that the signal below reaches the group as a terminal's Ctrl-C does
    launcher = subprocess.Popen([sys.executable, "-m", "artmlx", "run", "--actors", "2", "--plain", "--out", str(run),
                                 "--steps", "500", *task, "--set", "eval_every=0", "--set", "checkpoint_every=1",
                                 *SMALL], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(launcher.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not ((run / "metrics.jsonl").exists() and train_rows(run)):
            assert launcher.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.2)
        children = _children(launcher.pid)
        assert len(children) == 3, children
        os.killpg(launcher.pid, signal.SIGINT)
        launcher.wait(timeout=15)  # a generous bound: it takes a few seconds
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(pid) for pid in children):
            time.sleep(0.1)
        assert not [pid for pid in children if _alive(pid)], "processes left behind"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    reader.join(timeout=10)
    output = "".join(lines)
    assert launcher.returncode == 130, output[-3000:]
    assert "terminate called" not in output and "Aborted" not in output
    [summary] = [line for line in output.splitlines() if line.startswith("[run] learner exited with")]
    assert summary.startswith("[run] learner exited with 0; actors exited with [0, 0]"), summary
    final = read_metrics(run)[-1]
    assert final["final"] and final["stop_reason"].startswith("signal") and final["groups_unaccounted"] == 0
    stopped_at = final["step"]
    assert (run / "checkpoints" / f"step_{stopped_at:06d}").is_dir()

    resumed = artmlx("run", "--actors", "1", "--plain", "--out", str(run), "--resume", "--steps", str(stopped_at + 1),
                     cwd=ROOT, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert train_rows(run)[-1]["step"] == stopped_at + 1
