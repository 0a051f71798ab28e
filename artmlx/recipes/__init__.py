"""Recipes: config files shipped with artmlx, taken by name (`--config smollm2-math`).

Each recipe is a TOML file of config fields beside this module, measured on the model and task it names
(its header comment says what it reached and how to repeat the measurement). Flags and `--set` still apply
on top of a recipe, as on top of any config file.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def recipe_names() -> list[str]:
    return sorted(entry.name[:-len(".toml")] for entry in files(__package__).iterdir() if entry.name.endswith(".toml"))


def recipe_path(name: str) -> Path | None:
    """The packaged recipe called `name`, or None."""
    entry = files(__package__) / f"{name}.toml"
    return Path(str(entry)) if name in recipe_names() else None


def recipe_summary(name: str) -> str:
    """The first comment line of a recipe: what it trains."""
    for line in recipe_path(name).read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""
