"""`math`: arithmetic posed as a chat question, for a real instruct model.

The user asks "What is 7 + 12? Answer with just the number." (operands drawn from the seed between
`min_operand` and `max_operand`, the operator from `operators`); the answer is the last number in the
reply and the reward is `answers.py`'s: 1 right, `format_reward` for a wrong number, 0 for no number;
`hints = true` gives every episode the directive hint "The answer is N." (`learner/distill.py`);
with `hint_on = "wrong"` only the episodes not answered right get it.

SmolLM2-135M-Instruct on sums of 0-20 in this form (200 held-out questions, 16-token replies):
0.13 right when sampled at temperature 1, 0.40 greedily; without the "Answer with just the number."
0.10 and 0.26. (`arithmetic` is the embedded tiny model's bare `7+12=` form.)
"""

from __future__ import annotations

import random

from .answers import OUTCOMES, check_flag, check_hint_on, check_format_reward, final_step

INSTRUCTION = "Answer with just the number."
_SYMBOLS = {"+": "+", "-": "-", "*": "×"}


class MathQuestion:
    name = "math"
    outcomes = OUTCOMES

    def __init__(self, min_operand: int = 0, max_operand: int = 20, operators: str = "+",
                 instruction: str = INSTRUCTION, system: str = "", format_reward: float = 0.1, hints: bool = False,
                 hint_on: str = "every"):
        if not 0 <= min_operand <= max_operand:
            raise ValueError(f"math needs 0 <= min_operand <= max_operand, got {min_operand} and {max_operand}")
        if not operators or set(operators) - set(_SYMBOLS):
            raise ValueError(f"math operators must be a non-empty subset of '+-*', got {operators!r}")
        self.min_operand, self.max_operand, self.operators = min_operand, max_operand, operators
        self.instruction, self.system = instruction, system
        self.format_reward = check_format_reward(format_reward)
        self.hints = check_flag("hints", hints)
        self.hint_on = check_hint_on(hint_on)
        self.answer = 0

    def question(self, seed: int) -> tuple[str, int]:
        """The question of a seed and its answer."""
        rng = random.Random(seed)
        a, b = rng.randint(self.min_operand, self.max_operand), rng.randint(self.min_operand, self.max_operand)
        op = rng.choice(self.operators)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        text = f"What is {a} {_SYMBOLS[op]} {b}?"
        return (f"{text} {self.instruction}" if self.instruction else text), answer

    def reset(self, seed: int) -> list[dict]:
        text, self.answer = self.question(seed)
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [{"role": "user", "content": text}]

    def step(self, assistant_text: str):
        return final_step(assistant_text, self.answer, self.format_reward, self.hints, self.hint_on)
