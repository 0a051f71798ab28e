"""Full trainer checkpoints, written atomically.

`RUN_DIR/checkpoints/step_000020/` holds the adapters in mlx-lm format, the AdamW state
(`trainer_state.safetensors`), and `trainer_state.json` (step, policy version and any extra state
the caller passes, e.g. the run seed or ids of consumed groups). MLX's global RNG state cannot be
set from Python, so the training loop re-seeds it from (seed, step) at every update: the seed and
step in this file are the RNG state. A checkpoint is written into a
hidden temporary folder, fsynced and renamed into place, so a crash never leaves a half-written one;
only folders named `step_*` count. Re-saving a step keeps the old folder until the new one is in.

Two layouts name the step folders: artmlx's runs use `step_000020` (`RUN_LAYOUT`), and the ART
backend uses ART's own `0020` (`ART_LAYOUT`, what `art.utils.get_model_step` reads). Folders sort
by step number, not by name.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..model.policy import LoraSpec, save_adapters, set_adapter_weights, ADAPTER_WEIGHTS
from .trainer import GRPOTrainer

STATE_JSON = "trainer_state.json"
STATE_ARRAYS = "trainer_state.safetensors"


@dataclass(frozen=True)
class Layout:
    """How step folders are named: `prefix` then the step, zero-padded to `width` digits."""

    prefix: str
    width: int

    def name(self, step: int) -> str:
        return f"{self.prefix}{step:0{self.width}d}"

    def step_of(self, name: str) -> int | None:
        digits = name[len(self.prefix):] if name.startswith(self.prefix) else ""
        return int(digits) if digits.isdigit() else None


RUN_LAYOUT = Layout("step_", 6)
ART_LAYOUT = Layout("", 4)


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, trainer: GRPOTrainer, spec: LoraSpec, base_model: str,
                    extra: dict | None = None, keep: int = 2, layout: Layout = RUN_LAYOUT) -> Path:
    """Write, fsync, rename into place; the previous checkpoint of this step (if any) goes only after.

    A failure (e.g. a full disk) removes the partial folder and re-raises, leaving every earlier
    checkpoint loadable."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = layout.name(trainer.step)
    final, staging, replaced = root / name, root / f".tmp_{name}", root / f".old_{name}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        save_adapters(trainer.model, staging, spec, base_model)
        arrays = {f"optimizer.{k}": v for k, v in tree_flatten(trainer.optimizer.state)}
        mx.save_safetensors(str(staging / STATE_ARRAYS), arrays)
        state = {"step": trainer.step, "policy_version": trainer.policy_version, "extra": extra or {}}
        (staging / STATE_JSON).write_text(json.dumps(state, indent=2))
        for item in [*staging.iterdir(), staging]:
            _fsync(item)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, RuntimeError):  # MLX reports a failed write (a full disk) as a RuntimeError
            raise OSError(errno.EIO, f"checkpoint {final.name} could not be written: {error}") from error
        raise
    if final.exists():  # the same step saved again: keep the old one until the new one is in place
        shutil.rmtree(replaced, ignore_errors=True)
        os.replace(final, replaced)
    os.replace(staging, final)
    _fsync(root)
    shutil.rmtree(replaced, ignore_errors=True)
    for old in list_checkpoints(run_dir, layout)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_run_state(run_dir: Path, trainer: GRPOTrainer, spec: LoraSpec, base_model: str, extra: dict,
                   keep: int = 2) -> Path:
    """What both training commands save at a checkpoint: the checkpoint (`save_checkpoint`), then the run's
    `adapters/` folder, the latest adapters as `artmlx serve --adapters` and ART's backend load them."""
    path = save_checkpoint(run_dir, trainer, spec, base_model, extra, keep=keep)
    save_adapters(trainer.model, Path(run_dir) / "adapters", spec, base_model)
    return path


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(run_dir: Path, layout: Layout = RUN_LAYOUT) -> list[Path]:
    """The complete checkpoints, oldest step first."""
    root = checkpoint_dir(run_dir)
    if not root.exists():
        return []
    for replaced in root.glob(".old_*"):  # a crash between the two renames of a re-save
        final = root / replaced.name.removeprefix(".old_")
        if layout.step_of(final.name) is not None and not final.exists():
            os.replace(replaced, final)
    steps = {p: layout.step_of(p.name) for p in root.iterdir() if p.is_dir()}
    return sorted((p for p, step in steps.items() if step is not None), key=steps.get)


def checkpoint_step(path: Path, layout: Layout = RUN_LAYOUT) -> int:
    return layout.step_of(Path(path).name)


def latest_checkpoint(run_dir: Path, layout: Layout = RUN_LAYOUT) -> Path | None:
    found = list_checkpoints(run_dir, layout)
    return found[-1] if found else None


def load_checkpoint(path: Path, trainer: GRPOTrainer) -> dict:
    """Restore adapters, optimizer, step and policy version; returns the extra state."""
    path = Path(path)
    set_adapter_weights(trainer.model, dict(mx.load(str(path / ADAPTER_WEIGHTS))))
    arrays = mx.load(str(path / STATE_ARRAYS))
    optimizer_items = [(k[len("optimizer."):], v) for k, v in arrays.items() if k.startswith("optimizer.")]
    trainer.optimizer.state = tree_unflatten(optimizer_items)
    state = json.loads((path / STATE_JSON).read_text())
    trainer.step = state["step"]
    trainer.policy_version = state["policy_version"]
    mx.eval(trainer.model.parameters(), trainer.optimizer.state)
    return state.get("extra", {})
