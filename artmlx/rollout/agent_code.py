"""The user's agent code: loading `--rollout` and scenarios, and what the rollout's first argument is.

Two calling conventions are accepted, told apart by the rollout's first parameter:

- `async def rollout(client, scenario)`: the first argument is an `openai.AsyncOpenAI` client;
- `async def rollout(model: art.Model, scenario)`, ART's own: the first argument is an `AgentModel`,
  the part of `art.Model` that rollouts use (`openai_client()`, `get_inference_name()`, `name`...).

The annotation decides when there is one (`AsyncOpenAI` means the client, any other class the
model; `Any` and `object` say nothing); otherwise a parameter named `model` gets the model and
any other name the client. Loading checks what can be checked before any model is loaded: the
module imports, the name exists, it is an async function, and it can be called with two arguments;
each failure is a `RolloutLoadError` naming the spec and the cause (the command exits with 2).
"""

from __future__ import annotations

import inspect
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import user_code


class RolloutLoadError(ValueError):
    """The agent code or its scenarios cannot be used; the message says which and why."""


def load_object(spec: str, what: str):
    """`module:name` or `path/to/file.py:name` (`user_code.load_object`), failures as `RolloutLoadError`."""
    return user_code.load_object(spec, what, RolloutLoadError)


def load_rollout(spec: str) -> Callable:
    """The rollout function, checked: async, and callable as `rollout(client_or_model, scenario)`."""
    function = load_object(spec, "rollout")
    if not inspect.iscoroutinefunction(function):
        raise RolloutLoadError(f"rollout {spec!r} must be an async function: async def rollout(model, scenario) "
                               "or async def rollout(client, scenario)")
    try:
        inspect.signature(function).bind(None, None)
    except TypeError as error:
        raise RolloutLoadError(f"rollout {spec!r} is called as rollout(model_or_client, scenario), but its signature "
                               f"is {signature_text(function)} ({error})") from error
    return function


def load_scenarios(spec: str, what: str = "scenarios") -> list:
    """A JSONL file (one scenario per line) or `module:name` of a list or of a function returning one."""
    if not spec:
        return []
    if spec.endswith(".jsonl") or Path(spec).is_file():
        if not Path(spec).is_file():
            raise RolloutLoadError(f"{what} {spec}: there is no such file")
        lines = [line for line in Path(spec).read_text().splitlines() if line.strip()]
        try:
            scenarios = [json.loads(line) for line in lines]
        except json.JSONDecodeError as error:
            raise RolloutLoadError(f"{what} {spec}: line {error.lineno} is not JSON ({error.msg})") from error
    else:
        source = load_object(spec, what)
        scenarios = list(source() if callable(source) else source)
    if not scenarios:
        raise RolloutLoadError(f"{what} {spec!r} is empty")
    return scenarios


def check_agent(config) -> None:
    """Load the run's rollout and scenarios once (`artmlx run` and the learner, before any work starts)."""
    if config.rollout:
        load_rollout(config.rollout)
        load_scenarios(config.scenarios)
        load_scenarios(config.eval_scenarios, "eval_scenarios")


def signature_text(function: Callable) -> str:
    try:
        return f"{function.__name__}{inspect.signature(function)}"
    except (TypeError, ValueError, AttributeError):
        return repr(function)


def takes_model(function: Callable) -> bool:
    """True when the rollout's first parameter is a model (ART's `rollout(model, scenario)`), False for an
    OpenAI client: its annotation decides (AsyncOpenAI: the client; another class: the model), else its name."""
    first = next(iter(inspect.signature(function).parameters.values()))
    annotation = first.annotation
    if annotation in (inspect.Parameter.empty, Any, object, "Any", "typing.Any", "object"):
        return first.name == "model"
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    if typing.get_origin(annotation) is not None:  # Optional[AsyncOpenAI], AsyncOpenAI | None ...
        text = repr(annotation)
    return "AsyncOpenAI" not in text


@dataclass
class AgentModel:
    """What `rollout(model, scenario)` receives: the policy the actor serves, under `art.Model`'s names.

    It names and reaches the served model and nothing else: training is the learner's. `openai_client()`
    is the same in-process `openai.AsyncOpenAI` client a `rollout(client, scenario)` gets, and
    `get_inference_name()` the served name. `inference_base_url` is that client's address, which only
    this client reaches (no socket is open): a rollout must use `openai_client()`, not a client of its own.
    """

    client: Any
    """The in-process `openai.AsyncOpenAI` client (`openai_client()` returns it)."""
    current_step: Callable[[], int]
    """The adapter version new requests are served with (`get_step()`)."""
    name: str = "policy"
    """The served model name (what ART's examples send as `model=model.name`)."""
    base_model: str = ""
    """The run's base model (`--model`)."""
    project: str = "artmlx"
    """ART's project; artmlx keeps runs in `--out` instead."""
    trainable: bool = True
    """The learner trains this policy (ART: a `TrainableModel`)."""
    config: Any = None
    """ART's per-model user config; artmlx has none."""
    inference_base_url: str = ""
    """The in-process client's base URL (reachable only through `openai_client()`)."""
    inference_api_key: str = ""
    """The in-process client's key."""

    @property
    def inference_model_name(self) -> str:
        return self.name

    @property
    def run_name(self) -> str:
        return self.name

    def openai_client(self):
        return self.client

    def get_inference_name(self, step: int | None = None) -> str:
        """The served name; with `step`, `NAME@STEP`, which is served while that step is the current one."""
        return self.name if step is None else f"{self.name}@{step}"

    async def get_step(self) -> int:
        return self.current_step()

