"""Agent rollouts (`--set rollout=...`): user code against the in-process server, groups for the learner."""

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from artmlx.rollout.agents import AgentRollouts, load_rollout, load_scenarios
from artmlx.serve.model_server import ModelServer, ServeConfig

EXAMPLE = "examples/tictactoe_rollout.py:rollout"


async def flaky(client, scenario):
    """Fails on the scenarios the test marks, otherwise plays tic-tac-toe."""
    if scenario.get("fail"):
        raise RuntimeError("the agent's tool crashed")
    return await load_rollout(EXAMPLE)(client, scenario)


@pytest.fixture(scope="module")
def server():
    server = ModelServer(ServeConfig(model="tiny", name="policy", max_rows=32, max_prompt_tokens=1024, max_tokens=64))
    yield server
    server.close()


def test_groups_of_concurrent_agent_rollouts_are_token_exact_and_failures_drop_only_their_group(server):
    scenarios = [{"seed": 1}, {"seed": 2, "fail": True}, {"seed": 3}]
    rollouts = AgentRollouts(server, flaky, scenarios, temperature=1.0)
    forwards = server.scheduler.decode_forwards
    groups = rollouts.play([0, 1, 2], group_size=4, policy_version=0)
    assert [g.seed for g in groups] == [0, 2] and all(len(g.episodes) == 4 for g in groups)
    assert rollouts.failures == ["scenario 1: RuntimeError: the agent's tool crashed"]
    episodes = [e for g in groups for e in g.episodes]
    assert all(e.reward in (1.0, 0.5, 0.0, -0.5) and e.policy_tokens > 0 for e in episodes)
    # every episode starts with the game's first prompt, exactly as the server built it
    first = server.prompt_ids([{"role": "user", "content": "Play X: reply with an empty cell.\n" +
                                " ".join(f"{i}." for i in range(1, 10))}])
    assert all(e.tokens[: len(first)] == first and not any(e.policy_mask[: len(first)]) for e in episodes)
    # the 12 rollouts ran concurrently: far fewer forwards than sampled tokens
    tokens = sum(e.policy_tokens for e in episodes)
    assert server.scheduler.decode_forwards - forwards < tokens / 3

    # A new adapter swaps in; the next groups are sampled with it and say so.
    weights = dict(tree_flatten(server.model.trainable_parameters()))
    rollouts.set_adapter(lambda: {k: mx.random.normal(v.shape) * 0.01 for k, v in weights.items()}, 1)
    again = rollouts.play([0], group_size=2, policy_version=1)
    assert again[0].policy_version == 1
    rollouts.loop.run_until_complete(rollouts.client.close())


def test_rollout_and_scenario_specs_are_checked(tmp_path):
    with pytest.raises(ValueError, match="must be module:name"):
        load_rollout("no_colon")
    with pytest.raises(ValueError, match="has no 'nope'"):
        load_rollout("examples/tictactoe_rollout.py:nope")
    with pytest.raises(ValueError, match="must be an async function"):
        load_rollout("examples/tictactoe_rollout.py:parse_move")
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"seed": 5}) + "\n\n" + json.dumps({"seed": 6}) + "\n")
    assert load_scenarios(str(path)) == [{"seed": 5}, {"seed": 6}]
    path.write_text("{oops\n")
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        load_scenarios(str(path))


FAILING_AGENT = '''
import sys
sys.path.insert(0, {root!r})
from examples.tictactoe_rollout import rollout as play

calls = 0

async def rollout(client, scenario):
    global calls
    calls += 1
    if calls % 7 == 0:  # every actor batch (at least 8 rollouts) meets it, whatever the random seeds
        raise ValueError("the agent's own bug")
    return await play(client, scenario)
'''


@pytest.mark.slow
def test_run_with_agent_rollouts_on_two_actors_trains_and_counts_agent_failures(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from artmlx.metrics import read_metrics

    agent = tmp_path / "agent.py"
    agent.write_text(FAILING_AGENT.format(root=str(Path(__file__).resolve().parents[2])))
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "artmlx", "run", "--actors", "2", "--plain", "--out", str(run), "--steps", "3",
         "--rollout", f"{agent}:rollout", "--set", "eval_every=0", "--set", "groups_per_step=4",
         "--set", "group_size=4", "--set", "actor_groups_per_batch=2"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [r for r in read_metrics(run) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["groups"] == 4 for r in rows)
    final = read_metrics(run)[-1]
    assert final["groups_unaccounted"] == 0 and final["groups_rejected"] == 0
    # the agent's code raises in every batch: that group is dropped, the actor goes on
    assert "group dropped: scenario" in result.stdout and "the agent's own bug" in result.stdout
    assert "rollout " in result.stdout and "0 actor restarts" in result.stdout  # no actor crashed
