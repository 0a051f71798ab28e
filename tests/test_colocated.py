"""Colocated actors (`artmlx run --placement colocated`): actor threads in the learner's process over its base."""

import json
import signal
import threading
import time

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from artmlx.apps.colocated import role_budgets
from artmlx.apps.launch import choose_placement
from artmlx.envs.base import make_env
from artmlx.learner.settings import trainer_settings
from artmlx.learner.trainer import GRPOTrainer
from artmlx.metrics import read_metrics
from artmlx.model.policy import (LoraSpec, adapter_weights, evaluate_all, load_policy, set_adapter_weights,
                                 share_base)
from artmlx.netutil import free_port
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from tests.test_pipeline import SMALL, alive, artmlx_process, assert_resumed, children_of, train_rows


def test_share_base_holds_the_weights_once_and_keeps_adapters_apart():
    model, _, _ = load_policy("tiny", LoraSpec(rank=8))
    mx.eval(model.parameters())
    before = mx.get_active_memory()
    twin = share_base(model)
    mx.eval(twin.parameters())
    assert mx.get_active_memory() == before  # nothing copied
    ours, theirs = dict(tree_flatten(model.parameters())), dict(tree_flatten(twin.parameters()))
    assert ours.keys() == theirs.keys() and all(ours[name] is theirs[name] for name in ours)
    tokens = mx.array([[1, 2, 3, 4]])
    assert mx.array_equal(model(tokens), twin(tokens))
    set_adapter_weights(twin, {name: value + 0.05 for name, value in adapter_weights(twin).items()})
    assert all(ours[name] is value for name, value in tree_flatten(model.parameters()))  # the learner's untouched
    assert not mx.allclose(model(tokens), twin(tokens))
    model.train()
    assert not twin.training  # modes are each tree's own


def test_role_budgets_count_the_weights_once_and_split_the_rest():
    learner, actor = role_budgets(10_000, 2_000, 2)
    assert (learner, actor) == (2_000 + 4_000, 2_000 + 2_000)
    assert role_budgets(1_000, 2_000, 1) == (2_000, 2_000)  # no room left: each plan sees only the weights


def test_placement_is_chosen_from_the_devices_and_refuses_what_colocated_cannot_do(monkeypatch):
    assert choose_placement("colocated", [], "", "") == ("colocated", "asked for")
    assert choose_placement("processes", [], "", "")[0] == "processes"
    with pytest.raises(ValueError, match="--actor-devices"):
        choose_placement("colocated", ["1"], "", "")
    with pytest.raises(ValueError, match="--rollout"):
        choose_placement("colocated", [], "", "agent.py:rollout")
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.cpu, 0))
    assert "CPU" in choose_placement("auto", [], "", "")[1]
    assert "devices were given" in choose_placement("auto", ["cpu"], "", "")[1]
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu, 0))
    monkeypatch.setattr(mx, "device_count", lambda kind: 4)
    assert choose_placement("auto", [], "", "") == ("processes", "4 GPUs: put actors on the others with --actor-devices")
    monkeypatch.setattr(mx, "device_count", lambda kind: 1)
    placement, why = choose_placement("auto", [], "", "")
    # processes measured as fast or faster than colocated on one H200 (benchmarks/RESULTS.md); the reason says so
    assert placement == "processes" and "measured" in why and "--placement colocated" in why


def test_colocated_actors_with_keys_need_an_actor_pair(tmp_path):
    from artmlx.apps.colocated import ColocatedActors
    from artmlx.protocol.security import make_keys

    model, tokenizer, _ = load_policy("tiny", LoraSpec(rank=8))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="artmlx keygen"):
        ColocatedActors(model, tokenizer, 1 << 30, 1, keys=tmp_path / "empty")
    make_keys(tmp_path / "keys")
    assert ColocatedActors(model, tokenizer, 1 << 30, 1, keys=tmp_path / "keys").keys == tmp_path / "keys"
    (tmp_path / "keys" / "allowed" / "actor.key").unlink()  # revoked: its handshake would go unanswered
    with pytest.raises(ValueError, match="not in"):
        ColocatedActors(model, tokenizer, 1 << 30, 1, keys=tmp_path / "keys")


def _play(rollouts, seeds, out):
    """On a thread with its own stream, as a colocated actor plays (a failure there fails the test)."""
    try:
        with mx.stream(mx.new_thread_local_stream(mx.default_device())):
            out.extend(rollouts.play(seeds, 4, mx.random.key(seeds[0])))
    except Exception as error:
        out.append(error)
    mx.clear_streams()


def test_a_twin_samples_with_its_own_version_and_the_learner_recomputes_its_logprobs_at_lag_0_and_1():
    mx.random.seed(0)
    model, tokenizer, _ = load_policy("tiny", LoraSpec(rank=8))
    settings = trainer_settings({"learning_rate": 1e-2, "groups_per_step": 4, "group_size": 4})
    trainer = GRPOTrainer(model, settings)
    evaluate_all(model)  # as ColocatedActors does on the learner's thread
    twin = share_base(model)
    sampling = SamplingParams(temperature=1.0, max_reply_tokens=16, max_turns=5, max_episode_tokens=512)
    rollouts = EpisodeRollouts(twin, tokenizer, lambda: make_env("tictactoe", {}), sampling)

    def sample(seed):
        groups = []
        thread = threading.Thread(target=_play, args=(rollouts, [seed + i for i in range(4)], groups))
        thread.start()
        thread.join()
        assert len(groups) == 4 and not isinstance(groups[0], Exception), groups
        return groups

    v0 = {name: np.array(value) for name, value in adapter_weights(model).items()}
    lag0 = sample(1)
    learner, sampler = trainer.recompute(lag0)
    np.testing.assert_array_equal(learner, sampler)  # lag 0: exact on the CPU
    stats = trainer.train_step(lag0)  # the learner moves to v1; the twin still holds v0
    assert max(np.abs(np.array(value) - v0[name]).max() for name, value in adapter_weights(model).items()) > 0, stats
    lag1 = sample(3)
    learner, sampler = trainer.recompute(lag1)
    assert np.abs(learner - sampler).max() > 1e-4  # the learner's v1 is not what sampled them
    v1 = {name: np.array(value) for name, value in adapter_weights(model).items()}
    set_adapter_weights(model, {name: mx.array(value) for name, value in v0.items()})
    learner_v0, _ = trainer.recompute(lag1)
    np.testing.assert_array_equal(learner_v0, sampler)  # they are v0's logprobs exactly
    set_adapter_weights(model, {name: mx.array(value) for name, value in v1.items()})
    set_adapter_weights(twin, adapter_weights(model))  # the broadcast of v1 reaches the twin
    fresh = sample(5)
    learner, sampler = trainer.recompute(fresh)
    np.testing.assert_array_equal(learner, sampler)


def _wait_for(condition, what, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not seen within {timeout} s: {what}")


def _rows(run):
    return train_rows(run) if (run / "metrics.jsonl").exists() else []


@pytest.mark.slow
def test_colocated_run_trains_in_one_process_and_balances_the_ledger(tmp_path):
    run = tmp_path / "run"
    launcher = artmlx_process("run", "--placement", "colocated", "--out", str(run), "--steps", "3",
                              "--set", "eval_every=3", *SMALL)
    deadline, children = time.monotonic() + 60, []
    while time.monotonic() < deadline and not children:
        children = children_of(launcher.pid)
        time.sleep(0.2)
    time.sleep(2)
    children = children_of(launcher.pid) or children
    output, _ = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, output
    assert "[run] placement: colocated" in output
    assert len(children) == 1  # the learner alone: its actor is a thread of it
    assert not [pid for pid in children if alive(pid)]
    rows = train_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["staleness_max"] <= 2 for r in rows)
    final = read_metrics(run)[-1]
    assert final["groups_trained"] == 12 and final["groups_unaccounted"] == 0 and final["actors_unconfirmed"] == 0
    assert final["groups_sent"] == final["groups_received"] >= 12, final
    assert "[actor-0] connected" in output and "memory budget" in output


@pytest.mark.slow
def test_a_remote_actor_joins_a_colocated_learner_killed_and_resumed(tmp_path):
    run = tmp_path / "run"
    address = f"tcp://127.0.0.1:{free_port()}"
    learner = artmlx_process("learner", "--bind", address, "--colocated-actors", "1", "--out", str(run),
                             "--steps", "8", "--set", "eval_every=0", *SMALL)
    remote = artmlx_process("actor", "--connect", address, "--name", "remote")
    try:
        # the thread and the remote process both serve it, then it has a checkpoint to resume from
        _wait_for(lambda: any(r["actors"] == 2 for r in _rows(run)) and len(_rows(run)) >= 3,
                  "3 updates, one of them with 2 actors")
        learner.send_signal(signal.SIGKILL)  # with its actor thread: no goodbye, no final checkpoint
        learner.communicate(timeout=30)
        checkpoint = json.loads(sorted((run / "checkpoints").glob("step_*"))[-1].joinpath("trainer_state.json").read_text())
        resumed = artmlx_process("learner", "--bind", address, "--colocated-actors", "1", "--out", str(run),
                                 "--steps", "8", "--resume")
        output, _ = resumed.communicate(timeout=600)
        assert resumed.returncode == 0, output
        remote_output, _ = remote.communicate(timeout=60)
        assert remote.returncode == 0 and "training finished" in remote_output, remote_output
    finally:
        for process in (learner, remote):
            if process.poll() is None:
                process.kill()
    final = assert_resumed(run, checkpoint, 8)
    assert len(final["actors_peak_memory_gb"]) == 2 and final["actors_unconfirmed"] == 0
    assert all(r["staleness_max"] <= 2 for r in train_rows(run))
    # exact across the restart: this process's groups, and the run's over both processes
    assert final["groups_unaccounted"] == 0 and final["groups_in_flight"] == 0, final
    assert final["run_groups_trained"] == 4 * 8 and final["run_learner_starts"] == 2, final


@pytest.mark.slow
def test_a_learner_whose_colocated_actors_all_give_up_stops_with_the_reason(tmp_path):
    run = tmp_path / "run"
    learner = artmlx_process("learner", "--bind", f"tcp://127.0.0.1:{free_port()}", "--colocated-actors", "1",
                             "--out", str(run), "--steps", "3", "--set", "eval_every=0",
                             "--env", "tests.crashing_env:CrashingEnv", *SMALL)
    output, _ = learner.communicate(timeout=600)
    assert learner.returncode == 1, output
    assert "every colocated actor failed and was given up" in output
    # each failure counted; the repeated one's traceback said once, not five times
    assert output.count("actor-0 failed: ") + output.count("actor-0 failed again") == 5
    assert "failed again (5 times so far)" in output
    assert output.count("Traceback") == 1 and "not restarting it" in output
    assert read_metrics(run)[-1]["stop_reason"].startswith("every colocated actor failed")


@pytest.mark.slow
def test_colocated_actors_connect_to_a_learner_with_curve_keys(tmp_path):
    from artmlx.protocol.security import make_keys

    make_keys(tmp_path / "keys")
    run = tmp_path / "run"
    learner = artmlx_process("learner", "--bind", f"tcp://127.0.0.1:{free_port()}", "--keys", str(tmp_path / "keys"),
                             "--colocated-actors", "1", "--out", str(run), "--steps", "1", "--set", "eval_every=0", *SMALL)
    output, _ = learner.communicate(timeout=300)
    assert learner.returncode == 0, output
    final = read_metrics(run)[-1]
    assert final["groups_trained"] == 4 and final["groups_unaccounted"] == 0 and final["actors_unconfirmed"] == 0
