"""The learner's vocabulary projection: peak memory and time of the policy tokens' logprobs and their
gradient, whole (n x V logits at once) against `learner/head.chunked_logprobs`, side by side.

    python benchmarks/head_memory.py [--vocab 151936 --hidden 896 --tokens 256 1024] [--json FILE]

A 4-bit tied head of Qwen2.5-0.5B's shape (random weights), n policy tokens' hidden states, a weighted
sum of their logprobs (as the GRPO loss), its value and gradient with respect to the hidden states;
MLX's peak-memory counter above what the inputs hold, wall seconds, and the two results' difference.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.engine.memory import head_chunk_rows  # noqa: E402
from artmlx.learner.head import chunked_logprobs  # noqa: E402


def whole(head, hidden, targets):
    logits = head(hidden).astype(mx.float32)
    return mx.take_along_axis(logits, targets[:, None], axis=-1)[:, 0] - mx.logsumexp(logits, axis=-1)


def measure(kind: str, head, hidden, targets, weights, rows: int) -> dict:
    def loss(x):
        logprobs = whole(head, x, targets) if kind == "whole" else chunked_logprobs(head, x, targets, 1.0, rows)
        return (logprobs * weights).sum()

    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    start = time.perf_counter()
    value, grad = mx.value_and_grad(loss)(hidden)
    mx.eval(value, grad)
    seconds = time.perf_counter() - start
    return {"peak_gb": round((mx.get_peak_memory() - base) / 2**30, 3), "seconds": round(seconds, 2),
            "value": value.item(), "grad": grad}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--json")
    args = parser.parse_args()
    embedding = nn.QuantizedEmbedding(args.vocab, args.hidden, group_size=64, bits=4)
    key = mx.random.key(0)
    embedding.weight, embedding.scales, embedding.biases = mx.quantize(
        mx.random.normal((args.vocab, args.hidden), key=key) * 0.02, 64, 4)
    mx.eval(embedding.parameters())
    rows = head_chunk_rows(args.vocab)
    report = {"command": shlex.join(["python", *sys.argv]), "device": str(mx.default_device()),
              "machine": platform.machine(), "vocab": args.vocab, "hidden": args.hidden, "chunk_rows": rows,
              "results": []}
    for tokens in args.tokens:
        hidden = mx.random.normal((tokens, args.hidden), key=mx.random.key(tokens))
        targets = mx.random.randint(0, args.vocab, (tokens,), key=mx.random.key(tokens + 1))
        weights = mx.random.normal((tokens,), key=mx.random.key(tokens + 2))
        mx.eval(hidden, targets, weights)
        plain = measure("whole", embedding.as_linear, hidden, targets, weights, rows)
        chunked = measure("chunked", embedding.as_linear, hidden, targets, weights, rows)
        row = {"tokens": tokens, "whole_peak_gb": plain["peak_gb"], "chunked_peak_gb": chunked["peak_gb"],
               "peak_ratio": round(chunked["peak_gb"] / plain["peak_gb"], 3), "whole_seconds": plain["seconds"],
               "chunked_seconds": chunked["seconds"],
               "time_ratio": round(chunked["seconds"] / plain["seconds"], 2),
               "value_difference": abs(plain["value"] - chunked["value"]),
               "max_grad_difference": mx.abs(plain["grad"] - chunked["grad"]).max().item()}
        report["results"].append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
