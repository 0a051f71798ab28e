"""The environment protocol: how artmlx talks to a task, multi-turn or single-turn.

An environment is a class with a no-argument-friendly constructor (keyword options come from the
run config's `env_args`) and two methods:

    reset(seed: int) -> list[dict]
        Start an episode. The seed fixes everything random about it (the task, the opponent), so a
        group of G episodes with one seed is G attempts at the same task. Returns the opening chat
        messages, e.g. `[{"role": "user", "content": "..."}]`.

    step(assistant_text: str) -> StepResult
        Take the policy's reply. Returns the messages the environment answers with (usually one
        user message; empty when done), the reward for this step, whether the episode is over, and
        an `info` dict. The final `info` should hold `score` (what evaluation averages, e.g. 1 for
        a win or draw) and, where it has one, `outcome` (one of the class's `outcomes`).

Class attributes: `name` (registry name) and `outcomes` (a tuple; evaluation reports
`eval_<outcome>_rate` for each). Episode reward is the sum of step rewards.

Environments are looked up by registry name (`tictactoe`, `arithmetic`, `math`, `word_problems`, `calculator`,
`synthetic`) or by `module:Class`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from ..user_code import load_object


class StepResult(NamedTuple):
    messages: list[dict]
    reward: float
    done: bool
    info: dict[str, Any]


class Env(Protocol):
    name: str
    outcomes: tuple[str, ...]

    def reset(self, seed: int) -> list[dict]: ...

    def step(self, assistant_text: str) -> StepResult: ...


def registry() -> dict[str, str]:
    """Built-in environments: name -> `module:Class`."""
    return {
        "tictactoe": "artmlx.envs.tictactoe:TicTacToe",
        "arithmetic": "artmlx.envs.arithmetic:Arithmetic",
        "math": "artmlx.envs.math_question:MathQuestion",
        "word_problems": "artmlx.envs.word_problems:WordProblems",
        "calculator": "artmlx.envs.calculator:Calculator",
        "synthetic": "artmlx.envs.synthetic:Synthetic",
    }


def env_class(spec: str) -> type:
    """Resolve a registry name, `module:Class` or `path/to/file.py:Class` into the environment class."""
    target = registry().get(spec, spec)
    if ":" not in target:
        raise ValueError(
            f"env {spec!r} is neither a built-in ({', '.join(registry())}) nor of the form module:Class"
        )
    cls = load_object(target, "env")
    class_name = target.rpartition(":")[2]
    for method in ("reset", "step"):
        if not callable(getattr(cls, method, None)):
            raise ValueError(f"env {spec!r}: {class_name} has no {method}() method")
    return cls


def make_env(spec: str, env_args: dict[str, Any] | None = None) -> Env:
    """Instantiate an environment; a bad option names the env and the option."""
    cls = env_class(spec)
    try:
        return cls(**(env_args or {}))
    except TypeError as error:
        raise ValueError(f"env {spec!r}: bad env_args {env_args!r} ({error})") from error


def outcomes_of(env: Env) -> tuple[str, ...]:
    return tuple(getattr(env, "outcomes", ()))
