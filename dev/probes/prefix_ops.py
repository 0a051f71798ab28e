"""What keeping finished sequences and admitting their next turns costs the host: row by row against together.

    python dev/probes/prefix_ops.py [--rows 128] [--prompt 300] [--layers 24] [--json FILE]

When a group of agents' replies end in one step, the scheduler copies each sequence's KV out of the batch
cache for the prefix cache (`cache_rows.rows_kv`), and when their next turns arrive it builds their cache
from those prefixes (`cache_rows.cache_with_prefixes`). Both on `--rows` rows of a model with `--layers`
layers and the 0.5B shape's attention (2 KV heads of 64; small elsewhere, Qwen2.5's vocabulary), two ways:
- `row_by_row`: each row its own gather per layer (`group_bytes=1`), each admitted prefix its own arrays
  (what the scheduler did before 2026-12-03);
- `together`: one gather per layer for all the rows, the admission's prefixes out of those buffers.
For each: the operations the graph holds (counted from MLX's graph, as `step_ops.py`) and the host's
seconds to build and evaluate them, best of `--repeats`. On a GPU each operation costs the host its launch
(~6-8 us on the H200, `op_host_cost.py`); on this CPU the copies themselves cost as much.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from artmlx.bench.report import write  # noqa: E402
from artmlx.engine.cache_rows import cache_with_prefixes, rows_kv  # noqa: E402
from artmlx.engine.generate import Engine  # noqa: E402
from artmlx.engine.prefix_cache import Prefix  # noqa: E402
from artmlx.model.policy import load_base  # noqa: E402
from step_ops import graph_ops  # noqa: E402  (dev/probes/ is this script's folder)


def flat(kept) -> list:
    return [a for kv, _, _ in kept for layer in kv for a in layer]


def keep(cache, rows: list[int], ends: list[int], together: bool) -> list:
    return rows_kv(cache, rows, ends, group_bytes=0 if together else 1)


def admit(engine: Engine, kept: list, together: bool) -> list:
    prefixes = [Prefix(kv, 0, shared, row) if together else Prefix(kv) for kv, shared, row in kept]
    built = cache_with_prefixes(engine.new_cache(1), prefixes)
    return [a for layer in built.layers for a in (layer.keys, layer.values)]


def measure(engine: Engine, cache, rows: list[int], ends: list[int], together: bool, repeats: int) -> dict:
    """Operations (counted once, untimed) and the best host seconds of building and evaluating each."""
    kept = keep(cache, rows, ends, together)
    out = {"keep": {"ops": sum(graph_ops(*flat(kept)).values())}}
    mx.eval(flat(kept))
    out["admit"] = {"ops": sum(graph_ops(*admit(engine, kept, together)).values())}
    for name, run in (("keep", lambda: flat(keep(cache, rows, ends, together))),
                      ("admit", lambda: admit(engine, kept, together))):
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            mx.eval(run())
            best = min(best, time.perf_counter() - started)
        out[name]["host_s"] = round(best, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    from artmlx.model.synth import synthesize

    folder = Path(tempfile.gettempdir()) / f"artmlx-prefix-ops-{args.layers}"
    if not (folder / "config.json").exists():
        synthesize("qwen2.5-0.5b", folder, shape_overrides={"hidden_size": 128, "num_hidden_layers": args.layers,
                                                            "intermediate_size": 256, "num_attention_heads": 2,
                                                            "num_key_value_heads": 2})
    model, _ = load_base(str(folder))
    engine = Engine(model)
    rng = np.random.default_rng(0)
    lengths = rng.integers(args.prompt - 20, args.prompt + 20, args.rows).tolist()
    cache = engine.new_cache(args.rows)
    engine.prefill(cache, [rng.integers(3, 20000, n).tolist() for n in lengths])
    mx.eval(cache.arrays())
    rows = list(range(args.rows))
    report = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "device": str(mx.default_device()),
              "rows": args.rows, "layers": args.layers}
    for name, together in (("row_by_row", False), ("together", True)):
        report[name] = measure(engine, cache, rows, lengths, together, args.repeats)
        print(name, report[name], flush=True)
    print(json.dumps(report, indent=1))
    write(report, args.json)


if __name__ == "__main__":
    main()
