"""Gradient checkpointing: the learner's peak memory and step time with and without it, side by side.

    python benchmarks/grad_checkpoint.py [--model FOLDER | --arch SYNTH] [--groups 1 --group-size 2 --prompt 512
                                         --reply 512] [--budget-gb GB] [--settings off,on] [--json FILE]

One model, the same groups (random tokens: a shared prompt and a policy reply per episode, as
`artmlx bench learner` makes them), a warm-up update then a measured one for `grad_checkpoint` "off"
and "on"; MLX's peak-memory counter and wall seconds for each, with the memory plan's per-token
estimate beside. Without `--model` it writes the Qwen2.5-0.5B shape with 8 of its 24 layers (real
151,936-token vocabulary, random 4-bit weights) so that it runs on a CPU. With `--budget-gb` the
learner runs as it does in a run with that budget: MLX's memory limit set to it, micro-batches of the
memory plan's size for each setting (otherwise the whole update is one micro-batch).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.bench.learner import make_groups  # noqa: E402
from artmlx.config import load_config  # noqa: E402
from artmlx.engine.memory import GB, ModelShape, apply_limits, plan_for, resolve_budget  # noqa: E402
from artmlx.learner.settings import trainer_settings  # noqa: E402
from artmlx.learner.trainer import GRPOTrainer  # noqa: E402
from artmlx.model.backend import prefer_mlx_attention  # noqa: E402
from artmlx.model.families import vocab_size  # noqa: E402
from artmlx.model.policy import LoraSpec, load_policy  # noqa: E402


def default_model() -> str:
    from artmlx.model.synth import synthesize

    out = Path(tempfile.gettempdir()) / "artmlx-bench-qwen-8layers"
    if not (out / "config.json").exists():
        synthesize("qwen2.5-0.5b", out, shape_overrides={"num_hidden_layers": 8})
    return str(out)


def measure(model_path: str, setting: str, args) -> dict:
    mx.random.seed(0)  # the same fresh adapters for both settings
    model, _, _ = load_policy(model_path, LoraSpec.from_config(load_config(None, {})))
    groups = make_groups(args.groups, args.group_size, args.prompt, args.reply, vocab_size(model))
    for group in groups:
        for index, episode in enumerate(group.episodes):
            episode.reward = float(index % 2)
    plan = None
    if args.budget_gb:
        apply_limits(resolve_budget(args.budget_gb))
        plan = plan_for(model, resolve_budget(args.budget_gb))
    batch_tokens = 0 if plan else 1 << 20
    trainer = GRPOTrainer(model, trainer_settings({"grad_checkpoint": setting, "max_batch_tokens": batch_tokens}),
                          plan)
    trainer.train_step(groups)  # warm-up
    mx.synchronize()
    mx.reset_peak_memory()
    started = time.perf_counter()
    metrics = trainer.train_step(groups)
    mx.synchronize()
    seconds = time.perf_counter() - started
    length = args.prompt + args.reply
    shape = ModelShape.of(model)
    estimate = shape.train_bytes_per_token(length, args.reply / length, "cpu" if mx.default_device() == mx.cpu else "gpu",
                                           setting == "on")
    return {"peak_gb": round(mx.get_peak_memory() / GB, 3), "seconds": round(seconds, 2),
            "grad_norm": metrics["grad_norm"], "checkpointed": metrics["grad_checkpointed"],
            "plan_mb_per_token": round(estimate / 2**20, 2), "tokens": metrics["tokens_trained"],
            "batch_tokens": trainer.batch_tokens([e for g in groups for e in g.episodes])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--arch", help="a synth architecture (written once into the benchmark cache)")
    parser.add_argument("--budget-gb", type=float, default=0.0)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--reply", type=int, default=512)
    parser.add_argument("--settings", default="off,on", help="Which to measure (\"on\" alone where \"off\" cannot fit).")
    parser.add_argument("--json")
    args = parser.parse_args()
    prefer_mlx_attention()
    if args.arch:
        from artmlx.bench.models import bench_model
        args.model = bench_model(args.arch)
    model = args.model or default_model()
    report = {"command": shlex.join(sys.argv), "model": model, "device": str(mx.default_device())}
    for setting in args.settings.split(","):
        report[setting] = measure(model, setting, args)
        print(setting, report[setting], flush=True)
    if "on" in report and "off" in report:
        report["peak_ratio_on_off"] = round(report["on"]["peak_gb"] / report["off"]["peak_gb"], 3)
        report["time_ratio_on_off"] = round(report["on"]["seconds"] / report["off"]["seconds"], 3)
        print(json.dumps({k: report[k] for k in ("peak_ratio_on_off", "time_ratio_on_off")}))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
