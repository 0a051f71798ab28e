"""A long run with actors stopped and restarted: does anything grow? Memory, open files, sockets, the ledger.

    python benchmarks/soak.py [--updates 1000] [--restart-every 100] [--signal term|kill] [--out DIR]
                              [--json FILE] [--set KEY=VALUE ...]

Starts `artmlx learner` and two `artmlx actor` processes (the defaults: the embedded model, tic-tac-toe, or
what --set says; evaluation off unless set), and every `--restart-every` updates stops one actor (in turn) with
the signal and starts a new one. The learner writes its resident memory, MLX's active and cached memory, and its
open files and sockets into every update's row (`artmlx/procstats.py`); the actors are read from /proc (Linux)
about once a second. Reports, after a warm-up (the first `--warmup` updates), each series' growth per 100
updates (least-squares slope, as a percentage of its mean), its min and max, and the final ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from artmlx.metrics import read_metrics  # noqa: E402
from artmlx.netutil import free_port  # noqa: E402
from artmlx.procstats import descriptors, resident_mb  # noqa: E402

LEARNER_SERIES = ("rss_mb", "mlx_active_mb", "mlx_cache_mb", "open_files", "open_sockets")


def start(args: list[str], log: Path) -> subprocess.Popen:
    handle = log.open("w")
    return subprocess.Popen([sys.executable, "-m", "artmlx", *args], stdout=handle, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=ROOT)


def growth(points: list[tuple[int, float]]) -> dict:
    """Least-squares slope of (update, value) per 100 updates, absolute and as a percentage of the mean."""
    if len(points) < 3:
        return {"points": len(points)}
    xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0
    return {"points": len(points), "first": ys[0], "last": ys[-1], "min": min(ys), "max": max(ys),
            "mean": round(mean_y, 2), "per_100_updates": round(100 * slope, 3),
            "per_100_updates_pct": round(100 * 100 * slope / mean_y, 3) if mean_y else 0.0}


class UpdateCounter:
    """Updates written to a metrics file so far, reading only what was appended since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset, self.count = path, 0, 0

    def updates(self) -> int:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:  # not written yet
            return self.count
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written waits for the next call
        self.offset += len(complete)
        self.count += sum(b'"reward_mean"' in line for line in complete.splitlines())
        return self.count


def train_rows(run: Path) -> list[dict]:
    try:
        return [row for row in read_metrics(run) if "reward_mean" in row]
    except (OSError, ValueError):  # not written yet, or a line being written
        return []


def soak(updates: int, restart_every: int, stop: signal.Signals, out: Path, settings: list[str],
         warmup: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    run = out / "run"
    address = f"tcp://127.0.0.1:{free_port()}"
    overrides = [item for setting in ["eval_every=0", *settings] for item in ("--set", setting)]
    learner = start(["learner", "--plain", "--bind", address, "--out", str(run), "--steps", str(updates), *overrides],
                    out / "learner.log")
    actors: dict[int, tuple[subprocess.Popen, dict]] = {}  # slot -> its process and that life's samples
    lives: list[dict] = []
    progress = UpdateCounter(run / "metrics.jsonl")

    def launch_actor(slot: int, life: int) -> None:
        name = f"soak-{slot}-{life}"
        lives.append({"name": name, "slot": slot, "samples": []})
        actors[slot] = (start(["actor", "--connect", address, "--name", name], out / f"{name}.log"), lives[-1])

    for slot in (0, 1):
        launch_actor(slot, 0)
    restarts, next_restart, started = 0, restart_every, time.perf_counter()
    try:
        while learner.poll() is None:
            time.sleep(1.0)
            step = progress.updates()
            for process, life in actors.values():
                rss, fds = resident_mb(process.pid), descriptors(process.pid)
                if process.poll() is None and rss is not None and fds is not None and step < updates:
                    life["samples"].append((step, rss, fds[0], fds[1]))
            if restart_every and step >= next_restart and step < updates:
                slot = restarts % 2
                process, _ = actors[slot]
                process.send_signal(stop)
                process.wait(timeout=120)
                restarts += 1
                launch_actor(slot, restarts)
                next_restart += restart_every
        for process, _ in actors.values():
            process.wait(timeout=120)
    finally:
        for process in [learner, *(p for p, _ in actors.values())]:
            if process.poll() is None:
                process.kill()
    if learner.returncode != 0:
        raise SystemExit(f"the learner exited with {learner.returncode}; see {out / 'learner.log'}")
    rows, final = train_rows(run), read_metrics(run)[-1]
    after = [row for row in rows if row["step"] > warmup]
    report = {"updates": updates, "restart_every": restart_every, "signal": stop.name, "warmup_updates": warmup,
              "actor_restarts": restarts, "wall_s": round(time.perf_counter() - started, 1),
              "learner": {key: growth([(r["step"], r[key]) for r in after if key in r]) for key in LEARNER_SERIES},
              # the process's own memory: MLX's buffer cache (capped at a quarter of the budget) taken out, since a
              # batch of a new size may grow it once by a step that is reuse, not a leak
              "learner_outside_cache_mb": growth([(r["step"], r["rss_mb"] - r["mlx_cache_mb"]) for r in after
                                                   if "rss_mb" in r]),
              "actors": [], "ledger": {key: final.get(key) for key in
                                       ("groups_sent", "groups_trained", "groups_stale", "groups_rejected",
                                        "groups_settled_earlier", "groups_in_flight", "groups_unaccounted",
                                        "run_groups_trained")}}
    for life in lives:
        samples = life["samples"][len(life["samples"]) // 5:]  # each actor's own warm-up left out
        report["actors"].append({"name": life["name"], "updates": [samples[0][0], samples[-1][0]] if samples else [],
                                 "rss_mb": growth([(s[0], s[1]) for s in samples]),
                                 "open_files": growth([(s[0], s[2]) for s in samples]),
                                 "open_sockets": growth([(s[0], s[3]) for s in samples])})
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--restart-every", type=int, default=100, help="Updates between actor restarts (0: none).")
    parser.add_argument("--signal", choices=("term", "kill"), default="term",
                        help="term: the actor leaves and reconciles its acks (the ledger stays exact); kill: it "
                             "dies at once, and its unacknowledged groups are counted as unaccounted.")
    parser.add_argument("--warmup", type=int, help="Updates left out before growth is measured (default: a tenth).")
    parser.add_argument("--out", type=Path, default=Path("runs/soak"))
    parser.add_argument("--json", type=Path, help="Report path (default OUT/summary.json).")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    stop = signal.SIGTERM if args.signal == "term" else signal.SIGKILL
    warmup = args.warmup if args.warmup is not None else max(5, args.updates // 10)
    report = soak(args.updates, args.restart_every, stop, args.out, args.settings, warmup)
    report["command"] = " ".join(["python benchmarks/soak.py", *sys.argv[1:]])
    report["cpu_count"] = os.cpu_count()
    for key, series in report["learner"].items():
        print(f"learner {key:<14} {series.get('first')} -> {series.get('last')}  per 100 updates "
              f"{series.get('per_100_updates')} ({series.get('per_100_updates_pct')} %)")
    outside = report["learner_outside_cache_mb"]
    print(f"learner rss - mlx cache  {outside.get('first')} -> {outside.get('last')}  per 100 updates "
          f"{outside.get('per_100_updates')} ({outside.get('per_100_updates_pct')} %)")
    print("ledger", report["ledger"])
    (args.json or args.out / "summary.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
