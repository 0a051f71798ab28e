"""How much a hinted teacher knows: the model's own accuracy when it reads the hint, per `hint_form` and teacher
temperature, on the `math` environment (whose hint states the answer).

The hint term of the loss pulls the policy toward this teacher (`artmlx/learner/distill.py`), so a teacher that
answers no better than the policy has nothing to teach. Each cell is an `artmlx eval`-style evaluation of the
same held-out questions with the hint placed in the opening as the learner's teacher would read it.

    python benchmarks/hint_teacher.py --model smollm2-135m-instruct --episodes 100 \
        --json benchmarks/results/hint-teacher-smollm2-math.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from artmlx.fast_blas import reexec_with_fast_blas


def teacher_env(form: str, env_args: dict):
    """The `math` environment whose opening already carries the episode's hint, placed as `form` places it."""
    from artmlx.envs.answers import answer_hint
    from artmlx.envs.math_question import MathQuestion
    from artmlx.hints import hinted_messages

    class HintedMath(MathQuestion):
        def reset(self, seed: int) -> list[dict]:
            opening = super().reset(seed)
            return opening if form == "none" else hinted_messages(opening, answer_hint(self.answer), form)

    return HintedMath(**env_args)


def main() -> None:
    reexec_with_fast_blas()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--forms", default="none,instruction,system,demonstration",
                        help="hint forms to place the hint in; none: no hint (the policy itself)")
    parser.add_argument("--temperatures", default="1.0,0.5,0",
                        help="teacher temperatures to sample at (0: greedy)")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--max-reply-tokens", type=int, default=16)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()

    from artmlx.engine.loading import open_policy
    from artmlx.envs.math_question import MathQuestion
    from artmlx.fast_blas import blas_description
    from artmlx.model.policy import LoraSpec
    from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
    from artmlx.rollout.evaluation import evaluate

    opened = open_policy(args.model, LoraSpec())
    cells = []
    for form in args.forms.split(","):
        engine = EpisodeRollouts(opened.model, opened.tokenizer, lambda: teacher_env(form, {}),
                                 SamplingParams(max_reply_tokens=args.max_reply_tokens), opened.plan)
        for temperature in (float(t) for t in args.temperatures.split(",")):
            row = evaluate(engine, args.episodes, MathQuestion.outcomes, temperature, seed=0)
            cells.append({"form": form, "temperature": temperature, "score": row["eval_score"],
                          "ci": [row["eval_score_ci_low"], row["eval_score_ci_high"]],
                          "unparseable_rate": row["eval_unparseable_rate"]})
            print(f"{form:<14} T={temperature:<4} right {row['eval_score']:.3f} "
                  f"(unparseable {row['eval_unparseable_rate']:.3f})", flush=True)
    report = {"model": args.model, "env": "math (sums of 0-20, hint 'The answer is N.')", "episodes": args.episodes,
              "max_reply_tokens": args.max_reply_tokens, "blas": blas_description(), "cpu_count": os.cpu_count(),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=Path(__file__).parent).stdout.strip() or None, "command": " ".join(["python", "benchmarks/hint_teacher.py", *sys.argv[1:]]), "cells": cells}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
