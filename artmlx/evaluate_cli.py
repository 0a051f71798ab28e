"""What `artmlx eval` does: load base + adapters, play held-out episodes, summarise."""

from __future__ import annotations

import tomllib
from pathlib import Path

from .config import parse_value


def _run_config(adapters: str | None) -> dict:
    if adapters:
        candidate = Path(adapters).resolve().parent / "config.toml"
        if candidate.exists():
            return tomllib.loads(candidate.read_text())
    return {}


def run_eval(adapters, model, env, env_arg_items, episodes, temperature, seed) -> dict:
    from .actor.rollout import RolloutEngine, SamplingParams
    from .envs.base import make_env, outcomes_of
    from .evaluate import evaluate
    from .model.policy import LoraSpec, load_policy, load_policy_with_adapters

    if episodes <= 0:
        raise ValueError(f"--episodes must be > 0, got {episodes}")
    run = _run_config(adapters)
    env = env or run.get("env", "tictactoe")
    env_args = dict(run.get("env_args", {})) if env == run.get("env") else {}
    for item in env_arg_items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--env-arg {item!r} must look like key=value")
        env_args[key.strip()] = parse_value(raw)
    if temperature is None:
        temperature = run.get("temperature", 1.0)
    if adapters:
        model_obj, tokenizer = load_policy_with_adapters(Path(adapters), model)
    else:
        model = model or "tiny"
        model_obj, tokenizer, _ = load_policy(model, LoraSpec())
    sampling = SamplingParams(
        temperature=temperature,
        max_reply_tokens=run.get("max_reply_tokens", 8),
        max_turns=run.get("max_turns", 10),
        max_episode_tokens=run.get("max_episode_tokens", 1024),
    )
    engine = RolloutEngine(model_obj, tokenizer, lambda: make_env(env, env_args), sampling)
    result = evaluate(engine, episodes, outcomes_of(make_env(env, env_args)), temperature, seed=seed)
    return {"model": model or "adapter base", "adapters": adapters, "env": env, "temperature": temperature, **result}
