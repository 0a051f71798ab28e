"""Sampler vs learner logprobs with unchanged weights: the importance ratio should be 1.

    python benchmarks/logprob_consistency.py [--model tiny] [--groups 16] [--group-size 8]

Plays tic-tac-toe groups with the batched ragged-cache sampler, recomputes every sampled token's
logprob with one full forward pass per episode (what the learner does), and reports the ratio
exp(learner - sampler) over all policy tokens. LoRA adapters are set to random non-zero values
so the adapter path is exercised too.
"""

from __future__ import annotations

import argparse
import json

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from artmlx.envs import make_env
from artmlx.learner.batching import make_microbatch
from artmlx.learner.grpo import token_logprobs
from artmlx.model.policy import LoraSpec, load_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--temperature", type=float, nargs="+", default=[1.0, 0.7])
    args = parser.parse_args()

    mx.random.seed(0)
    model, tokenizer, _ = load_policy(args.model, LoraSpec())
    model.load_weights([(k, mx.random.normal(v.shape) * 0.02) for k, v in tree_flatten(model.trainable_parameters())],
                       strict=False)
    results = []
    for temperature in args.temperature:
        engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams(temperature=temperature))
        groups = engine.play(list(range(args.groups)), args.group_size, mx.random.key(1))
        episodes = [e for g in groups for e in g.episodes]
        batch = make_microbatch(episodes, np.zeros(len(episodes)), list(range(len(episodes))))
        learner = np.array(token_logprobs(model(batch.inputs), batch.targets, temperature))
        mask = np.array(batch.mask) > 0
        diff = (learner - np.array(batch.behaviour_logprobs))[mask]
        ratio = np.exp(diff)
        results.append({
            "temperature": temperature,
            "policy_tokens": int(mask.sum()),
            "episodes": len(episodes),
            "max_turns": max(e.turns for e in episodes),
            "ratio_mean": float(ratio.mean()),
            "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max()),
            "max_abs_logprob_diff": float(np.abs(diff).max()),
        })
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
