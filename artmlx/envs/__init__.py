"""Environments: the protocol (`base`) and the built-ins (tic-tac-toe, arithmetic)."""

from .base import Env, StepResult, env_class, make_env, registry

__all__ = ["Env", "StepResult", "env_class", "make_env", "registry"]
