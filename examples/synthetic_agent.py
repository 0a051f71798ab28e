"""The `synthetic` environment written as an ART-style agent: the benchmark workload for agent rollouts.

Same task as `--env synthetic` (a prompt of random three-letter words, `turns` replies, the
environment's answer of `user_tokens` words between them, a hashed reward per reply), but played the
way agents are written: the code calls the chat API, appends each reply to its messages as text and
sends the conversation again. On `artmlx model synth` tokenizers a word is one token, so the
lengths are exact. Settings come from the environment variables below (defaults: the issue's
workload: 256-word prompt, 4 replies, 32-word answers).

    artmlx run --model MODEL --rollout examples/synthetic_agent.py:rollout --set max_reply_tokens=64
"""

from __future__ import annotations

import os

from artmlx.envs.synthetic import Synthetic

try:  # ART's own Trajectory when openpipe-art is installed; the same fields otherwise
    from art import Trajectory
except ImportError:
    from artmlx.rollout.agents import Trajectory

PROMPT_TOKENS = int(os.environ.get("SYNTHETIC_PROMPT_TOKENS", "256"))
TURNS = int(os.environ.get("SYNTHETIC_TURNS", "4"))
USER_TOKENS = int(os.environ.get("SYNTHETIC_USER_TOKENS", "32"))
MAX_TOKENS = int(os.environ.get("SYNTHETIC_MAX_TOKENS", "64"))


async def rollout(client, scenario, model: str = "policy") -> Trajectory:
    env = Synthetic(PROMPT_TOKENS, TURNS, USER_TOKENS)
    trajectory = Trajectory(messages_and_choices=list(env.reset(scenario["seed"])))
    total = 0.0
    while True:
        response = await client.chat.completions.create(model=model, messages=trajectory.messages(),
                                                        max_tokens=MAX_TOKENS, temperature=1.0)
        choice = response.choices[0]
        trajectory.messages_and_choices.append(choice)
        result = env.step(choice.message.content or "")
        total += result.reward
        if result.done:
            break
        trajectory.messages_and_choices += result.messages
    trajectory.reward = total
    trajectory.metrics["score"] = result.info["score"]
    return trajectory
