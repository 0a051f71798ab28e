"""ART's own published example rollout, unmodified, trained on MLX: only the backend changes.

openpipe-art ships `art/pipeline_trainer/yes_no_maybe_pipeline.py` (a rollout asking for "yes",
"no" or "maybe", rewarding maybe 1.0, no 0.75, yes 0.5). Its `rollout_fn`, `build_scenarios` and
`reward_for_answer` are imported from the installed package as they are. That module imports
ART's Tinker backend for its own `main()`, which needs the `tinker` service packages; here that
import is answered with artmlx's `MLXBackend`: this is the backend swap, and nothing else of the
example is touched. The loop is ART's documented one: roll out groups, `backend.train` (ART's
`model.log` of trajectories needs pyarrow from ART's own backend extra, so this prints its own line).

    pip install "artmlx[art]" && python examples/art_yes_no_maybe.py --steps 20
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
import types

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art  # noqa: E402

from artmlx.art import MLXBackend  # noqa: E402

sys.modules.setdefault("art.tinker_native", types.SimpleNamespace(TinkerNativeBackend=MLXBackend))
from art.pipeline_trainer import yes_no_maybe_pipeline as example  # noqa: E402


async def main(steps: int, groups_per_step: int, base_model: str, path: str) -> None:
    backend = MLXBackend(path=path, config={"lora_rank": 8})
    model = art.TrainableModel(name="yes-no-maybe", project="art-examples", base_model=base_model)
    await model.register(backend)
    try:
        await train(backend, model, steps, groups_per_step)
    finally:
        await backend.close()


async def train(backend: MLXBackend, model, steps: int, groups_per_step: int) -> None:
    scenarios = itertools.cycle(example.build_scenarios())
    started = time.perf_counter()
    for _ in range(await model.get_step(), steps):
        batch = [next(scenarios) for _ in range(groups_per_step)]
        groups = await asyncio.gather(*(example.rollout_fn(model, scenario, None) for scenario in batch))
        rewards = [t.reward for g in groups for t in g.trajectories]
        answers = [(t.messages_and_choices[-1].message.content or "").strip()[:8] for g in groups for t in g.trajectories]
        result = await backend.train(model, groups, learning_rate=1e-4)
        print(f"step {result.step:3d}  reward {sum(rewards) / len(rewards):.3f}  "
              f"maybe {sum(a.lower().startswith('maybe') for a in answers) / len(answers):.2f}  "
              f"trajectories {len(rewards)} refused {int(result.metrics['trajectories_refused'])}  "
              f"loss {result.metrics.get('loss', 0.0):+.4f}  time {time.perf_counter() - started:.0f} s  "
              f"e.g. {answers[0]!r}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups-per-step", type=int, default=2, help="scenarios per step (each n=32 replies)")
    parser.add_argument("--base-model", default="tiny", help="tiny, a Hugging Face id or an mlx-lm folder")
    parser.add_argument("--path", default=".art")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.groups_per_step, args.base_model, args.path))
