"""Gated DeltaNet in training: mlx-lm's per-step loop against the chunked recurrence, side by side.

    python benchmarks/recurrence_memory.py [--steps 512,1024] [--layers 4] [--tokens 1024] [--json FILE]

Part 1, one layer's recurrence at Qwen3.5-0.8B's width (16 value heads, 128 x 128 states), one sequence of
each length in `--steps`: MLX's peak memory above what was allocated before and seconds, forward alone and
forward + backward, for `gated_delta_ops`, `chunked_recurrence` and `parallel_recurrence` (model/recurrence.py).
Part 2, the 0.8B shape with `--layers` of its 24 layers (random 4-bit weights, real width and vocabulary), a
LoRA cross-entropy step in training mode over `--tokens` tokens, once through mlx-lm's `gated_delta_update`
and once through the installed one (its training path: the closed form). Part 2 pays kernel compilation
first on every backend (a warm-up step each); `--layers 0` skips it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlx_lm.models import gated_delta as mlx_lm_gated_delta  # noqa: E402

from artmlx.model import recurrence  # noqa: E402


def peak_mb(fn) -> tuple[float, float]:
    mx.synchronize()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    started = time.perf_counter()
    mx.eval(fn())
    return round((mx.get_peak_memory() - before) / 2**20, 1), round(time.perf_counter() - started, 3)


def one_layer(steps: int) -> dict:
    mx.random.seed(0)
    q, k = (mx.random.normal((1, steps, 16, 128)) * 0.1 for _ in range(2))
    v = mx.random.normal((1, steps, 16, 128))
    g, beta = mx.sigmoid(mx.random.normal((1, steps, 16)) + 2), mx.sigmoid(mx.random.normal((1, steps, 16)))
    state = mx.zeros((1, 16, 128, 128))
    mx.eval(q, k, v, g, beta, state)
    out = {}
    for name, fn in (("mlx_lm_ops", mlx_lm_gated_delta.gated_delta_ops), ("chunked", recurrence.chunked_recurrence),
                     ("closed_form", recurrence.parallel_recurrence)):
        def loss(q, k, v, g, beta, fn=fn):
            return (fn(q, k, v, g, beta, state)[0] ** 2).sum()
        forward = peak_mb(lambda: fn(q, k, v, g, beta, state))
        backward = peak_mb(lambda: mx.grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, g, beta))
        out[name] = {"forward_mb": forward[0], "forward_s": forward[1], "train_mb": backward[0],
                     "train_s": backward[1], "train_mb_per_token": round(backward[0] / steps, 3)}
        print(f"one layer, {steps} steps, {name}: {out[name]}", flush=True)
    return out


def model_step(layers: int, tokens: int) -> dict:
    from mlx_lm.models import qwen3_5

    from artmlx.model.policy import LoraSpec, load_policy
    from artmlx.model.synth import synthesize

    folder = Path(tempfile.gettempdir()) / f"artmlx-bench-qwen3.5-{layers}l"
    if not (folder / "config.json").exists():
        synthesize("qwen3.5-0.8b", folder, shape_overrides={"num_hidden_layers": layers})
    model, _, _ = load_policy(str(folder), LoraSpec(rank=16))
    model.train()
    ids = mx.array(np.random.default_rng(0).integers(0, 150000, (1, tokens + 1)))

    def step():
        def loss(params):
            model.update(params)
            return nn.losses.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).mean()
        return mx.value_and_grad(loss)(model.trainable_parameters())

    out = {}
    for name, fn in (("mlx_lm", recurrence._ORIGINAL), ("installed", recurrence.gated_delta_update)):
        qwen3_5.gated_delta_update = fn
        peak_mb(step)  # warm-up
        mb, seconds = peak_mb(step)
        out[name] = {"train_mb": mb, "train_s": seconds}
        print(f"{layers} layers, {tokens} tokens, {name}: {out[name]}", flush=True)
    recurrence.install(model)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="512,1024")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = {"date": time.strftime("%Y-%m-%d"), "command": shlex.join(sys.argv), "device": str(mx.default_device()),
              "one_layer": {str(n): one_layer(n) for n in map(int, args.steps.split(","))},
              "model_step": ({"layers": args.layers, "tokens": args.tokens, **model_step(args.layers, args.tokens)}
                             if args.layers else None)}
    print(json.dumps(report, indent=1), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
