"""`artmlx bench ...`: the benchmark commands (each measures its comparisons side by side in one process).

Heavy imports happen inside the commands, so `artmlx --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path

import click


def _fail(error: Exception) -> None:
    raise click.ClickException(str(error))


@click.group()
def bench() -> None:
    """Speed and memory benchmarks, each comparison side by side in one process (benchmarks/RESULTS.md)."""


def _bench_options(default_model: str):
    def wrap(function):
        for option in reversed([
            click.option("--model", default=default_model, show_default=True,
                         help="A synth architecture (qwen2.5-0.5b, llama-3.2-1b, ...: random weights, made once), "
                              "tiny, a hub id or a model folder."),
            click.option("--quick", is_flag=True, help="Small shapes: minutes on a laptop CPU."),
            click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the report as JSON."),
            click.option("--memory-budget-gb", type=float, default=0.0, help="Memory budget (0 = the default rule)."),
        ]):
            function = option(function)
        return function
    return wrap


def _report(kind: str, json_path, measure) -> None:
    from .report import header, write

    try:
        report = {**header(), "benchmark": kind}
        report["results"] = measure()
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        _fail(error)
    write(report, json_path)
    if json_path:
        click.echo(f"wrote {json_path}")


@bench.command(name="rollout")
@_bench_options("qwen2.5-0.5b")
@click.option("--group-sizes", default="4,8,16", show_default=True, help="Group sizes G to measure.")
@click.option("--prompt", type=int, help="Prompt tokens (default 256, quick 64).")
@click.option("--reply", type=int, help="Reply tokens (default 256, quick 32).")
@click.option("--rows", type=int, default=0, help="Engine rows per batch (default: the memory rule's).")
@click.option("--sequential", type=int, default=2, show_default=True, help="Samples generated one at a time.")
@click.option("--prefill-rows", type=int, help="Rows for the prefill memory comparison (default 64, quick 16; 0 skips).")
@click.option("--rows-sweep", default="", help="Comma-separated engine batch sizes for a decode throughput sweep.")
def bench_rollout(model, quick, json_path, memory_budget_gb, group_sizes, prompt, reply, rows, sequential,
                  prefill_rows, rows_sweep):
    """Generation tokens/s: our engine vs sequential mlx_lm.generate vs mlx_lm.batch_generate."""
    from . import rollout
    from .models import bench_model

    sizes = [int(g) for g in group_sizes.split(",")] if not quick else [8]
    _report("rollout", json_path, lambda: rollout.run(
        bench_model(model), sizes, prompt or (64 if quick else 256), reply or (32 if quick else 256), rows,
        sequential, 16 if quick and prefill_rows is None else (64 if prefill_rows is None else prefill_rows),
        [int(r) for r in rows_sweep.split(",") if r], memory_budget_gb, echo=click.echo))


@bench.command(name="learner")
@_bench_options("qwen2.5-0.5b")
@click.option("--groups", type=int, help="Groups per update (default 16, quick 4).")
@click.option("--group-size", type=int, default=8, show_default=True)
@click.option("--prompt", type=int, help="Prompt tokens (default 256, quick 64).")
@click.option("--reply", type=int, help="Reply tokens (default 256, quick 32).")
@click.option("--batch-tokens", type=int, default=0, help="Padded tokens per micro-batch (default: the memory rule's).")
@click.option("--rank", type=int, default=16, show_default=True, help="LoRA rank.")
@click.option("--plain-only", is_flag=True, help="Skip the compiled steps (a hybrid's recurrence compiles for minutes).")
def bench_learner(model, quick, json_path, memory_budget_gb, groups, group_size, prompt, reply, batch_tokens, rank,
                  plain_only):
    """Trained tokens/s: our GRPO step vs a plain mlx-lm LoRA step, compiled and not, with peak memory."""
    from . import learner
    from .models import bench_model

    _report("learner", json_path, lambda: learner.run(
        bench_model(model), groups or (4 if quick else 16), group_size, prompt or (64 if quick else 256),
        reply or (32 if quick else 256), batch_tokens, memory_budget_gb, rank, echo=click.echo,
        compiled=(False,) if plain_only else (False, True)))


@bench.command(name="protocol")
@click.option("--quick", is_flag=True, help="Fewer rounds.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the report as JSON.")
def bench_protocol(quick, json_path):
    """Codec, loopback throughput, adapter fan-out (plain / CURVE, float32 / bfloat16), adapter sizes."""
    from . import protocol

    _report("protocol", json_path, lambda: protocol.run(quick, echo=click.echo))


@bench.command(name="pipeline")
@_bench_options("tiny")
@click.option("--actors", "actor_counts", default="1,2,3", show_default=True, help="Actor counts to run.")
@click.option("--steps", type=int, help="Updates per run (default 12, quick 5).")
@click.option("--actor-devices", default="", help="As for `artmlx run`: a GPU index or cpu per actor.")
@click.option("--learner-device", default="", help="As for `artmlx run`.")
@click.option("--env", default="", help="Environment (default: synthetic for a real-size model, tictactoe for tiny).")
@click.option("--env-arg", "env_arg_items", multiple=True, metavar="KEY=VALUE",
              help="Environment option, e.g. prompt_tokens=256 (synthetic: prompt_tokens, turns, user_tokens).")
@click.option("--balance", is_flag=True, help="Tune the synthetic env's user_tokens so train generates and trains "
                                               "for about the same time (the largest overlap bound).")
@click.option("--shared-too", is_flag=True, help="With --actor-devices, also run the actors on the learner's device.")
@click.option("--colocated", is_flag=True, help="Also run each actor count colocated: actor threads in the "
              "learner's process sharing its base weights (`artmlx run --placement colocated`).")
@click.option("--out", default="runs/bench-pipeline", show_default=True, help="Folder for the runs (an earlier bench's runs in it are replaced).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Config overrides for every run.")
def bench_pipeline(model, quick, json_path, memory_budget_gb, actor_counts, steps, actor_devices, learner_device,
                   env, env_arg_items, balance, shared_too, colocated, out, settings):
    """`artmlx train` vs `artmlx run` with 1, 2, 3 actors: tokens/s, learner idle, staleness, memory."""
    from . import pipeline
    from .models import bench_model
    from ..config import parse_value

    path = bench_model(model)
    env = env or ("tictactoe" if model == "tiny" else "synthetic")
    base = [f"model={json.dumps(path)}", f"env={json.dumps(env)}"]
    if memory_budget_gb:
        base.append(f"memory_budget_gb={memory_budget_gb}")
    env_args = {}
    for item in env_arg_items:
        key, sep, raw = item.partition("=")
        if not sep:
            _fail(ValueError(f"--env-arg {item!r} must look like key=value"))
        env_args[key.strip()] = parse_value(raw)
    if balance and env != "synthetic":
        _fail(ValueError("--balance tunes the synthetic environment; use --env synthetic"))
    _report("pipeline", json_path, lambda: pipeline.run(
        Path(out), [int(a) for a in actor_counts.split(",")], steps or (5 if quick else 12), base + list(settings),
        actor_devices, learner_device, warmup=1 if quick else 2, env_args=env_args or None, tune=balance,
        shared_too=shared_too, colocated=colocated, echo=click.echo))
