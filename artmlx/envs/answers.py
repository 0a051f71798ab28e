"""Reading a final numeric answer out of a model's reply, and the reward for it.

An instruct model answers a question in words ("7 + 12 = 19", "The answer is 19."), so the answer is
the last number in the reply (commas between digit groups allowed: "1,250"). Rewards:

    correct (the last number equals the answer)                      1
    wrong (a number, not the answer)                                 format_reward (default 0.1)
    unparseable (no number at all)                                   0

The small reward for a well-formed wrong answer gives a weak model a gradient before it is ever
right: in a group where every reply is wrong, the ones that answered with a number still beat the
ones that did not. Set it to 0 for the plain 0/1 reward. `score` (what evaluation averages) is 1 for
correct and 0 otherwise. With `hints = true` in `env_args`, every episode's last step carries the
directive hint "The answer is N." (`info["hint"]`): the teacher that reads it scores the reply's tokens,
and the policy learns token by token what it would have said knowing the answer (`learner/distill.py`).
"""

from __future__ import annotations

import re

from .base import StepResult

OUTCOMES = ("correct", "wrong", "unparseable")
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?![\d,])|-?\d+(?:\.\d+)?")


def final_number(text: str) -> float | None:
    """The last number in `text` (an integer or a decimal; "1,250" is 1250), or None."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return float(matches[-1].replace(",", ""))


def grade(text: str, answer: float, format_reward: float = 0.1) -> tuple[str, float]:
    """(outcome, reward) of a reply to a question whose answer is `answer`."""
    value = final_number(text)
    if value is None:
        return "unparseable", 0.0
    if abs(value - answer) < 1e-9:
        return "correct", 1.0
    return "wrong", format_reward


HINT_ON = ("every", "wrong")


def final_step(text: str, answer: float, format_reward: float, hints: bool = False, hint_on: str = "every",
               **info) -> StepResult:
    """The step that ends a one-question episode: graded, with `answer` and `outcome` in its info; with
    `hints`, `info["hint"]` states the answer (a directive hint: `learner/distill.py`) on every episode, or with
    `hint_on = "wrong"` only on those not answered right (a right reply is then not pulled toward the teacher)."""
    outcome, reward = grade(text, answer, format_reward)
    if hints and (hint_on == "every" or outcome != "correct"):
        info["hint"] = answer_hint(answer)
    return StepResult([], reward, True, {"outcome": outcome, "score": float(outcome == "correct"),
                                         "answer": _plain(answer), **info})


def answer_hint(answer: float) -> str:
    """The hint of a question with a numeric answer: the answer, in the form the grader reads."""
    return f"The answer is {_plain(answer)}."


def _plain(number: float) -> int | float:
    return int(number) if float(number).is_integer() else number


def check_format_reward(value: float) -> float:
    if not 0 <= value < 1:
        raise ValueError(f"format_reward must be in [0, 1) (below a correct answer's 1), got {value}")
    return float(value)


def check_hint_on(value) -> str:
    if value not in HINT_ON:
        raise ValueError(f"hint_on must be one of {', '.join(HINT_ON)}, got {value!r}")
    return value


def check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value
