"""Pipeline vs synchronous loop: wall time to a target eval score, side by side in one run.

    python benchmarks/pipeline_speed.py [--actors 1 2] [--target 0.85] [--out DIR] [--set KEY=VALUE ...]

Runs `artmlx train` (the synchronous baseline), then `artmlx run --actors N` for each N (and with
--sync-again the baseline once more, to expose warm-up effects such as kernel caches), with the
same config and seed budget (same updates of groups_per_step x group_size games, same held-out
eval), one after another on this machine. For each it reports the eval curve, the training clock
and the process wall time (model loading included) at which the eval score first reached the
target, and the ratio sync / pipeline; it writes DIR/summary.json and DIR/plot.png (all curves on
one figure, `artmlx plot` style). The eval runs inside each learner's clock in both modes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.metrics import read_metrics  # noqa: E402
from artmlx.plot import plot_runs  # noqa: E402


def launch(args: list[str], log: Path) -> float:
    """Run `python -m artmlx ARGS` to completion with output in `log`; returns its wall time."""
    started = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run([sys.executable, "-m", "artmlx", *args], stdout=handle, stderr=subprocess.STDOUT,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"), check=False).returncode
    if code != 0:
        raise SystemExit(f"artmlx {' '.join(args)} failed with {code}; see {log}")
    return time.perf_counter() - started


def summarize(run_dir: Path, wall_s: float, target: float) -> dict:
    rows = read_metrics(run_dir)
    evals = [(r["step"], r["time"], r["eval_score"]) for r in rows if "eval_score" in r]
    reached = next(((step, clock) for step, clock, score in evals if score >= target), None)
    load_s = wall_s - rows[-1]["time"]  # process start, model load and shutdown outside the clock
    train = [r for r in rows if "reward_mean" in r]
    return {
        "run": run_dir.name, "wall_s": round(wall_s, 1), "clock_s": round(rows[-1]["time"], 1),
        "final_score": evals[-1][2] if evals else None, "evals": evals,
        "target_step": reached[0] if reached else None,
        "target_clock_s": round(reached[1], 1) if reached else None,
        "target_wall_s": round(reached[1] + load_s, 1) if reached else None,
        "staleness_mean": round(sum(r.get("staleness_mean", 0) for r in train) / max(1, len(train)), 2),
        "staleness_max": max((r.get("staleness_max", 0) for r in train), default=0),
        "learner_idle_frac": round(sum(r.get("learner_idle_frac", 0) for r in train) / max(1, len(train)), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, nargs="+", default=[2])
    parser.add_argument("--target", type=float, default=0.85, help="Eval score to reach (issue 1 asked >= 0.85).")
    parser.add_argument("--out", type=Path, default=Path("runs/pipeline-speed"))
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--skip-sync", action="store_true", help="Reuse OUT/sync from an earlier run.")
    parser.add_argument("--sync-again", action="store_true",
                        help="Run the sync baseline once more at the end (OUT/sync-again): on GPUs the first run "
                             "pays kernel compilation that later runs may find cached.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    overrides = [item for setting in args.settings for item in ("--set", setting)]
    results = []
    sync_dir = args.out / "sync"
    if not args.skip_sync:
        wall = launch(["train", "--out", str(sync_dir), *overrides], args.out / "sync.log")
        (args.out / "sync.wall").write_text(f"{wall}\n")
    results.append(summarize(sync_dir, float((args.out / "sync.wall").read_text()), args.target))
    for actors in args.actors:
        run_dir = args.out / f"run-{actors}-actors"
        wall = launch(["run", "--actors", str(actors), "--plain", "--out", str(run_dir), *overrides],
                      args.out / f"{run_dir.name}.log")
        results.append(summarize(run_dir, wall, args.target))
    if args.sync_again:
        run_dir = args.out / "sync-again"
        wall = launch(["train", "--out", str(run_dir), *overrides], args.out / "sync-again.log")
        results.append(summarize(run_dir, wall, args.target))
    sync = results[0]
    print(f"{'run':<18}{'final':>7}{'to ' + str(args.target) + ' (update, clock s, wall s)':>38}"
          f"{'total wall s':>14}{'speed-up':>10}{'staleness':>11}{'idle':>7}")
    for result in results:
        ratio = (f"{sync['target_wall_s'] / result['target_wall_s']:.2f}x"
                 if sync["target_wall_s"] and result["target_wall_s"] else "-")
        reached = (f"{result['target_step']}, {result['target_clock_s']}, {result['target_wall_s']}"
                   if result["target_step"] is not None else "not reached")
        print(f"{result['run']:<18}{result['final_score']:>7.3f}{reached:>38}{result['wall_s']:>14}{ratio:>10}"
              f"{result['staleness_mean']:>6} / {result['staleness_max']}{result['learner_idle_frac']:>7.0%}")
    summary = {"target": args.target, "settings": args.settings, "cpu_count": os.cpu_count(), "results": results}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    try:
        print(plot_runs([sync_dir] + [args.out / r["run"] for r in results[1:]], args.out / "plot.png"))
    except ImportError:  # e.g. a GPU box without matplotlib: `artmlx plot` the run dirs elsewhere
        print("matplotlib is not installed: no plot")


if __name__ == "__main__":
    main()
