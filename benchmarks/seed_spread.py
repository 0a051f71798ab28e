"""How much the final score of the default run depends on the seed: `artmlx train` and `artmlx run` over N seeds.

    python benchmarks/seed_spread.py [--seeds 0-9] [--parallel 1] [--out DIR] [--json FILE] [--set KEY=VALUE ...]

For each seed, `artmlx train --seed S` (the synchronous loop, bit-reproducible) and `artmlx run --seed S` (the
learner and its actors) with the defaults (or the same --set overrides), each run to its last update. Reports,
per command, the eval score at the last update for every seed with its mean, min and max, the ledger of each
`run` (sent, trained, stale, unaccounted) and its staleness. `--parallel K` runs K commands at once (on a
machine with cores to spare; on 2 cores keep 1: concurrent runs change `run`'s timing and so its staleness).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.metrics import read_metrics  # noqa: E402


def seeds_of(text: str) -> list[int]:
    """`0-9` or `0,3,7`."""
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(part) for part in text.split(",")]


def launch(command: str, seed: int, out: Path, overrides: list[str]) -> dict:
    """Run `artmlx COMMAND --seed SEED` to its end; its final eval score, ledger and wall time."""
    run_dir = out / f"{command}-seed{seed}"
    extra = ["--plain"] if command == "run" else []
    started = time.perf_counter()
    with (out / f"{run_dir.name}.log").open("w") as log:
        code = subprocess.run([sys.executable, "-m", "artmlx", command, "--seed", str(seed), "--out", str(run_dir),
                               *extra, *overrides], stdout=log, stderr=subprocess.STDOUT, check=False,
                              env=dict(os.environ, PYTHONUNBUFFERED="1")).returncode
    wall = time.perf_counter() - started
    if code != 0:
        return {"command": command, "seed": seed, "exit_code": code, "log": str(out / f"{run_dir.name}.log")}
    rows = read_metrics(run_dir)
    evals = [(r["step"], r["eval_score"]) for r in rows if "eval_score" in r]
    train = [r for r in rows if "reward_mean" in r]
    final = rows[-1] if rows and rows[-1].get("final") else {}
    result = {"command": command, "seed": seed, "exit_code": 0, "wall_s": round(wall, 1),
              "first_score": evals[0][1] if evals else None, "final_step": evals[-1][0] if evals else None,
              "final_score": evals[-1][1] if evals else None,
              "staleness_mean": round(statistics.fmean(r.get("staleness_mean", 0) for r in train), 3) if train else None}
    for key in ("groups_sent", "groups_trained", "groups_stale", "groups_unaccounted"):
        if key in final:
            result[key] = final[key]
    return result


def summary(results: list[dict]) -> dict:
    scores = [r["final_score"] for r in results if r.get("final_score") is not None]
    if not scores:
        return {"runs": len(results), "failed": len(results)}
    return {"runs": len(results), "failed": len(results) - len(scores), "mean": round(statistics.fmean(scores), 4),
            "min": min(scores), "max": max(scores), "stdev": round(statistics.stdev(scores), 4) if len(scores) > 1 else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=seeds_of, default=seeds_of("0-9"))
    parser.add_argument("--commands", default="train,run", help="Which commands, comma-separated.")
    parser.add_argument("--parallel", type=int, default=1, help="Commands run at once.")
    parser.add_argument("--out", type=Path, default=Path("runs/seed-spread"))
    parser.add_argument("--json", type=Path, help="Report path (default OUT/summary.json).")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    overrides = [item for setting in args.settings for item in ("--set", setting)]
    commands = [c for c in args.commands.split(",") if c]
    for command in commands:
        if command not in ("train", "run"):
            raise SystemExit(f"--commands takes train and run, got {command!r}")
    jobs = [(command, seed) for seed in args.seeds for command in commands]
    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        results = list(pool.map(lambda job: launch(*job, args.out, overrides), jobs))
    report = {"command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "settings": args.settings,
              "seeds": args.seeds, "parallel": args.parallel, "cpu_count": os.cpu_count(),
              "wall_s": round(time.perf_counter() - started, 1),
              "summary": {c: summary([r for r in results if r["command"] == c]) for c in commands},
              "results": results}
    for command in commands:
        line = " ".join(f"{r['final_score']:.3f}" if r.get("final_score") is not None else "failed"
                        for r in results if r["command"] == command)
        print(f"{command:<6} {line}  {report['summary'][command]}")
    (args.json or args.out / "summary.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
