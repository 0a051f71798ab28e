"""Decode attention with and without an array mask, side by side (why window layers skip the mask when they can).

    python dev/probes/window_attention.py [--rows 64,256] [--slots 256] [--json FILE]

Gemma 3 1B's attention shape (4 query heads, 1 key/value head, head size 256, bfloat16): one query per
row against `slots` cached keys (a slice of a larger buffer, as the engine's cache returns them), through
`mx.fast.scaled_dot_product_attention` with mask None and with an all-true boolean (rows, 1, 1, slots)
mask. On CUDA the array mask takes MLX's unfused path; milliseconds per call after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx


def per_call_ms(fn, repeats: int = 20) -> float:
    mx.eval(fn())
    started = time.perf_counter()
    for _ in range(repeats):
        mx.eval(fn())
    return (time.perf_counter() - started) / repeats * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="64,256")
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = {"device": str(mx.default_device()), "slots": args.slots, "rows": {}}
    for rows in [int(r) for r in args.rows.split(",")]:
        q = mx.random.normal((rows, 4, 1, 256)).astype(mx.bfloat16)
        buffer = mx.random.normal((rows, 1, args.slots + 256, 256)).astype(mx.bfloat16)
        k, v = buffer[:, :, : args.slots], buffer[:, :, 1 : args.slots + 1]
        mask = mx.ones((rows, 1, 1, args.slots), dtype=mx.bool_)
        plain = per_call_ms(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.0625, mask=None))
        masked = per_call_ms(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.0625, mask=mask))
        report["rows"][rows] = {"mask_none_ms": round(plain, 3), "array_mask_ms": round(masked, 3)}
        print(f"rows {rows}: mask None {plain:.3f} ms, array mask {masked:.3f} ms", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
