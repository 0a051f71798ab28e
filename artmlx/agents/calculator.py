"""The `calculator` task as an ART-style agent: the model calls the calculator through the chat API.

    artmlx run --model smollm2-135m-instruct --rollout artmlx.agents.calculator:rollout \\
        --eval-scenarios artmlx.agents.calculator:EVAL_SCENARIOS --set max_reply_tokens=48

Each scenario is `{"seed": N}` (the default scenarios of an agent run), optionally with `"task"`
(`multiply` or `add`), `"shots"` (worked episodes shown first, as the environment's `shots`) and
`"hints": true` (the trajectory gets the environment's directive hint).
The request passes the tool in OpenAI's `tools`: a model whose chat template calls tools (Qwen's)
gets it rendered there, and the server returns its calls as `tool_calls`; a model whose template has
none (SmolLM2's) reads the description in the system message and writes the call as text, which the
agent parses itself. Either way the calculator's answer goes back as a `tool`
message and the rewards are the environment's (`envs/calculator.py`), so `--env calculator` and this
agent train the same task.
"""

from __future__ import annotations

import json

from ..envs.calculator import TOOL, Calculator
from ..hints import set_directive_hint
from ..seeds import EVAL_SEED_BASE

try:  # ART's own Trajectory when openpipe-art is installed; the same fields otherwise
    from art import Trajectory
except ImportError:
    from ..rollout.agents import Trajectory

MAX_TURNS = 4
MAX_TOKENS = 48
EVAL_SCENARIOS = [{"seed": EVAL_SEED_BASE + i} for i in range(200)]
"""Held-out scenarios (seeds training never draws)."""


async def rollout(client, scenario, model: str = "policy") -> Trajectory:
    env = Calculator(task=scenario.get("task", "multiply"), hints=bool(scenario.get("hints", False)),
                     shots=scenario.get("shots", 0))
    trajectory = Trajectory(messages_and_choices=list(env.reset(int(scenario["seed"]))), tools=[TOOL])
    result = None
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model=model, messages=trajectory.messages(), tools=[TOOL],
                                                        max_tokens=MAX_TOKENS, temperature=1.0)
        choice = response.choices[0]
        trajectory.messages_and_choices.append(choice)
        calls = choice.message.tool_calls or []
        if calls:  # parsed by the server: the same call, as the environment reads it from text
            function = calls[0].function
            arguments = function.arguments if isinstance(function.arguments, str) else json.dumps(function.arguments)
            text = f'<tool_call>\n{{"name": {json.dumps(function.name)}, "arguments": {arguments}}}\n</tool_call>'
        else:
            text = choice.message.content or ""
        result = env.step(text)
        if result.done:
            break
        answer = {"role": "tool", "content": result.messages[0]["content"]}
        trajectory.messages_and_choices.append({**answer, "tool_call_id": calls[0].id} if calls else answer)
    info = result.info if result is not None else {}
    trajectory.reward = float(result.reward) if result is not None and result.done else 0.0
    trajectory.metrics.update(score=float(info.get("score", 0.0)), tool_calls=float(info.get("tool_calls", 0)),
                              tool_errors=float(info.get("tool_errors", 0)))
    if scenario.get("hints"):  # a directive hint (`learner/distill.py`): the failed call's error, the call, the answer
        set_directive_hint(trajectory, env.hint())
    return trajectory
