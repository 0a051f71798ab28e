"""The run directory: created or resumed, with the resolved configuration written into it."""

from __future__ import annotations

from pathlib import Path

from .config import TrainConfig, config_to_toml
from .learner.checkpoint import latest_checkpoint


def prepare_run_dir(config: TrainConfig, resume: bool) -> Path:
    run_dir = config.resolved_out()
    if resume:
        if latest_checkpoint(run_dir) is None:
            raise ValueError(f"--resume: no checkpoint under {run_dir}/checkpoints; check --out")
    elif (run_dir / "metrics.jsonl").exists():
        raise ValueError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    config.out = str(run_dir)
    (run_dir / "config.toml").write_text(config_to_toml(config))
    return run_dir
