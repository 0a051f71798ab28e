"""Operations one decode step launches: the serving scheduler's step, the rollout engine's decode loop, and
mlx-lm's own `model(tokens, cache)` step, counted from MLX's graph (`mx.export_to_dot`) at the point each
path hands its step to `mx.async_eval`/`mx.eval`.

On MLX's CUDA backend a decode step of a small model at few rows is bound by the host, which pays each
operation's launch (dev/probes/op_host_cost.py: ~6-70 us each on the H200), so the number of operations a
step builds is what its time follows there; on the CPU the count is the same and can be measured here.

    python dev/probes/step_ops.py [--model tiny|PATH] [--rows 1,32] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from artmlx.config import TrainConfig  # noqa: E402
from artmlx.engine.generate import Engine  # noqa: E402
from artmlx.engine.scheduler import Request, Scheduler  # noqa: E402
from artmlx.model.policy import LoraSpec, load_policy  # noqa: E402

DOT = Path(tempfile.gettempdir()) / "artmlx-step-ops.dot"


def graph_ops(*outputs) -> collections.Counter:
    """Operations not yet evaluated behind `outputs`, by primitive name."""
    mx.export_to_dot(str(DOT), *[o for o in outputs if isinstance(o, mx.array)])
    return collections.Counter(re.findall(r'label ="([^"]+)"', DOT.read_text()))


class Capture:
    """Replaces `mx.async_eval` while armed: the first call's graph is counted, then evaluated as usual."""

    def __init__(self):
        self.original, self.armed, self.ops = mx.async_eval, False, None

    def __call__(self, *args):
        if self.armed:
            flat = [a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg])]
            self.ops, self.armed = graph_ops(*flat), False
        return self.original(*args)


def scheduler_step(model, rows: int, prompt: int, capture: Capture) -> collections.Counter:
    scheduler = Scheduler(Engine(model), max_rows=rows, max_prompt_tokens=4096)
    rng = np.random.default_rng(0)
    for _ in range(rows):
        scheduler.submit(Request(rng.integers(3, 60, prompt).tolist(), max_tokens=24, temperature=1.0))
    scheduler.step()  # admits and samples the first tokens
    scheduler.step()
    capture.armed = True
    scheduler.step()  # a steady decode step
    while scheduler.busy:
        scheduler.step()
    return capture.ops


def engine_step(model, rows: int, prompt: int, capture: Capture) -> collections.Counter:
    engine = Engine(model)
    rng = np.random.default_rng(0)
    cache = engine.new_cache(rows)
    logits = engine.prefill(cache, [rng.integers(3, 60, prompt).tolist() for _ in range(rows)])
    mx.eval(logits)
    calls = {"n": 0}
    original = capture.original

    def second_call(*args):  # the loop's first async_eval is step 0; count step 2's
        calls["n"] += 1
        capture.armed = calls["n"] == 3
        return capture(*args)

    mx.async_eval = second_call
    try:
        engine.decode(cache, logits, mx.random.key(0), temperature=1.0, max_tokens=6, stop_tokens=[])
    finally:
        mx.async_eval = capture
    del original
    return capture.ops


def mlx_lm_step(model, rows: int, prompt: int) -> collections.Counter:
    """mlx-lm's generation step: `model(tokens, cache=...)` on its own caches, then a categorical sample."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    rng = np.random.default_rng(0)
    tokens = mx.array(rng.integers(3, 60, (rows, prompt)))
    logits = model(tokens, cache=cache)[:, -1, :]
    mx.eval(logits)
    token = mx.random.categorical(logits)
    logits = model(token[:, None], cache=cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return graph_ops(mx.random.categorical(logprobs), logprobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rows", default="1,32")
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    model, _, _ = load_policy(args.model, LoraSpec.from_config(TrainConfig()))
    model.eval()
    mx.eval(model.parameters())
    capture = Capture()
    mx.async_eval = capture
    report = {"command": " ".join(sys.argv), "device": str(mx.default_device()), "rows": {}}
    for rows in [int(r) for r in args.rows.split(",")]:
        counted = {"scheduler": scheduler_step(model, rows, args.prompt, capture),
                   "engine": engine_step(model, rows, args.prompt, capture),
                   "mlx_lm (LoRA attached)": mlx_lm_step(model, rows, args.prompt)}
        report["rows"][rows] = {name: {"total": sum(ops.values()), "by_op": dict(ops.most_common())}
                                for name, ops in counted.items()}
        print(f"rows {rows}: " + ", ".join(f"{n} {sum(o.values())}" for n, o in counted.items()), flush=True)
    mx.async_eval = capture.original
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
