"""Where MLX's fused RoPE (`mx.fast.rope`) launches and agrees with the portable rotation, by decode shape.

The engine rotates queries and keys of shape (rows, heads, 1, head_dim) (mlx-lm's transposed view) with one
position offset per row. On MLX 0.32.4's CUDA backend `mx.fast.rope` failed to launch from 128 rows
("invalid argument", an earlier session), so `model/rope.py` takes a compiled rotation there, which costs
the host far more per call. This probes, per rows x heads x head_dim: whether the fused kernel launches,
its largest difference from `PortableRoPE` (float32), and the same for rows cut into pieces below a limit.

    python dev/probes/rope_probe.py [--json FILE]
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

from artmlx.model.rope import PortableRoPE  # noqa: E402

ROWS = [1, 8, 64, 127, 128, 129, 192, 255, 256, 257, 512]
SHAPES = [(14, 64), (2, 64), (16, 128), (8, 128), (32, 128), (4, 256)]


def decode_input(rows: int, heads: int, dims: int, seed: int) -> mx.array:
    x = mx.random.normal((rows, 1, heads, dims), key=mx.random.key(seed)).astype(mx.bfloat16)
    return x.transpose(0, 2, 1, 3)  # as mlx-lm's attention hands it to RoPE


def fused(x: mx.array, dims: int, offset: mx.array, piece: int = 0) -> mx.array:
    if not piece or x.shape[0] <= piece:
        return mx.fast.rope(x, dims, traditional=False, base=10000.0, scale=1.0, offset=offset)
    return mx.concatenate([mx.fast.rope(x[i:i + piece], dims, traditional=False, base=10000.0, scale=1.0,
                                        offset=offset[i:i + piece]) for i in range(0, x.shape[0], piece)])


def check(rows: int, heads: int, dims: int, piece: int) -> dict:
    x = decode_input(rows, heads, dims, rows * 131 + heads)
    offset = mx.array(np.random.default_rng(rows).integers(0, 4000, rows).astype(np.int32))
    expected = PortableRoPE(dims)(x, offset).astype(mx.float32)
    try:
        got = fused(x, dims, offset, piece).astype(mx.float32)
        diff = float(mx.abs(got - expected).max())
    except Exception as error:  # the probe's point: which shapes the kernel refuses
        return {"ok": False, "error": str(error)[:160]}
    return {"ok": diff < 0.1, "max_abs_diff": diff}


def host_us(fn, calls: int = 200) -> float:
    mx.eval(fn())
    started = time.perf_counter()
    outs = [fn() for _ in range(calls)]
    built = time.perf_counter()
    mx.eval(outs)
    return round((built - started) / calls * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    report = {"date": time.strftime("%Y-%m-%d"), "device": str(mx.default_device()), "mlx": mx.__version__,
              "whole": {}, "pieces_of_127": {}, "graph_build_us": {}}
    for heads, dims in SHAPES:
        for rows in ROWS:
            name = f"{rows}x{heads}x{dims}"
            report["whole"][name] = check(rows, heads, dims, 0)
            report["pieces_of_127"][name] = check(rows, heads, dims, 127)
            print(name, report["whole"][name], report["pieces_of_127"][name], flush=True)
    x = decode_input(128, 14, 64, 0)
    offset = mx.arange(128, dtype=mx.int32)
    portable = PortableRoPE(64)
    report["graph_build_us"] = {"portable_128": host_us(lambda: portable(x, offset)),
                                "fused_pieces_128": host_us(lambda: fused(x, 64, offset, 127))}
    print(report["graph_build_us"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
