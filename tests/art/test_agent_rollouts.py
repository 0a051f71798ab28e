"""Agent rollouts (`--set rollout=...`): user code against the in-process server, groups for the learner."""

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from artmlx.rollout.evaluation import summarize_trajectories
from artmlx.rollout.agent_code import RolloutLoadError, load_rollout, load_scenarios, takes_model
from artmlx.rollout.agents import AgentRollouts, RolloutsFailing, Trajectory
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
    assert rollouts.failures.counts == {"RuntimeError: the agent's tool crashed": 4}
    [first] = rollouts.failures.firsts()  # reported once, with its traceback; the 3 repeats are counted
    assert first.startswith("rollout failed on scenario 1: RuntimeError") and "Traceback" in first
    assert rollouts.failures.repeats() == ["RuntimeError: the agent's tool crashed (x3 more; 4 in all)"]
    assert rollouts.failures.consecutive == 0  # successes came after
    episodes = [e for g in groups for e in g.episodes]
    assert all(e.reward in (1.0, 0.5, 0.0, -0.5) and e.policy_tokens > 0 for e in episodes)
    # every episode starts with the game's first prompt, exactly as the server built it
    first = server.prompt_ids([{"role": "user", "content": "Play X: reply with an empty cell.\n" +
                                " ".join(f"{i}." for i in range(1, 10))}])
    assert all(e.tokens[: len(first)] == first and not any(e.policy_mask[: len(first)]) for e in episodes)
    # the 12 rollouts ran concurrently: requests shared decode forwards (how many share each one depends on
    # when each agent's next turn arrives, so only that they did is asserted)
    tokens = sum(e.policy_tokens for e in episodes)
    assert server.scheduler.peak_rows >= 2 and server.scheduler.decode_forwards - forwards < tokens

    # A new adapter swaps in; the next groups are sampled with it and say so.
    weights = dict(tree_flatten(server.model.trainable_parameters()))
    rollouts.set_adapter(lambda: {k: mx.random.normal(v.shape) * 0.01 for k, v in weights.items()}, 1)
    again = rollouts.play([0], group_size=2, policy_version=1)
    assert again[0].policy_version == 1
    rollouts.loop.run_until_complete(rollouts.client.close())


def test_a_group_keeps_its_good_trajectories_down_to_min_group_size(server):
    async def sometimes(client, scenario):  # the second and fourth calls of each group fail
        sometimes.calls += 1
        if sometimes.calls % 4 in (2, 0):
            raise RuntimeError("flaky tool")
        return await load_rollout(EXAMPLE)(client, scenario)
    sometimes.calls = 0
    kept = AgentRollouts(server, sometimes, [], temperature=1.0, min_group_size=2).play([0], group_size=4)
    assert [len(g.episodes) for g in kept] == [2]
    sometimes.calls = 0
    assert AgentRollouts(server, sometimes, [], temperature=1.0, min_group_size=3).play([0], group_size=4) == []


def test_rollout_and_scenario_specs_are_checked(tmp_path):
    with pytest.raises(RolloutLoadError, match="must be module:name"):
        load_rollout("no_colon")
    with pytest.raises(RolloutLoadError, match="has no 'nope'"):
        load_rollout("examples/tictactoe_rollout.py:nope")
    with pytest.raises(RolloutLoadError, match="must be an async function"):
        load_rollout("examples/tictactoe_rollout.py:parse_move")
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\nraise RuntimeError('module-level bug')\n")
    with pytest.raises(RolloutLoadError, match=r"importing .* failed at .*broken.py:2: RuntimeError: module-level bug"):
        load_rollout(f"{broken}:rollout")
    broken.write_text("import no_such_module_anywhere\n")
    with pytest.raises(RolloutLoadError, match="ModuleNotFoundError: No module named 'no_such_module_anywhere'"):
        load_rollout(f"{broken}:rollout")
    three = tmp_path / "three.py"
    three.write_text("async def rollout(model, step, is_validation):\n    pass\n")
    with pytest.raises(RolloutLoadError, match=r"its signature is rollout\(model, step, is_validation\)"):
        load_rollout(f"{three}:rollout")
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"seed": 5}) + "\n\n" + json.dumps({"seed": 6}) + "\n")
    assert load_scenarios(str(path)) == [{"seed": 5}, {"seed": 6}]
    path.write_text("{oops\n")
    with pytest.raises(RolloutLoadError, match="line 1 is not JSON"):
        load_scenarios(str(path))
    with pytest.raises(RolloutLoadError, match="no such file"):
        load_scenarios(str(tmp_path / "missing.jsonl"))


def test_the_first_parameter_says_whether_a_rollout_gets_the_model_or_the_client():
    import openai

    async def art_style(model: "art.Model", scenario): ...
    async def named_model(model, scenario): ...
    async def annotated_other(agent: "Model", scenario): ...
    async def client_style(client, scenario): ...
    async def annotated_client(model: openai.AsyncOpenAI, scenario): ...
    async def annotated_text(llm: "AsyncOpenAI | None", scenario): ...
    async def any_client(client: "Any", scenario): ...

    assert [takes_model(f) for f in (art_style, named_model, annotated_other)] == [True] * 3
    assert [takes_model(f) for f in (client_style, annotated_client, annotated_text, any_client)] == [False] * 4


async def art_signature(model: "art.Model", scenario) -> Trajectory:
    """Written as ART's examples are: everything through the model object."""
    assert model.trainable and await model.get_step() >= 0 and model.inference_base_url
    client = model.openai_client()
    messages = [{"role": "user", "content": "1. 2. 3."}]
    first = await client.chat.completions.create(model=model.get_inference_name(), messages=messages, max_tokens=4)
    second = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=4)  # 2048's way
    return Trajectory(messages_and_choices=[*messages, first.choices[0]],
                      reward=float(bool(second.choices[0].message.content)), metrics={"turns": 1})


def test_an_art_signature_rollout_gets_a_model_that_reaches_the_served_policy(server):
    rollouts = AgentRollouts(server, art_signature, [], temperature=1.0)
    assert rollouts.takes_model and rollouts.model.get_inference_name(3) == "policy@3"
    groups = rollouts.play([0, 1], group_size=3)
    assert len(groups) == 2 and all(len(g.episodes) == 3 for g in groups), rollouts.failures.counts
    assert rollouts.failures.total == 0
    row = summarize_trajectories(rollouts.play_once([{}, {}, {}]) + [None])
    assert row["eval_episodes"] == 3 and row["eval_failed"] == 1 and row["eval_metric_turns"] == 1.0
    rollouts.loop.run_until_complete(rollouts.client.close())


async def always_failing(client, scenario):
    return await client.openai_client()  # ART's call on the wrong object: AttributeError every time


def test_a_rollout_that_always_fails_stops_after_the_limit_with_one_clear_message(server):
    rollouts = AgentRollouts(server, always_failing, [], temperature=1.0, failure_limit=8, spec="agent.py:always_failing")
    assert rollouts.play([0], group_size=4) == []  # 4 in a row: not yet
    with pytest.raises(RolloutsFailing) as failing:
        rollouts.play([1], group_size=4)
    message = str(failing.value)
    assert message.startswith("rollout agent.py:always_failing failed 8 times in a row (rollout_failure_limit = 8)")
    assert "always_failing(client, scenario)" in message and "test_agent_rollouts.py" in message
    assert "an openai.AsyncOpenAI client (name the first parameter `model`" in message
    assert "Traceback" in message and "'AsyncOpenAI' object has no attribute 'openai_client'" in message
    assert len(rollouts.failures.firsts()) == 1 and rollouts.failures.total == 8
    rollouts.loop.run_until_complete(rollouts.client.close())


def test_tick_stops_a_batch_of_agents_that_would_run_for_minutes(server):
    import asyncio
    import time

    async def patient(client, scenario):
        await asyncio.sleep(600)

    started = time.monotonic()
    rollouts = AgentRollouts(server, patient, [], temperature=1.0, tick=lambda: time.monotonic() - started > 1,
                             tick_s=0.1)
    assert rollouts.play([0, 1], group_size=2) == [] and rollouts.play_once([{}]) is None
    assert rollouts.failures.total == 0  # cancelled, not failed
    rollouts.loop.run_until_complete(rollouts.client.close())


def test_evaluation_rows_score_by_the_score_metric_else_the_reward():
    trajectories = [Trajectory(reward=1.0, metrics={"score": 0.0, "win": 1}), Trajectory(reward=0.5), None]
    row = summarize_trajectories(trajectories)
    assert row["eval_score"] == 0.25 and row["eval_reward_mean"] == 0.75 and row["eval_episodes"] == 2
    assert row["eval_failed"] == 1 and row["eval_metric_win"] == 1.0 and row["eval_metric_score"] == 0.0


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
    # the agent's code raises in every batch: that group is dropped, the actor goes on; each actor reports
    # the failure once with its traceback, its repeats only as counts
    assert "group dropped: rollout failed on scenario" in result.stdout and "the agent's own bug" in result.stdout
    assert result.stdout.count("group dropped") <= 2 and "Traceback" in result.stdout
    assert "rollout " in result.stdout and "0 actor restarts" in result.stdout  # no actor crashed
    assert "actors exited with [0, 0]" in result.stdout


def test_both_kinds_of_rollouts_implement_the_declared_interface(server):
    """The actor, the learner's evaluation and the benchmarks hold a `Rollouts`: agents and environments alike."""
    from artmlx.envs import make_env
    from artmlx.model.policy import LoraSpec, load_policy
    from artmlx.rollout.base import FailureLog, Rollouts
    from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams

    model, tokenizer, _ = load_policy("tiny", LoraSpec())
    kinds = [AgentRollouts(server, flaky, [{"seed": 1}], temperature=1.0),
             EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())]
    for rollouts in kinds:
        assert isinstance(rollouts, Rollouts) and isinstance(rollouts.failures, FailureLog)
        assert rollouts.max_rows >= 1 and rollouts.groups_per_batch(2) >= 1 and isinstance(rollouts.stats, dict)
    assert not isinstance(object(), Rollouts)


def test_an_actors_agent_server_is_sized_by_its_memory_budget():
    """With a budget, the in-process server runs as many requests as fit it beside a finished turn of each
    in the prefix cache (`MemoryPlan.agent_sizes`); the same plan decides both."""
    from artmlx.config import TrainConfig
    from artmlx.engine.memory import MemoryPlan, ModelShape, device_kind, slots_for
    from artmlx.rollout.agents import agent_rollouts

    config = TrainConfig(rollout=EXAMPLE, max_episode_tokens=512, max_reply_tokens=16)
    rollouts = agent_rollouts(config, 64, seed=0)
    try:
        shape, scheduler = ModelShape.of(rollouts.server.model), rollouts.server.scheduler
        assert scheduler.max_rows == 64 and scheduler.prefix.max_bytes == 1024 << 20  # the server's defaults
        budget = shape.weight_bytes + 20 * (2 * shape.kv_bytes_per_row(slots_for(512, 16)) + 40 * shape.vocab)
    finally:
        rollouts.close()
    rollouts = agent_rollouts(config, 64, seed=0, budget=budget)
    try:
        rows, prefix = MemoryPlan(budget, shape, device_kind()).agent_sizes(slots_for(512, 16), 64)
        assert 1 < rows < 64 and rollouts.server.scheduler.max_rows == rows
        assert rollouts.server.scheduler.prefix.max_bytes == prefix
    finally:
        rollouts.close()


def test_an_agents_directive_hint_becomes_its_episodes_teacher_prompt(server):
    from artmlx.agents.calculator import TOOL, rollout as calculator
    from artmlx.envs.calculator import Calculator
    from artmlx.hints import hinted_messages

    hints = []

    async def hinted(client, scenario):
        trajectory = await calculator(client, {**scenario, "hints": True})
        hints.append((trajectory.metadata["directive_hint"], trajectory.tools))  # ART's Trajectory may reorder keys
        return trajectory

    groups = AgentRollouts(server, hinted, [], temperature=1.0).play([7], group_size=2)
    opening = Calculator().reset(7)
    assert len(hints) == 2 and all("and then answer" in hint for hint, _ in hints)
    for episode in groups[0].episodes:  # the prompt the server built, and the teacher's with the hint in it
        assert episode.tokens[: episode.prompt_length] == server.prompt_ids(opening, [TOOL])
    assert sorted(e.teacher_prompt for e in groups[0].episodes) == \
        sorted(server.chat.prompt_ids(hinted_messages(opening, hint), tools) for hint, tools in hints)

    async def bad(client, scenario):
        trajectory = await load_rollout(EXAMPLE)(client, scenario)
        trajectory.metadata["directive_hint"] = 3
        return trajectory

    failing = AgentRollouts(server, bad, [], temperature=1.0)
    assert failing.play([0], group_size=2) == []
    assert any("directive_hint" in line and "must be a string" in line for line in failing.failures.counts)


def test_the_calculator_agent_shows_its_worked_episodes_before_the_question():
    from artmlx.agents.calculator import TOOL, rollout as calculator
    from artmlx.envs.calculator import Calculator

    server = ModelServer(ServeConfig(model="tiny", name="policy", max_rows=4, max_prompt_tokens=2048, max_tokens=48))
    try:  # the tiny model's tokenizer is byte-level: a worked episode is about 400 tokens
        rollouts = AgentRollouts(server, calculator, [{"seed": 7, "shots": 1}], temperature=1.0)
        groups = rollouts.play([0], group_size=2)
        assert len(groups) == 1, rollouts.failures.counts
        opening = Calculator(shots=1).reset(7)
        assert [m["role"] for m in opening] == ["system", "user", "assistant", "tool", "assistant", "user"]
        for episode in groups[0].episodes:
            assert episode.tokens[: episode.prompt_length] == server.prompt_ids(opening, [TOOL])
    finally:
        server.close()


def test_set_directive_hint_refuses_an_empty_hint():
    from artmlx.hints import set_directive_hint

    trajectory = Trajectory()
    trajectory.set_directive_hint("Use cell 5.")
    assert trajectory.metadata == {"directive_hint": "Use cell 5."}
    with pytest.raises(ValueError, match="non-empty string"):
        set_directive_hint(trajectory, "  ")
