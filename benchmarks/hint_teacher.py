"""How much a hinted teacher knows: the model's own accuracy when it reads the hint, per `hint_form` and teacher
temperature, on an environment whose hint states the answer (`math`, `word_problems`).

The hint term of the loss pulls the policy toward this teacher (`artmlx/learner/distill.py`), so a teacher that
answers no better than the policy has nothing to teach. Each cell is an `artmlx eval`-style evaluation of the
same held-out questions with the hint placed in the opening as the learner's teacher would read it.

    python benchmarks/hint_teacher.py --model smollm2-135m-instruct --episodes 100 \
        --json benchmarks/results/hint-teacher-smollm2-math.json
    python benchmarks/hint_teacher.py --env-args '{"min_operand": 10, "max_operand": 99}' --forms none,instruction \
        --temperatures 1.0,0.5 --json benchmarks/results/hint-teacher-smollm2-add2.json
    python benchmarks/hint_teacher.py --env word_problems --max-reply-tokens 24 --forms none,instruction \
        --temperatures 1.0,0.5 --json benchmarks/results/hint-teacher-smollm2-word-problems.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from artmlx.fast_blas import reexec_with_fast_blas


class TeacherView:
    """An answer-hinted environment whose opening already carries the episode's hint, placed as `form` places it
    (`none`: the opening as the policy sees it)."""

    def __init__(self, env, form: str):
        self.env, self.form = env, form

    def reset(self, seed: int) -> list[dict]:
        from artmlx.envs.answers import answer_hint
        from artmlx.hints import hinted_messages

        opening = self.env.reset(seed)
        return opening if self.form == "none" else hinted_messages(opening, answer_hint(self.env.answer), self.form)

    def __getattr__(self, name):
        return getattr(self.env, name)


def main() -> None:
    reexec_with_fast_blas()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--env", default="math", choices=("math", "word_problems"),
                        help="an environment whose hint states the answer")
    parser.add_argument("--env-args", default="{}", help="the environment's arguments, as JSON")
    parser.add_argument("--forms", default="none,instruction,system,demonstration",
                        help="hint forms to place the hint in; none: no hint (the policy itself)")
    parser.add_argument("--temperatures", default="1.0,0.5,0",
                        help="teacher temperatures to sample at (0: greedy)")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--max-reply-tokens", type=int, default=16)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()

    from artmlx.engine.loading import open_policy
    from artmlx.envs import make_env
    from artmlx.fast_blas import blas_description
    from artmlx.model.policy import LoraSpec
    from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
    from artmlx.rollout.evaluation import evaluate

    env_args = json.loads(args.env_args)
    outcomes = make_env(args.env, env_args).outcomes
    opened = open_policy(args.model, LoraSpec())
    cells = []
    for form in args.forms.split(","):
        engine = EpisodeRollouts(opened.model, opened.tokenizer, lambda: TeacherView(make_env(args.env, env_args), form),
                                 SamplingParams(max_reply_tokens=args.max_reply_tokens), opened.plan)
        for temperature in (float(t) for t in args.temperatures.split(",")):
            row = evaluate(engine, args.episodes, outcomes, temperature, seed=0)
            cells.append({"form": form, "temperature": temperature, "score": row["eval_score"],
                          "ci": [row["eval_score_ci_low"], row["eval_score_ci_high"]],
                          "unparseable_rate": row["eval_unparseable_rate"]})
            print(f"{form:<14} T={temperature:<4} right {row['eval_score']:.3f} "
                  f"(unparseable {row['eval_unparseable_rate']:.3f})", flush=True)
    report = {"model": args.model, "env": args.env, "env_args": env_args, "hint": "The answer is N.", "episodes": args.episodes,
              "max_reply_tokens": args.max_reply_tokens, "blas": blas_description(), "cpu_count": os.cpu_count(),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=Path(__file__).parent).stdout.strip() or None, "command": shlex.join(["python", "benchmarks/hint_teacher.py", *sys.argv[1:]]), "cells": cells}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
