"""Training with and without a misbehaving client: the eval curves side by side.

    python benchmarks/chaos_run.py [--steps 50] [--out runs/chaos] [--json FILE]

Each run is a learner and two honest actors (`artmlx learner`, `artmlx actor`, actors niced as
`artmlx run` does), the defaults otherwise (tiny model, tic-tac-toe, evaluation every 10 updates);
the chaos run adds the client of tests/test_chaos.py, which for the whole run sends poisoned groups,
groups beyond its window, status floods, hellos that never finish and heartbeats with junk stats.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.netutil import free_port  # noqa: E402
from artmlx.metrics import read_metrics  # noqa: E402
from tests.test_chaos import Chaos  # noqa: E402


def one_run(out: Path, steps: int, chaos: bool) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    address = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OPENBLAS_NUM_THREADS="1")
    python = [sys.executable, "-m", "artmlx"]
    started = time.perf_counter()
    learner = subprocess.Popen([*python, "learner", "--bind", address, "--out", str(out), "--steps", str(steps),
                                "--plain"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    actors = [subprocess.Popen([*python, "actor", "--connect", address, "--name", f"honest-{i}"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(10))
              for i in range(2)]
    client = Chaos(address) if chaos else None
    if client:
        client.start()
    output, _ = learner.communicate()
    if client:
        client.stop.set()
        client.join(30)
    for actor in actors:
        actor.wait(120)
    rows = read_metrics(out)
    final = rows[-1]
    return {"chaos": chaos, "wall_s": time.perf_counter() - started, "returncode": learner.returncode,
            "evals": [(r["step"], r["eval_score"]) for r in rows if "eval_score" in r],
            "train_time_s": [r["time"] for r in rows if "reward_mean" in r][-1],
            "chaos_rounds": client.rounds if client else 0, "chaos_acked": client.acked if client else 0,
            "final": {k: final.get(k) for k in ("groups_trained", "groups_rejected", "groups_stale",
                                                "groups_unaccounted", "messages_rejected", "stop_reason")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", default="runs/chaos")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    results = [one_run(Path(args.out) / name, args.steps, name == "chaos") for name in ("clean", "chaos")]
    for result in results:
        print(("chaos" if result["chaos"] else "clean") + ":", json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": shlex.join(sys.argv), "runs": results}, indent=1))


if __name__ == "__main__":
    main()
