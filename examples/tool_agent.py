"""A tool-using agent in ART's form, trained with MLXBackend: tools go through the OpenAI `tools` API.

The agent gets an addition and an `add` tool. The reward is the outcome: 1 if its final answer
(after any tool calls, whose results come back as `tool` messages) contains the right sum, 0.1
for a well-formed tool call that was not followed by the answer, 0 otherwise. Each tool call the
model writes is parsed by the server from Hermes/Qwen-style `<tool_call>` text into
`message.tool_calls`; the trajectory keeps the choices, so training sees the exact tokens.

With a real instruct model (e.g. --base-model mlx-community/Qwen2.5-0.5B-Instruct-4bit) this is an
ordinary tool-use RL run; the embedded tiny model was pretrained only on tic-tac-toe and sums
without tools, so with it the script shows the mechanics (it rarely writes a tool call).

    pip install "artmlx[art]" && python examples/tool_agent.py --steps 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art  # noqa: E402

from artmlx.art import MLXBackend  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


def add(arguments: str) -> str:
    try:
        values = json.loads(arguments)
        return str(int(values["a"]) + int(values["b"]))
    except (ValueError, KeyError, TypeError) as error:
        return f"error: {error}"


async def rollout(model: art.TrainableModel, seed: int, max_turns: int = 3) -> art.Trajectory:
    rng = random.Random(seed)
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": f"{a}+{b}="}], tools=TOOLS)
    client = model.openai_client()
    called = False
    for _ in range(max_turns):
        response = await client.chat.completions.create(model=model.get_inference_name(), tools=TOOLS,
                                                        messages=trajectory.messages(), max_tokens=48)
        choice = response.choices[0]
        trajectory.messages_and_choices.append(choice)
        if choice.finish_reason != "tool_calls":
            break
        called = True
        for call in choice.message.tool_calls:
            result = add(call.function.arguments) if call.function.name == "add" else "error: unknown tool"
            trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": call.id, "content": result})
    answer = choice.message.content or ""
    trajectory.reward = 1.0 if str(a + b) in answer else (0.1 if called else 0.0)
    trajectory.metrics["tool_called"] = float(called)
    return trajectory


async def main(steps: int, base_model: str, path: str) -> None:
    backend = MLXBackend(path=path, config={"lora_rank": 8})
    model = art.TrainableModel(name="tool-agent", project="art-examples", base_model=base_model)
    await model.register(backend)
    for step in range(await model.get_step(), steps):
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(rollout(model, 1000 * step + g) for _ in range(8)) for g in range(4)],
            pbar_desc=None)
        result = await backend.train(model, groups, learning_rate=1e-4)
        trajectories = [t for g in groups for t in g.trajectories]
        print(f"step {result.step}  reward {sum(t.reward for t in trajectories) / len(trajectories):.3f}  "
              f"tool calls {sum(t.metrics['tool_called'] for t in trajectories):.0f}/{len(trajectories)}  "
              f"refused {int(result.metrics['trajectories_refused'])}", flush=True)
    await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--base-model", default="tiny")
    parser.add_argument("--path", default=".art")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.base_model, args.path))
