"""What `artmlx eval` does: load base + adapters, play held-out episodes, summarise.

Settings not given on the command line come from the run that wrote the adapters (its
`config.toml` next to the adapter folder), else from the config defaults.
"""

from __future__ import annotations

from pathlib import Path

from ..config import TrainConfig, load_config, parse_value


def run_config_for(adapters: str | None, config_path: str | None = None,
                   max_reply_tokens: int | None = None) -> TrainConfig:
    """The settings an evaluation uses: `config_path` (a file or recipe) if given, else the adapters' run's."""
    if config_path or max_reply_tokens is not None:
        base = config_path or _adapters_config_path(adapters)
        return load_config(base, {"max_reply_tokens": max_reply_tokens})
    if adapters:
        candidate = Path(adapters).resolve().parent / "config.toml"
        if candidate.exists():
            return load_config(candidate)
    return TrainConfig()


def _adapters_config_path(adapters: str | None) -> Path | None:
    candidate = Path(adapters).resolve().parent / "config.toml" if adapters else None
    return candidate if candidate is not None and candidate.exists() else None


def run_eval(adapters, model, env, env_arg_items, episodes, temperature, seed, *, config_path: str | None = None,
             max_reply_tokens: int | None = None) -> dict:
    from ..engine.loading import open_policy
    from ..envs.base import make_env, outcomes_of
    from ..rollout.evaluation import evaluate
    from ..model.policy import LoraSpec, read_adapter_config
    from ..rollout.episodes import EpisodeRollouts, SamplingParams

    if episodes <= 0:
        raise ValueError(f"--episodes must be > 0, got {episodes}")
    run = run_config_for(adapters, config_path, max_reply_tokens)
    env_args = dict(run.env_args) if env in (None, run.env) else {}
    env = env or run.env
    for item in env_arg_items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--env-arg {item!r} must look like key=value")
        env_args[key.strip()] = parse_value(raw)
    temperature = run.resolved_eval_temperature() if temperature is None else temperature
    if adapters:
        model = model or read_adapter_config(Path(adapters)).get("model")
        opened = open_policy(model, budget_gb=run.memory_budget_gb, adapters=Path(adapters))
    else:
        model = model or run.model
        opened = open_policy(model, LoraSpec(), run.memory_budget_gb)
    engine = EpisodeRollouts(opened.model, opened.tokenizer, lambda: make_env(env, env_args),
                             SamplingParams.from_config(run), opened.plan)
    result = evaluate(engine, episodes, outcomes_of(make_env(env, env_args)), temperature, seed=seed)
    return {"model": model, "adapters": adapters, "env": env,
            "env_args": env_args, "max_reply_tokens": run.max_reply_tokens, "temperature": temperature, **result}


def describe(result: dict) -> str:
    """`artmlx eval`'s lines: the score with its interval, then each outcome's rate."""
    lines = [f"{result['env']} on {result['model']}: score {result['eval_score']:.3f} "
             f"(95% CI {result['eval_score_ci_low']:.3f}-{result['eval_score_ci_high']:.3f}, "
             f"{result['eval_episodes']} episodes)"]
    lines += [f"  {key[5:-5]:<12} {value:.3f}" for key, value in result.items() if key.endswith("_rate")]
    return "\n".join(lines)
