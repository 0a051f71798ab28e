"""How far bfloat16 arithmetic alone moves a model's logprobs, next to how far the sampler and the learner disagree.

    python dev/probes/bf16_noise.py --model FOLDER [--model ...] [--groups 8] [--group-size 8] [--prompt 128]
        [--reply 128] [--dtype bfloat16] [--json FILE]

The engine plays `groups` groups of the synthetic workload (as `artmlx bench rollout`), recording the sampler's
logprobs; the learner recomputes them with unchanged weights (its training forward, no gradient), first in the
model's own dtype, then with every floating-point array of the model cast to float32 (the 4-bit weights keep
their values: scales and biases widen exactly). Three differences per policy token:

- sampler - learner: the number `bench rollout` reports (different kernels: cached decode against one forward);
- learner - learner in float32: what bfloat16 rounding alone does to this model's logprobs;
- sampler - learner in float32.

If the first is of the size of the second, the sampler/learner gap is bfloat16 noise at this model's scale, not
a difference in what the two paths compute. Also reported: the logits' scale (standard deviation over the
vocabulary, and the largest logit's margin over the logsumexp's), since rounding error grows with the values
rounded, and random-weight models of some families produce far larger logits than trained ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from artmlx.bench.rollout import RolloutBench  # noqa: E402
from artmlx.learner.settings import trainer_settings  # noqa: E402
from artmlx.learner.trainer import GRPOTrainer  # noqa: E402


def difference(a: np.ndarray, b: np.ndarray) -> dict:
    d = np.abs(a - b)
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "p99_abs": float(np.quantile(d, 0.99)),
            "ratio_mean": float(np.exp(a - b).mean())}


def logit_scale(model, groups) -> dict:
    """The logits over the first episode's tokens: standard deviation over the vocabulary, and the top logit's
    distance below the logsumexp (small when the distribution is peaked), averaged over positions."""
    episode = groups[0].episodes[0]
    tokens = mx.array(np.asarray(episode.tokens, np.int32))[None]
    logits = model(tokens)[0].astype(mx.float32)
    std = mx.std(logits, axis=-1)
    gap = mx.logsumexp(logits, axis=-1) - logits.max(axis=-1)
    return {"positions": int(logits.shape[0]), "std_mean": float(std.mean()), "std_max": float(std.max()),
            "abs_max": float(mx.abs(logits).max()), "top_gap_mean": float(gap.mean())}


def measure(model_path: str, groups: int, group_size: int, prompt: int, reply: int, dtype: str = "") -> dict:
    bench = RolloutBench(model_path, prompt, reply)
    if dtype:  # the CPU loads float32 copies (model/backend.py): bfloat16 there only when asked
        bench.model.set_dtype(getattr(mx, dtype))
        mx.eval(bench.model.parameters())
    dtype = str(next(v.dtype for _, v in _floating(bench.model)))
    seeds = list(range(7000, 7000 + groups))
    played, engine = bench.engine(seeds, group_size)
    trainer = GRPOTrainer(bench.model, trainer_settings({"temperature": 1.0}), bench.plan)
    learner, sampler = trainer.recompute(played)
    scale = logit_scale(bench.model, played)
    bench.model.set_dtype(mx.float32)
    mx.eval(bench.model.parameters())
    learner32, sampler_again = trainer.recompute(played)
    assert np.array_equal(sampler, sampler_again)
    scale32 = logit_scale(bench.model, played)
    return {"model": model_path, "dtype": dtype, "device": str(mx.default_device()), "policy_tokens": int(sampler.size),
            "engine": engine, "logits": scale, "logits_float32": scale32,
            "sampler_vs_learner": difference(learner, sampler),
            "learner_vs_learner_float32": difference(learner, learner32),
            "sampler_vs_learner_float32": difference(learner32, sampler)}


def _floating(model):
    from mlx.utils import tree_flatten

    return [(k, v) for k, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", required=True, help="a model folder or synth name (repeat)")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--reply", type=int, default=128)
    parser.add_argument("--dtype", default="", help="cast the model's floating-point arrays first (e.g. bfloat16)")
    parser.add_argument("--json")
    args = parser.parse_args()
    report = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "models": []}
    for model in args.model:
        row = measure(model, args.groups, args.group_size, args.prompt, args.reply, args.dtype)
        report["models"].append(row)
        print(f"{model} ({row['dtype']}, {row['policy_tokens']} tokens, logit std {row['logits']['std_mean']:.2f}): "
              f"max |d| sampler-learner {row['sampler_vs_learner']['max_abs']:.4f}, learner-float32 "
              f"{row['learner_vs_learner_float32']['max_abs']:.4f}, sampler-float32 "
              f"{row['sampler_vs_learner_float32']['max_abs']:.4f}", flush=True)
        mx.clear_cache()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
