"""Metrics: every row goes to each of the run's sinks.

A row is one update, one evaluation or the run's final counts (a dict with `step`). Sinks
(`MetricsSink`): `JsonlSink` writes `RUN_DIR/metrics.jsonl` (one JSON object per line: what
`artmlx plot`, the benchmarks and resumes read), `ConsoleSink` a short line per row, and
`WandbSink` logs to Weights & Biases when `wandb_project` is set (the optional extra
`artmlx[wandb]`; `WANDB_MODE=offline` logs to disk without a network, to sync later). A run
without a sink has `NullSink`'s, which takes rows and does nothing.
"""

from __future__ import annotations

import json
import math
import numbers
import uuid
from pathlib import Path
from typing import Protocol


class MetricsSink(Protocol):
    def write(self, row: dict) -> None: ...

    def close(self) -> None: ...


class NullSink:
    def write(self, row: dict) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlSink:
    def __init__(self, path: Path):
        self.path = Path(path)
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

    def close(self) -> None:
        pass


class ConsoleSink:
    def write(self, row: dict) -> None:
        print(format_row(row), flush=True)

    def close(self) -> None:
        pass


class WandbSink:
    """One W&B run per artmlx run: its id is kept in the run directory, so `--resume` continues it.

    Update and evaluation rows are logged at their `step` (numbers only; an outcome count dict is
    flattened to `outcomes/NAME`); the final row goes to the run's summary."""

    def __init__(self, project: str, run_dir: Path, config: dict, name: str = ""):
        wandb = wandb_module()
        id_file = Path(run_dir) / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:16]
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(project=project, name=name or Path(run_dir).name, id=run_id, resume="allow",
                              config=config, dir=str(run_dir))

    def write(self, row: dict) -> None:
        values = numeric(row)
        if row.get("final"):
            self.run.summary.update(values)
            return
        step = values.pop("step", None)
        self.run.log(values, step=int(step) if step is not None else None)

    def close(self) -> None:
        self.run.finish()


def wandb_module():
    try:
        import wandb
    except ImportError as error:
        raise ValueError("wandb_project is set, but the wandb package is not installed: "
                         "pip install 'artmlx[wandb]' (or unset wandb_project)") from error
    return wandb


def check_sinks(config) -> None:
    """Before a run loads anything: the sinks its settings ask for can be opened."""
    if config.wandb_project:
        wandb_module()


def numeric(row: dict, prefix: str = "") -> dict:
    """The row's finite numbers (booleans as 0/1), nested dicts flattened to `key/inner`."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(numeric(value, f"{prefix}{key}/"))
        elif isinstance(value, bool):
            out[prefix + key] = int(value)
        elif isinstance(value, numbers.Real) and math.isfinite(value):
            out[prefix + key] = value
    return out


class MetricsLog:
    """The run's sinks: `write` hands a row to each in turn; `close` ends them (W&B's run)."""

    def __init__(self, sinks: list[MetricsSink]):
        self.sinks = sinks or [NullSink()]

    def truncate_after(self, step: int) -> None:
        for sink in self.sinks:
            if isinstance(sink, JsonlSink):
                sink.truncate_after(step)

    def write(self, row: dict) -> None:
        for sink in self.sinks:
            sink.write(row)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_metrics(run_dir: Path, config, echo: bool = True) -> MetricsLog:
    """The sinks a run writes to: its metrics.jsonl, the console when `echo`, W&B with `wandb_project`."""
    import dataclasses

    sinks: list[MetricsSink] = [JsonlSink(Path(run_dir) / "metrics.jsonl")]
    if echo:
        sinks.append(ConsoleSink())
    if config.wandb_project:
        sinks.append(WandbSink(config.wandb_project, run_dir, dataclasses.asdict(config), config.wandb_run_name))
    return MetricsLog(sinks)


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
            f"groups {row['groups']} (flat {row['groups_zero_variance']}"
            + (f", {row['groups_flat_skipped']} flat skipped" if row.get("groups_flat_skipped") else "")
            + f")  tokens {row['tokens']}  "
            f"ratio {row['ratio_mean']:.4f}  clip {row['clip_frac']:.3f}  ")
    if "hinted_token_frac" in row:  # directive hints: hinted share, teacher-student log-ratio, each term's weight
        text += (f"hints {row['hinted_token_frac']:.2f} (logratio {row['hint_logratio_mean']:+.2f}, |A| reward "
                 f"{row['advantage_reward_abs']:.2f} "
                 + (f"top-K KL {row['hint_topk_kl']:.3f}" if "hint_topk_kl" in row else f"hint {row['advantage_hint_abs']:.2f}")
                 + ", teacher "
                 f"{row.get('teacher_seconds', 0.0):.1f}s)  ")
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
