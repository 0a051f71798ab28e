"""Metrics: one JSON object per line in `RUN_DIR/metrics.jsonl`, plus a short console line."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLog:
    def __init__(self, path: Path, echo: bool = True):
        self.path = Path(path)
        self.echo = echo
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> None:
        """On resume, drop rows written after the checkpoint's step (they will be redone)."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, row: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with self.path.open("a") as handle:
            handle.write(json.dumps(clean) + "\n")
        if self.echo:
            print(format_row(row), flush=True)


def format_row(row: dict) -> str:
    if "eval_score" in row:
        rates = " ".join(
            f"{k[5:-5]} {v:.2f}" for k, v in row.items() if k.startswith("eval_") and k.endswith("_rate")
            and k != "eval_truncated_rate"
        )
        return (f"eval  step {row['step']:4d}  score {row['eval_score']:.3f} "
                f"[{row['eval_score_ci_low']:.3f}, {row['eval_score_ci_high']:.3f}]  "
                f"n={row['eval_episodes']}  {rates}")
    if "reward_mean" not in row:
        return "final " + "  ".join(f"{k} {round(v, 1) if isinstance(v, float) else v}"
                                    for k, v in row.items() if k != "final")
    text = (f"train step {row['step']:4d}  v{row['policy_version']}  reward {row['reward_mean']:+.3f}  "
            f"groups {row['groups']} (flat {row['groups_zero_variance']})  tokens {row['tokens']}  "
            f"ratio {row['ratio_mean']:.4f}  clip {row['clip_frac']:.3f}  ")
    if "gen_seconds" in row:
        text += f"gen {row['gen_seconds']:.1f}s "
    if "staleness_max" in row:
        text += (f"stale<= {row['staleness_max']}  actors {row['actors']}  queue {row['queue_depth']}  "
                 f"idle {row['learner_idle_frac']:.0%}  ")
    return text + f"train {row['train_seconds']:.1f}s  t={row['time']:.0f}s"


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
