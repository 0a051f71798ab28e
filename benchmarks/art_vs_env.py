"""ART-style tic-tac-toe (an async rollout against the OpenAI client, trained by MLXBackend) vs the env.

Same budget and algorithm as `artmlx train` with no arguments: 16 groups of 8 games per update,
learning rate 1e-4, PPO-clip, advantages not divided by the std (`loss_fn="ppo", scale_rewards=False`),
temperature 1, 8 reply tokens. The rollout is `examples/tictactoe_rollout.py` (the env's game written
as an ART agent). Every 10 updates the adapter is evaluated with artmlx's held-out evaluation of the
`tictactoe` env (200 games, seed 0), the numbers `artmlx train` reports. Writes OUT/metrics.jsonl in
the run-folder form, so `artmlx plot OUT RUN_DIR ...` draws it next to `artmlx train` / `run` curves.

    python benchmarks/art_vs_env.py --out benchmarks/results/art-curves/art-mlxbackend
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import art  # noqa: E402

from artmlx.art import MLXBackend  # noqa: E402
from artmlx.config import TrainConfig  # noqa: E402
from artmlx.envs.base import make_env, outcomes_of  # noqa: E402
from artmlx.rollout.evaluation import evaluate  # noqa: E402
from artmlx.seeds import train_seeds  # noqa: E402
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams  # noqa: E402
from examples.tictactoe_rollout import art_rollout  # noqa: E402


async def main(steps: int, out: Path) -> None:
    config = TrainConfig()
    backend = MLXBackend(path=tempfile.mkdtemp(), config={"seed": config.seed})
    model = art.TrainableModel(name="ttt", project="bench", base_model="tiny")
    await model.register(backend)
    server = backend.server
    outcomes = outcomes_of(make_env(config.env, config.env_args))

    def run_eval():  # on the scheduler's thread, with the adapter being served
        server.scheduler.load_current()
        engine = EpisodeRollouts(server.model, server.tokenizer, lambda: make_env(config.env, config.env_args),
                                 SamplingParams.from_config(config))
        return evaluate(engine, config.eval_episodes, outcomes, config.resolved_eval_temperature(), seed=config.seed)

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with (out / "metrics.jsonl").open("w") as log:
        def write(row):
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), flush=True)

        write({"step": 0, "time": 0.0, **server.call(run_eval).result()})
        for step in range(steps):
            seeds = train_seeds(config.seed, step, config.groups_per_step)
            groups = await art.gather_trajectory_groups(
                [art.TrajectoryGroup(art_rollout(model, {"seed": s}) for _ in range(config.group_size)) for s in seeds],
                pbar_desc=None)
            result = await backend.train(model, groups, learning_rate=config.learning_rate, loss_fn="ppo",
                                         scale_rewards=False, save_checkpoint=False)
            rewards = [t.reward for g in groups for t in g.trajectories]
            write({"step": result.step, "time": time.perf_counter() - started, "reward_mean": sum(rewards) / len(rewards),
                   "refused": result.metrics["trajectories_refused"], "loss": result.metrics.get("loss", 0.0)})
            if result.step % config.eval_every == 0:
                write({"step": result.step, "time": time.perf_counter() - started, **server.call(run_eval).result()})
    await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/art-curves/art-mlxbackend"))
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.out))
