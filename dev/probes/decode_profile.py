"""One sequence at a time: where the serving scheduler's time goes against mlx-lm's `generate_step`.

    python dev/probes/decode_profile.py --model FOLDER [--prompt 1100] [--tokens 64] [--json FILE]

A `prompt`-token request through the engine's `Scheduler`, driven on this thread (time to its first
token, then milliseconds per token); a second request that extends the first sequence by 40 tokens
(a prefix-cache hit: an agent's next turn); `--rows` requests decoding together (milliseconds per
step); and mlx-lm's own `generate_step` on the same prompt with its `KVCache` (what `mlx_lm.server`
runs per sequence), and the same `--rows` prompts through the rollout engine's decode loop
(`Engine.decode`, which synchronises with the host only at steps 2, 4, 8, ...). The scheduler's counts say where its time went (`sync_s`: waiting for the
device; the rest of `decode_s` is the host building the step). `--no-lora` and `--array-masks` are
the A/B switches that name the gap: LoRA's extra kernels, and attention given an array mask;
`--decode-chunk N` sets the scheduler's decode steps between host reads (default: 1, single steps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from artmlx.engine.cache import LayerKV  # noqa: E402
from artmlx.engine.generate import Engine  # noqa: E402
from artmlx.engine.scheduler import Request, Scheduler  # noqa: E402

TOKEN_HIGH = 20000


def drive(scheduler: Scheduler, requests: list[Request]) -> None:
    for request in requests:
        scheduler.submit(request)
    while scheduler.busy:
        scheduler.step()


def timed_request(scheduler: Scheduler, prompt: list[int], tokens: int) -> dict:
    stamps: list[float] = []
    started = time.perf_counter()
    request = Request(prompt=prompt, max_tokens=tokens, temperature=1.0,
                      on_token=lambda r: stamps.append(time.perf_counter()))
    drive(scheduler, [request])
    gaps = np.diff(stamps)  # with chunks, tokens arrive in bursts: total_ms says what the request took
    return {"first_token_ms": round((stamps[0] - started) * 1000, 2), "total_ms": round((stamps[-1] - started) * 1000, 2),
            "ms_per_token": round(float(gaps.mean()) * 1000, 3), "tokens": len(request.tokens),
            "sequence": prompt + request.tokens}


def batch_steps(scheduler: Scheduler, rows: int, prompt_tokens: int, tokens: int) -> dict:
    """`rows` requests of distinct prompts admitted together: milliseconds per decode step after admission."""
    rng = np.random.default_rng(7)
    stamps: list[float] = []
    requests = [Request(prompt=rng.integers(3, TOKEN_HIGH, prompt_tokens).tolist(), max_tokens=tokens,
                        temperature=1.0, on_token=(lambda r: stamps.append(time.perf_counter())) if i == 0 else None)
                for i in range(rows)]
    drive(scheduler, requests)
    gaps = np.diff(stamps)
    return {"rows": rows, "ms_per_step": round(float(gaps.mean()) * 1000, 3),
            "tokens_per_s": round(rows / float(gaps.mean()), 1)}


def engine_steps(engine: Engine, rows: int, prompt_tokens: int, tokens: int) -> dict:
    """The same `rows` prompts through the rollout engine's own decode loop (`Engine.decode`: no stop tokens,
    the host synchronising at steps 2, 4, 8, ...): milliseconds per step, against `batch_steps`."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, TOKEN_HIGH, prompt_tokens).tolist() for _ in range(rows)]
    cache = engine.new_cache(rows)
    logits = engine.prefill(cache, prompts)
    mx.eval(logits, cache.arrays())
    started = time.perf_counter()
    engine.decode(cache, logits, mx.random.key(3), temperature=1.0, max_tokens=tokens, stop_tokens=[-1])
    seconds = time.perf_counter() - started
    return {"rows": rows, "ms_per_step": round(seconds / tokens * 1000, 3), "tokens_per_s": round(rows * tokens / seconds, 1)}


def engine_dense_steps(engine: Engine, rows: int, prompt_tokens: int, tokens: int) -> dict:
    """A/B for `engine_steps`: its loop with the lengths known on the host (every row real at every step), so the
    cache stays dense and attention gets no mask arrays, as in the scheduler's steps."""
    from artmlx.engine.generate import sample_tokens

    rng = np.random.default_rng(7)
    cache = engine.new_cache(rows)
    logits = engine.prefill(cache, [rng.integers(3, TOKEN_HIGH, prompt_tokens).tolist() for _ in range(rows)])
    mx.eval(logits, cache.arrays())
    key, picked = mx.random.key(3), []
    started = time.perf_counter()
    for _ in range(tokens):
        key, step_key = mx.random.split(key)
        token, logprob = sample_tokens(logits, 1.0, step_key)
        picked.append(logprob)
        logits = engine.parts.head(cache.forward(engine.parts.trunk, token[:, None], np.ones((rows,), np.int32))[:, -1])
        mx.async_eval(logits, logprob)
    mx.eval(picked)
    seconds = time.perf_counter() - started
    return {"rows": rows, "ms_per_step": round(seconds / tokens * 1000, 3), "tokens_per_s": round(rows * tokens / seconds, 1)}


def without_lora(model) -> None:
    """Every LoRA layer back to its base layer (what mlx_lm.server runs)."""
    from mlx_lm.tuner.lora import LoRALinear

    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.linear)


def scheduler_runs(model_name: str, prompt: list[int], tokens: int, repeats: int, lora: bool, dense_mask: bool,
                   rows: int, decode_chunk: int = 1) -> dict:
    from artmlx.config import TrainConfig
    from artmlx.model.backend import prefer_mlx_attention
    from artmlx.model.policy import LoraSpec, load_policy

    prefer_mlx_attention()
    if not dense_mask:  # A/B: every mask an array, as before the cache knew it was dense
        original = LayerKV.make_mask

        def array_mask(self, N, return_array=False, **kwargs):
            return original(self, N, return_array=True, **kwargs)
        LayerKV.make_mask = array_mask
    model, _, _ = load_policy(model_name, LoraSpec.from_config(TrainConfig()))
    if not lora:
        without_lora(model)
    model.eval()
    mx.eval(model.parameters())
    scheduler = Scheduler(Engine(model), max_rows=max(rows, 1), max_prompt_tokens=16384, prefix_cache_bytes=1 << 30,
                          decode_chunk=decode_chunk)
    out = {}
    extra = np.random.default_rng(1)
    for run in range(repeats):
        first = timed_request(scheduler, prompt, tokens)
        follow = timed_request(scheduler, first.pop("sequence") + extra.integers(3, TOKEN_HIGH, 40).tolist(), tokens)
        follow.pop("sequence")
        out[f"run{run}"] = {"cold": first, "extends": follow}
    single = dict(scheduler.counts)
    out["counts_single"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in single.items()}
    if rows > 1:
        batch_steps(scheduler, rows, 256, 8)  # warm-up at this row count
        scheduler.counts.clear()
        out["batch"] = batch_steps(scheduler, rows, prompt_tokens=len(prompt), tokens=tokens)
        out["counts_batch"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in scheduler.counts.items()}
        engine_steps(scheduler.engine, rows, 256, 8)  # warm-up
        out["engine_batch"] = engine_steps(scheduler.engine, rows, prompt_tokens=len(prompt), tokens=tokens)
        out["engine_dense_batch"] = engine_dense_steps(scheduler.engine, rows, prompt_tokens=len(prompt), tokens=tokens)
    return out


def mlx_lm_runs(model: str, prompt: list[int], tokens: int, repeats: int, adapter: str | None = None) -> dict:
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    from artmlx.model.tiny import resolve_model

    lm, _ = load(resolve_model(model), adapter_path=adapter)
    out = {}
    for run in range(repeats):
        stamps = []
        started = time.perf_counter()
        for _, (token, _) in zip(range(tokens), generate_step(mx.array(prompt), lm, max_tokens=tokens,
                                                              sampler=make_sampler(temp=1.0))):
            stamps.append(time.perf_counter())
        gaps = np.diff(stamps)
        out[f"run{run}"] = {"first_token_ms": round((stamps[0] - started) * 1000, 2),
                            "total_ms": round((stamps[-1] - started) * 1000, 2),
                            "ms_per_token": round(float(gaps.mean()) * 1000, 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompt", type=int, default=1100)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["scheduler", "mlx_lm"])
    parser.add_argument("--no-lora", action="store_true", help="Serve the base layers alone (mlx_lm.server's graph).")
    parser.add_argument("--array-masks", action="store_true", help="Always pass attention an array mask.")
    parser.add_argument("--rows", type=int, default=32, help="Also time decode steps of this many rows together.")
    parser.add_argument("--decode-chunk", type=int, default=1, help="Scheduler.decode_chunk (decode steps per host read)")
    parser.add_argument("--mlx-lm-adapter", action="store_true",
                        help="Also time mlx-lm's step with artmlx's default LoRA layers loaded (random, nonzero), "
                             "as mlx_lm.server --adapter-path runs them.")
    parser.add_argument("--json")
    args = parser.parse_args()
    global TOKEN_HIGH  # token ids the model's vocabulary holds (the embedded model's has a few dozen)
    from artmlx.model.tiny import resolve_model

    config = json.loads((Path(resolve_model(args.model)) / "config.json").read_text())
    TOKEN_HIGH = min(TOKEN_HIGH, config.get("vocab_size") or config["text_config"]["vocab_size"])
    prompt = np.random.default_rng(0).integers(3, TOKEN_HIGH, args.prompt).tolist()
    report = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "model": args.model,
              "env": {k: v for k, v in os.environ.items() if k.startswith(("ARTMLX_", "MLX_"))}}
    if args.only != "mlx_lm":
        report["scheduler"] = scheduler_runs(args.model, prompt, args.tokens, args.repeats, not args.no_lora,
                                             not args.array_masks, args.rows, args.decode_chunk)
    if args.only != "scheduler":
        report["mlx_lm"] = mlx_lm_runs(args.model, prompt, args.tokens, args.repeats)
        if args.mlx_lm_adapter:
            import tempfile

            from serve_turns import write_adapter

            adapter = write_adapter(args.model, Path(tempfile.mkdtemp()) / "adapter")
            report["mlx_lm_adapter"] = mlx_lm_runs(args.model, prompt, args.tokens, args.repeats, str(adapter))
    print(json.dumps(report, indent=1), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
