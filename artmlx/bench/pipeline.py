"""`artmlx bench pipeline`: `artmlx train` against `artmlx run` with 1, 2, 3 actors, one after another.

Every run uses the same configuration (model, environment, `steps` updates of groups x G episodes),
without evaluations or intermediate checkpoints, so the clock measures rollouts and updates only.
From each run's metrics: seconds per update in the steady state (the first `warmup` updates are left
out: they pay model loading and kernel compilation), generated (policy) tokens/s, learner idle
fraction, staleness, and peak memory of the learner and of each actor. For `train` it also reports
the ideal overlap bound, (generation + training) / max(generation, training) per update: what a
pipeline that overlapped them perfectly would gain over the synchronous loop.

Actors are placed like `artmlx run` places them: `--actor-devices 1,2` gives actor i the i-th entry
(a GPU index, or `cpu`), `--learner-device 0` pins the learner; without them every process shares
the machine's one device. `--shared-too` also runs each actor count on the learner's device, for
the comparison in the same run; `--colocated` also runs each actor count as actor threads of the
learner's process (`artmlx run --placement colocated`: one copy of the base on one device).

`--balance` first tunes the synthetic workload so that generation and training take about the
same time in `train` (where the overlap bound is largest, ~2x): two short calibration runs of
`train` measure seconds of generation and of training per update, and the environment's answer
length (`user_tokens`, trained but never generated) is scaled until training time matches.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from ..metrics import read_metrics


def _launch(args: list[str], log: Path, env: dict | None = None) -> float:
    started = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run([sys.executable, "-m", "artmlx", *args], stdout=handle, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, check=False).returncode
    if code != 0:
        # The log may live in a scratch folder that is gone by the time anyone reads the error: quote its end.
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise RuntimeError(f"artmlx {' '.join(args)} failed with exit status {code}; its output is in {log}, "
                           f"ending:\n{tail}")
    return time.perf_counter() - started


def summarize(run_dir: Path, warmup: int) -> dict:
    rows = [r for r in read_metrics(run_dir) if "reward_mean" in r and not r.get("final")]
    final = next((r for r in read_metrics(run_dir) if r.get("final")), {})
    steady = rows[warmup:] if len(rows) > warmup + 1 else rows
    times = [b["time"] - a["time"] for a, b in zip(steady, steady[1:])] or [steady[0]["time"]]
    summary = {
        "updates": len(rows), "steady_updates": len(steady),
        "seconds_per_update": statistics.mean(times),
        "gen_tokens_per_s": statistics.mean(r["gen_tokens_per_s"] for r in steady),
        "train_seconds": statistics.mean(r["train_seconds"] for r in steady),
        "learner_idle_frac": statistics.mean(r.get("learner_idle_frac", 0.0) for r in steady),
        "staleness_mean": statistics.mean(r.get("staleness_mean", 0.0) for r in steady),
        "staleness_max": max(r.get("staleness_max", 0) for r in steady),
        "learner_peak_gb": max(r.get("peak_memory_gb", 0.0) for r in rows),
        "actors_peak_gb": final.get("actors_peak_memory_gb", []),
        "groups_stale": final.get("groups_stale", 0),
    }
    if rows and "gen_seconds" in rows[0]:  # the synchronous loop: generation and training one after the other
        gen = statistics.mean(r["gen_seconds"] for r in steady)
        train = summary["train_seconds"]
        summary.update(gen_seconds=gen, ideal_overlap_bound=(gen + train) / max(gen, train, 1e-9))
    return summary


def _env_setting(env_args: dict) -> str:
    return "env_args={" + ", ".join(f"{key} = {value}" for key, value in env_args.items()) + "}"


def balance(out: Path, settings: list[str], env_args: dict, learner_env: dict, echo=print,
            rounds: int = 2, steps: int = 3) -> dict:
    """`env_args` with `user_tokens` scaled so that `train` spends as long training as generating."""
    env_args = dict(env_args)
    turns = int(env_args.get("turns", 2))
    if turns < 2:
        raise ValueError("--balance scales the environment's answers between turns: it needs turns >= 2")
    for attempt in range(rounds):
        run_dir = out / f"balance-{attempt}"
        args = ["train", "--out", str(run_dir), "--steps", str(steps), "--set", "eval_every=0",
                "--set", f"checkpoint_every={steps}", *[x for s in [*settings, _env_setting(env_args)] for x in ("--set", s)]]
        _launch(args, out / f"balance-{attempt}.log", learner_env)
        rows = [r for r in read_metrics(run_dir) if "reward_mean" in r][1:]  # the first update compiles
        gen = statistics.mean(r["gen_seconds"] for r in rows)
        train = statistics.mean(r["train_seconds"] for r in rows)
        tokens = statistics.mean(r["tokens"] for r in rows)
        config = tomllib.loads((run_dir / "config.toml").read_text())
        episodes = config["groups_per_step"] * config["group_size"]
        # Training time grows with the tokens trained; add (or remove) environment tokens until it matches generation.
        extra = tokens * (gen / train - 1) / max(episodes * (turns - 1), 1)
        echo(f"balance {attempt}: user_tokens {env_args.get('user_tokens', 32)}: generation {gen:.2f} s, training "
             f"{train:.2f} s per update")
        env_args["user_tokens"] = max(8, int(env_args.get("user_tokens", 32) + extra))
    echo(f"balanced workload: {env_args}")
    return env_args


def run(out: Path, actor_counts: list[int], steps: int, settings: list[str], actor_devices: str = "",
        learner_device: str = "", warmup: int = 2, env_args: dict | None = None, tune: bool = False,
        shared_too: bool = False, colocated: bool = False, echo=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for earlier in sorted(out.iterdir()):  # the folder is the benchmark's own: an earlier run's folders go
        if earlier.name.startswith(("train", "run-", "balance")):
            shutil.rmtree(earlier) if earlier.is_dir() else earlier.unlink()
    learner_env = {"CUDA_VISIBLE_DEVICES": learner_device} if learner_device and learner_device != "cpu" else {}
    if tune:
        env_args = balance(out, settings, env_args or {}, learner_env, echo)
    if env_args:
        settings = [*settings, _env_setting(env_args)]
    overrides = ["--steps", str(steps), "--set", "eval_every=0", "--set", f"checkpoint_every={steps}"]
    overrides += [item for setting in settings for item in ("--set", setting)]
    results = {"steps": steps, "settings": settings, "actor_devices": actor_devices, "learner_device": learner_device,
               "runs": []}
    wall = _launch(["train", "--out", str(out / "train"), *overrides], out / "train.log", learner_env)
    sync = {"run": "train", "wall_s": wall, **summarize(out / "train", warmup)}
    results["runs"].append(sync)
    echo(f"train: {sync['seconds_per_update']:.2f} s/update (generation {sync['gen_seconds']:.2f} s, training "
         f"{sync['train_seconds']:.2f} s; ideal overlap bound {sync['ideal_overlap_bound']:.2f}x), "
         f"{sync['gen_tokens_per_s']:,.0f} gen tok/s, peak {sync['learner_peak_gb']:.2f} GB")
    placements = [(actors, actor_devices, "processes") for actors in actor_counts]
    if shared_too and actor_devices:
        placements += [(actors, "", "processes") for actors in actor_counts]
    if colocated:  # actor threads in the learner's process, sharing its base weights, on the learner's device
        placements += [(actors, "", "colocated") for actors in actor_counts]
    for actors, devices, placement in placements:
        name = f"run-{actors}" + (f"-on-{devices.replace(',', '-')}" if devices else
                                  "-colocated" if placement == "colocated" else "-shared")
        args = ["run", "--actors", str(actors), "--placement", placement, "--plain", "--out", str(out / name), *overrides]
        if devices:
            args += ["--actor-devices", devices]
        if learner_device and placement == "processes":
            args += ["--learner-device", learner_device]
        # a colocated run is one process, placed where `train` was
        wall = _launch(args, out / f"{name}.log", learner_env if placement == "colocated" else None)
        result = {"run": name, "actors": actors, "actor_devices": devices, "placement": placement, "wall_s": wall,
                  **summarize(out / name, warmup)}
        result["speedup_vs_train"] = sync["seconds_per_update"] / result["seconds_per_update"]
        result["fraction_of_ideal"] = result["speedup_vs_train"] / sync["ideal_overlap_bound"]
        results["runs"].append(result)
        where = f"on {devices}" if devices else "colocated" if placement == "colocated" else "sharing the learner device"
        echo(f"run --actors {actors} {where}: "
             f"{result['seconds_per_update']:.2f} s/update = {result['speedup_vs_train']:.2f}x "
             f"train ({result['fraction_of_ideal']:.2f} of the ideal overlap bound), "
             f"{result['gen_tokens_per_s']:,.0f} gen tok/s, learner idle {result['learner_idle_frac']:.0%}, "
             f"staleness {result['staleness_mean']:.2f} (max {result['staleness_max']}), "
             f"peak learner {result['learner_peak_gb']:.2f} GB, actors {result['actors_peak_gb']} GB")
    return results
