"""`calculator`: a multi-turn tool-use task. The model gets a sum or product too big to do in its head
and a calculator it calls with a tool call; the result comes back as a tool message; then it answers.

The tool is described in the system message (a template without tool support still shows it) and
called Hermes / Qwen style, the form mlx-lm's and vLLM's parsers read:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 48"}}
    </tool_call>

A reply with a call gets the calculator's answer (or its error text, e.g. `error: name 'x' is not
defined`) as the next message, role `tool` (`result_role`); a reply without one is the final answer,
graded on its last number. Rewards:

    the final answer is right                                   1
    wrong, but a well-formed calculator call was made           tool_reward (default 0.2)
    wrong, answered with a number without the tool              format_reward (default 0.1)
    no number                                                   0

so a weak model is paid first for using the tool at all, then for copying its result. `info`
counts `tool_calls` and `tool_errors`. With `hints = true` the last step carries a directive hint
(`learner/distill.py`): the error of the last failed call if there was one, the call to make, and the answer. The same task, played by an ART-style agent through the
OpenAI API, is `artmlx.agents.calculator:rollout`.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re

from .answers import OUTCOMES, check_flag, check_format_reward, final_number
from .base import StepResult

TOOL_NAME = "calculator"
TOOL = {"type": "function", "function": {
    "name": TOOL_NAME, "description": "Evaluate an arithmetic expression (+, -, *, /, parentheses).",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
SYSTEM = ("You can use a calculator. To use it, reply with exactly:\n"
          "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12 * 34\"}}\n</tool_call>\n"
          "and the result comes back in the next message. Then reply with the final answer as a number.")
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_EXPRESSION = 200
MAX_SHOTS = 4
MAX_MAGNITUDE = 10**15


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text, or `error: ...` (never raises, never runs code)."""
    if not isinstance(expression, str):
        return f"error: expression must be a string, got {type(expression).__name__}"
    if len(expression) > MAX_EXPRESSION:
        return f"error: expression longer than {MAX_EXPRESSION} characters"
    try:
        value = _evaluate(ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval").body)
    except SyntaxError:
        return f"error: cannot read {expression!r} as arithmetic"
    except (ValueError, ZeroDivisionError, OverflowError) as error:
        return f"error: {error}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _evaluate(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        value = node.value
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        value = _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        value = _OPERATORS[type(node.op)](_evaluate(node.operand))
    elif isinstance(node, ast.Name):
        raise ValueError(f"name {node.id!r} is not defined")
    else:
        raise ValueError(f"{type(node).__name__} is not arithmetic")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError("number too large")
    return value


def parse_call(text: str) -> tuple[str | None, str | None]:
    """(expression, error) of the first `<tool_call>` in a reply: (None, None) when there is none, an error
    text when it is there but not a well-formed calculator call."""
    match = _CALL.search(text)
    if match is None:
        return None, None
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError as error:
        return None, f"error: the tool call is not valid JSON ({error.msg})"
    if not isinstance(call, dict) or call.get("name") != TOOL_NAME:
        return None, f"error: unknown tool {call.get('name') if isinstance(call, dict) else call!r}; use {TOOL_NAME!r}"
    arguments = call.get("arguments")
    if isinstance(arguments, str):  # OpenAI's form: arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict) or "expression" not in arguments:
        return None, "error: the calculator needs {\"expression\": \"...\"}"
    return str(arguments["expression"]), None


def make_task(seed: int, task: str) -> tuple[str, int]:
    """The question of a seed and its answer: `multiply` (two 2-digit numbers) or `add` (three 3-digit ones)."""
    rng = random.Random(seed)
    if task == "multiply":
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        return f"What is {a} × {b}?", a * b
    numbers = [rng.randint(100, 999) for _ in range(3)]
    return f"What is {' + '.join(map(str, numbers))}?", sum(numbers)


def expression_of(question: str) -> str:
    """The calculator expression a question of `make_task` asks for ("What is 37 × 48?" -> "37 * 48")."""
    return question.removeprefix("What is ").rstrip("?").replace("×", "*")


def grade_episode(final_text: str, answer: int, called: bool, tool_reward: float, format_reward: float):
    """(outcome, reward) of an episode's last reply (see the module docstring)."""
    value = final_number(final_text)
    if value is not None and abs(value - answer) < 1e-9:
        return "correct", 1.0
    if called:
        return ("wrong" if value is not None else "unparseable"), tool_reward
    return ("wrong", format_reward) if value is not None else ("unparseable", 0.0)


def call_text(expression: str) -> str:
    """A well-formed calculator call, as the system message shows it."""
    return f'<tool_call>\n{{"name": "{TOOL_NAME}", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


class Calculator:
    name = "calculator"
    outcomes = OUTCOMES

    def __init__(self, task: str = "multiply", tool_reward: float = 0.2, format_reward: float = 0.1,
                 result_role: str = "tool", system: str = SYSTEM, hints: bool = False, shots: int = 0):
        if task not in ("multiply", "add"):
            raise ValueError(f"calculator task must be 'multiply' or 'add', got {task!r}")
        if result_role not in ("tool", "user"):
            raise ValueError(f"calculator result_role must be 'tool' or 'user', got {result_role!r}")
        self.task, self.result_role, self.system = task, result_role, system
        self.tool_reward, self.format_reward = check_format_reward(tool_reward), check_format_reward(format_reward)
        self.answer, self.calls, self.errors = 0, 0, 0
        self.hints, self.expression, self.last_error = check_flag("hints", hints), "", ""
        if isinstance(shots, bool) or not isinstance(shots, int) or not 0 <= shots <= MAX_SHOTS:
            raise ValueError(f"calculator shots must be an integer from 0 to {MAX_SHOTS}, got {shots!r}")
        self.shots = shots

    def reset(self, seed: int) -> list[dict]:
        question, self.answer = make_task(seed, self.task)
        self.expression = expression_of(question)
        self.calls = self.errors = 0
        self.last_error = ""
        return [{"role": "system", "content": self.system}, *self.demonstrations(seed),
                {"role": "user", "content": question}]

    def demonstrations(self, seed: int) -> list[dict]:
        """`shots` worked episodes as earlier turns: question, call, result, answer (their own seeds)."""
        turns = []
        for shot in range(self.shots):
            question, answer = make_task(-(seed * MAX_SHOTS + shot + 1), self.task)
            expression = expression_of(question)
            turns += [{"role": "user", "content": question},
                      {"role": "assistant", "content": call_text(expression)},
                      {"role": self.result_role, "content": calculate(expression)},
                      {"role": "assistant", "content": str(answer)}]
        return turns

    def hint(self) -> str:
        """The directive hint of the episode so far: the failed call's error, the call to make, the answer."""
        failed = f"Your calculator call failed ({self.last_error}). " if self.last_error else ""
        return f"{failed}Call the calculator with {call_text(self.expression)} and then answer {self.answer}."

    def step(self, assistant_text: str) -> StepResult:
        expression, error = parse_call(assistant_text)
        if expression is None and error is None:  # no call: this is the answer
            outcome, reward = grade_episode(assistant_text, self.answer, self.calls > self.errors,
                                            self.tool_reward, self.format_reward)
            info = {"outcome": outcome, "score": float(outcome == "correct"), "answer": self.answer,
                    "tool_calls": self.calls, "tool_errors": self.errors}
            if self.hints:
                info["hint"] = self.hint()
            return StepResult([], reward, True, info)
        self.calls += 1
        result = error or calculate(expression)
        if result.startswith("error"):
            self.errors += 1
            self.last_error = result
        return StepResult([{"role": self.result_role, "content": result}], 0.0, False,
                          {"tool_calls": self.calls, "tool_errors": self.errors})
