"""Benchmark models: an architecture name is synthesized once (random weights) into the cache."""

from __future__ import annotations

from pathlib import Path

from ..model.synth import ARCHITECTURES, synthesize
from ..model.tiny import cache_root


def bench_model(name: str) -> str:
    """A synth architecture name becomes its cached folder (written on first use); anything else passes through."""
    if name.lower() not in ARCHITECTURES:
        return name
    folder = cache_root() / "synth" / name.lower()
    if not (folder / "config.json").exists():
        print(f"writing a random-weight {name} model to {folder} (once)", flush=True)
        synthesize(name, folder)
    return str(folder)


def model_label(name: str) -> str:
    return Path(name).name if Path(name).exists() else name
