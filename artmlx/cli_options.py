"""The options `train`, `learner` and `run` share, and the run configuration they make."""

from __future__ import annotations

from pathlib import Path

import click


def _load_train_config(config_file, overrides, settings, resume=False):
    """Config file (on --resume: the run's own config.toml), then flags and --set on top."""
    from .config import load_config, parse_override

    if resume and not config_file and overrides.get("out"):
        run_config = Path(overrides["out"]) / "config.toml"
        config_file = run_config if run_config.exists() else None

    values = dict(overrides)
    for item in settings:
        key, value = parse_override(item)
        values[key] = value
    return load_config(config_file, values)


def train_config(config_file, model, env, rollout, scenarios, eval_scenarios, steps, seed, out, resume, settings):
    """The run configuration of `train`, `learner` and `run` from their shared options."""
    fields = {"model": model, "env": env, "rollout": rollout, "scenarios": scenarios,
              "eval_scenarios": eval_scenarios, "steps": steps, "seed": seed, "out": out}
    config = _load_train_config(config_file, fields, settings, resume)
    if resume and not config.out:
        raise ValueError("--resume needs --out RUN_DIR (the run to continue)")
    return config


_train_options = [
    click.option("--config", "config_file", metavar="FILE|RECIPE",
                 help="TOML file with config fields, or a packaged recipe's name (`artmlx config --recipes`)."),
    click.option("--model", help="tiny (embedded, default), a packaged model (`artmlx model list`), a GGUF file, "
                                 "a Hugging Face id or a local model folder."),
    click.option("--env", help="Environment name (tictactoe, arithmetic) or module:Class."),
    click.option("--rollout", help="Agent instead of env: module:function or file.py:function, "
                                   "ART's `async def rollout(model, scenario) -> Trajectory` or "
                                   "`async def rollout(client, scenario)` with an openai client."),
    click.option("--scenarios", help="Scenarios for --rollout: a JSONL file or module:name of a list."),
    click.option("--eval-scenarios", help="Held-out scenarios a --rollout agent is evaluated on "
                                          "(JSONL or module:name); without them an agent run is not evaluated."),
    click.option("--steps", type=int, help="Number of GRPO updates."),
    click.option("--seed", type=int, help="Run seed."),
    click.option("--out", help="Run directory (default runs/<date>-<time>)."),
    click.option("--resume", is_flag=True, help="Continue the run in --out from its latest checkpoint."),
    click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                 help="Override any config field (TOML value syntax); repeatable. `artmlx config` lists fields."),
]


def train_options(function):
    """The shared run options of `train`, `learner` and `run`."""
    for option in reversed(_train_options):
        function = option(function)
    return function
