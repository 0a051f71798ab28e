"""The embedded model's tic-tac-toe as an ART-style agent: an async rollout against an OpenAI client.

The game is the `tictactoe` environment's (same board text, same random opponent, same rewards), but
played the way an ART user writes agents: the code calls the chat API and collects the choices in a
trajectory. It runs under artmlx's actors (`--rollout examples/tictactoe_rollout.py:rollout`)
and, through `art_rollout`, under an ART script with `MLXBackend` or any of ART's backends.

    artmlx run --actors 2 --rollout examples/tictactoe_rollout.py:rollout       # rollout(client, scenario)
    artmlx run --actors 2 --rollout examples/tictactoe_rollout.py:art_rollout   # rollout(model, scenario)
"""

from __future__ import annotations

import os
import random

from artmlx.envs.tictactoe import INSTRUCTION, parse_move, place, render, winner

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # art imports litellm, which would fetch prices
try:  # ART's own Trajectory when openpipe-art is installed; the same fields otherwise
    from art import Trajectory
except ImportError:
    from artmlx.rollout.agents import Trajectory

REWARDS = {"win": 1.0, "draw": 0.5, "loss": 0.0, "illegal": -0.5}


async def rollout(client, scenario, model: str = "policy", max_tokens: int = 8) -> Trajectory:
    """Play X against a random O; the reward is the game's outcome."""
    rng = random.Random(scenario["seed"])
    board = "." * 9
    trajectory = Trajectory(messages_and_choices=[{"role": "user", "content": INSTRUCTION + render(board)}])
    outcome = None
    while outcome is None:
        response = await client.chat.completions.create(model=model, messages=trajectory.messages(),
                                                        max_tokens=max_tokens, temperature=1.0)
        choice = response.choices[0]
        trajectory.messages_and_choices.append(choice)
        move = parse_move(choice.message.content or "")
        if move is None or board[move] != ".":
            outcome = "illegal"
            break
        board = place(board, move, "X")
        if winner(board):
            outcome = "win"
        elif "." not in board:
            outcome = "draw"
        else:
            board = place(board, rng.choice([c for c, v in enumerate(board) if v == "."]), "O")
            if winner(board):
                outcome = "loss"
            else:
                trajectory.messages_and_choices.append({"role": "user", "content": render(board)})
    trajectory.reward = REWARDS[outcome]
    trajectory.metrics["win"] = float(outcome == "win")
    trajectory.metrics["score"] = float(outcome in ("win", "draw"))
    trajectory.metadata["outcome"] = outcome
    return trajectory


async def art_rollout(model, scenario) -> Trajectory:
    """The same agent in ART's calling convention (`rollout(model, scenario)` with an art.Model): under
    `artmlx run --rollout examples/tictactoe_rollout.py:art_rollout` the model is artmlx's `AgentModel`."""
    return await rollout(model.openai_client(), scenario, model=model.get_inference_name())
