"""`word_problems`: short story problems of one to three arithmetic steps, GSM8K's kind, generated.

Each seed picks a template, names, objects and numbers (`max_number` bounds the numbers a problem
states; answers stay whole and non-negative). `steps` chooses the templates: 1 (one operation),
2 (two), or 3 (three), any number of them, e.g. "12". The answer is the last number in the reply and
the reward `answers.py`'s (1 right, `format_reward` for a wrong number, 0 for none); `hints = true`
gives every episode the directive hint "The answer is N." (with `hint_on = "wrong"`, only those not answered
right). `info` carries
the template's name, so evaluation can be broken down by kind.

`shots` (0-4) puts that many solved problems before the question as earlier turns, each answered with its
calculation ("3 x 4 = 12, 5 + 12 = 17": every step, the answer last): a small model that cannot yet do a
two-step problem in one number sees how to write the steps out, and the answer parser still reads the last
number; the instruction after each question (`instruction`) then defaults to "Write the calculation, ending
with the answer." instead of "Answer with just the number.". The demonstrations come from their own seeds, so a seed gives the same prompt every time.
"""

from __future__ import annotations

import random
from typing import Callable, NamedTuple

from .answers import OUTCOMES, check_flag, check_hint_on, check_format_reward, final_step

INSTRUCTION = "Answer with just the number."
WORKED_INSTRUCTION = "Write the calculation, ending with the answer."  # what the demonstrations of `shots` do
MAX_SHOTS = 4
NAMES = ("Sam", "Maria", "Tom", "Aisha", "Leo", "Emma", "Ravi", "Lucy", "Omar", "Nina", "Ben", "Chloe")
PRONOUNS = {"Sam": "He", "Maria": "She", "Tom": "He", "Aisha": "She", "Leo": "He", "Emma": "She", "Ravi": "He",
            "Lucy": "She", "Omar": "He", "Nina": "She", "Ben": "He", "Chloe": "She"}
THINGS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "cards", "shells", "coins", "flowers")


class Problem(NamedTuple):
    kind: str
    steps: int
    make: Callable  # (rng, max_number) -> (text, answer, its calculation: "3 x 4 = 12, 5 + 12 = 17")


def _who(rng):
    name = rng.choice(NAMES)
    return name, PRONOUNS[name], rng.choice(THINGS)


def _gain(rng, n):
    name, he, things = _who(rng)
    a, b = rng.randint(1, n), rng.randint(1, n)
    return (f"{name} has {a} {things}. {he} gets {b} more. How many {things} does {name} have now?", a + b,
            f"{a} + {b} = {a + b}")


def _give(rng, n):
    name, he, things = _who(rng)
    a = rng.randint(2, n)
    b = rng.randint(1, a)
    friend = rng.choice([x for x in NAMES if x != name])
    return (f"{name} has {a} {things} and gives {b} to {friend}. How many {things} does {name} have left?", a - b,
            f"{a} - {b} = {a - b}")


def _bags(rng, n):
    name, he, things = _who(rng)
    a, b = rng.randint(2, max(2, n // 2)), rng.randint(2, 10)
    return (f"{name} buys {a} bags with {b} {things} in each bag. How many {things} does {name} buy?", a * b,
            f"{a} x {b} = {a * b}")


def _gain_bags(rng, n):
    name, he, things = _who(rng)
    a, b, c = rng.randint(1, n), rng.randint(2, 5), rng.randint(2, 10)
    return (f"{name} has {a} {things}. {he} buys {b} boxes of {c} {things} each. "
            f"How many {things} does {name} have now?", a + b * c, f"{b} x {c} = {b * c}, {a} + {b * c} = {a + b * c}")


def _spend(rng, n):
    name, he, things = _who(rng)
    b, c = rng.randint(2, 5), rng.randint(1, 10)
    a = b * c + rng.randint(0, n)
    return (f"{name} has {a} dollars. {he} buys {b} {things} at {c} dollars each. "
            f"How many dollars does {name} have left?", a - b * c, f"{b} x {c} = {b * c}, {a} - {b * c} = {a - b * c}")


def _share(rng, n):
    name, he, things = _who(rng)
    c = rng.randint(2, 5)
    total = c * rng.randint(1, max(1, n // 2))
    a = rng.randint(0, total)
    return (f"{name} has {a} {things} and finds {total - a} more. {he} shares them equally among {c} friends. "
            f"How many {things} does each friend get?", total // c,
            f"{a} + {total - a} = {total}, {total} / {c} = {total // c}")


def _pages(rng, n):
    name, he, _ = _who(rng)
    a, b, c = rng.randint(2, 10), rng.randint(2, 7), rng.randint(1, n)
    return (f"{name} reads {a} pages every day for {b} days, then {c} more pages. "
            f"How many pages does {name} read in total?", a * b + c, f"{a} x {b} = {a * b}, {a * b} + {c} = {a * b + c}")


def _stall(rng, n):
    name, he, things = _who(rng)
    a, b = rng.randint(2, 6), rng.randint(2, 6)
    c = rng.randint(1, a * b)
    d = rng.randint(1, n)
    return (f"{name} packs {a} rows of {b} {things}, sells {c} of them and then makes {d} more. "
            f"How many {things} does {name} have now?", a * b - c + d,
            f"{a} x {b} = {a * b}, {a * b} - {c} = {a * b - c}, {a * b - c} + {d} = {a * b - c + d}")


PROBLEMS = (Problem("gain", 1, _gain), Problem("give", 1, _give), Problem("bags", 1, _bags),
            Problem("gain_bags", 2, _gain_bags), Problem("spend", 2, _spend), Problem("share", 2, _share),
            Problem("pages", 2, _pages), Problem("stall", 3, _stall))


class WordProblems:
    name = "word_problems"
    outcomes = OUTCOMES

    def __init__(self, steps: str = "12", max_number: int = 20, instruction: str | None = None, system: str = "",
                 format_reward: float = 0.1, hints: bool = False, shots: int = 0,
                 hint_on: str = "every"):
        steps = str(steps)
        if not steps or set(steps) - set("123"):
            raise ValueError(f"word_problems steps must be digits among 1, 2 and 3 (e.g. \"12\"), got {steps!r}")
        if max_number < 2:
            raise ValueError(f"word_problems max_number must be >= 2, got {max_number}")
        self.problems = [p for p in PROBLEMS if str(p.steps) in steps]
        if isinstance(shots, bool) or not isinstance(shots, int) or not 0 <= shots <= MAX_SHOTS:
            raise ValueError(f"word_problems shots must be an integer from 0 to {MAX_SHOTS}, got {shots!r}")
        if instruction is None:
            instruction = WORKED_INSTRUCTION if shots else INSTRUCTION
        self.max_number, self.instruction, self.system = max_number, instruction, system
        self.format_reward = check_format_reward(format_reward)
        self.hints = check_flag("hints", hints)
        self.hint_on = check_hint_on(hint_on)
        self.shots = shots
        self.answer, self.kind = 0, ""

    def _draw(self, seed: int) -> tuple[str, int, str, str]:
        rng = random.Random(seed)
        problem = rng.choice(self.problems)
        text, answer, calculation = problem.make(rng, self.max_number)
        return (f"{text} {self.instruction}" if self.instruction else text), answer, problem.kind, calculation

    def problem(self, seed: int) -> tuple[str, int, str]:
        """The problem text of a seed, its answer and its kind."""
        text, answer, kind, _ = self._draw(seed)
        return text, answer, kind

    def calculation(self, seed: int) -> str:
        """The worked calculation of a seed's problem, ending in its answer ("3 x 4 = 12, 5 + 12 = 17")."""
        return self._draw(seed)[3]

    def demonstrations(self, seed: int) -> list[dict]:
        """`shots` solved problems as earlier turns: the question, then its calculation (their own seeds)."""
        turns = []
        for shot in range(self.shots):
            text, _, _, calculation = self._draw(-(seed * MAX_SHOTS + shot + 1))
            turns += [{"role": "user", "content": text}, {"role": "assistant", "content": calculation}]
        return turns

    def reset(self, seed: int) -> list[dict]:
        text, self.answer, self.kind = self.problem(seed)
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.demonstrations(seed) + [{"role": "user", "content": text}]

    def step(self, assistant_text: str):
        return final_step(assistant_text, self.answer, self.format_reward, self.hints, self.hint_on, kind=self.kind)
