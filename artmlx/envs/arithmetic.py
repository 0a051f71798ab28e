"""Arithmetic: a single-turn verifiable task. The prompt is `a+b=` or `a-b=` (operands up to
`max_operand`); the first integer in the reply is the answer. Reward 1 if right, else 0; a reply
with no integer is `unparseable` (reward 0)."""

from __future__ import annotations

import random
import re

from .base import StepResult

_INTEGER = re.compile(r"-?\d+")


class Arithmetic:
    name = "arithmetic"
    outcomes = ("correct", "wrong", "unparseable")

    def __init__(self, max_operand: int = 9, operators: str = "+-"):
        if max_operand < 1:
            raise ValueError(f"arithmetic max_operand must be >= 1, got {max_operand}")
        if not operators or set(operators) - set("+-*"):
            raise ValueError(f"arithmetic operators must be a non-empty subset of '+-*', got {operators!r}")
        self.max_operand = max_operand
        self.operators = operators
        self.answer = 0

    def reset(self, seed: int) -> list[dict]:
        rng = random.Random(seed)
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        op = rng.choice(self.operators)
        self.answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        return [{"role": "user", "content": f"{a}{op}{b}="}]

    def step(self, assistant_text: str) -> StepResult:
        match = _INTEGER.search(assistant_text)
        if match is None:
            outcome = "unparseable"
        else:
            outcome = "correct" if int(match.group()) == self.answer else "wrong"
        score = float(outcome == "correct")
        return StepResult([], score, True, {"outcome": outcome, "score": score, "answer": self.answer})
