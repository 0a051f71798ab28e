"""The real-model tasks: answers read from words, rewards as documented, problems generated from seeds."""

import operator
import random

import pytest

from artmlx.envs.answers import final_number, grade
from artmlx.envs.base import make_env
from artmlx.envs.calculator import Calculator, calculate, make_task, parse_call
from artmlx.envs.math_question import MathQuestion
from artmlx.envs.word_problems import PROBLEMS, WordProblems


@pytest.mark.parametrize("text, value", [
    ("19", 19), ("12 + 7 = 19.", 19), ("The answer is 1,250 apples", 1250), ("-3", -3), ("2.5 each", 2.5),
    ("7+12=19, so 19", 19), ("no number here", None), ("", None), ("1,2", 2),
])
def test_final_number_is_the_last_number_in_the_reply(text, value):
    assert final_number(text) == value


def test_grade_pays_right_answers_then_numbers_then_nothing():
    assert grade("It is 19.", 19) == ("correct", 1.0)
    assert grade("It is 18.", 19) == ("wrong", 0.1)
    assert grade("It is 18.", 19, format_reward=0.0) == ("wrong", 0.0)
    assert grade("I don't know", 19) == ("unparseable", 0.0)


def test_math_question_is_a_chat_question_whose_answer_the_reward_checks():
    env = MathQuestion()
    messages = env.reset(3)
    assert messages[-1]["role"] == "user" and messages[-1]["content"].endswith("Answer with just the number.")
    a, b = (int(x) for x in messages[-1]["content"].split("?")[0].removeprefix("What is ").split(" + "))
    assert 0 <= a <= 20 and 0 <= b <= 20
    right = env.step(f"{a} + {b} = {a + b}")
    assert right.done and right.reward == 1.0 and right.info["outcome"] == "correct" and right.info["score"] == 1.0
    env.reset(3)
    assert env.step(str(a + b + 1)).reward == 0.1
    assert MathQuestion().reset(3) == messages  # a seed is one question


def test_math_question_operators_and_bounds_are_validated():
    env = MathQuestion(min_operand=5, max_operand=9, operators="*")
    for seed in range(50):
        text, answer = env.question(seed)
        a, b = (int(x) for x in text.split("?")[0].removeprefix("What is ").split(" × "))
        assert 5 <= a <= 9 and 5 <= b <= 9 and answer == a * b
    with pytest.raises(ValueError, match="operators"):
        MathQuestion(operators="/")
    with pytest.raises(ValueError, match="min_operand"):
        MathQuestion(min_operand=3, max_operand=2)
    with pytest.raises(ValueError, match="format_reward"):
        MathQuestion(format_reward=1.0)


def test_word_problems_answers_are_whole_non_negative_and_follow_from_the_text():
    env = WordProblems(steps="123", max_number=20)
    kinds = set()
    for seed in range(400):
        text, answer, kind = env.problem(seed)
        kinds.add(kind)
        assert isinstance(answer, int) and answer >= 0, (seed, text, answer)
        assert text.endswith("Answer with just the number.")
        assert env.problem(seed) == (text, answer, kind)  # generated from the seed alone
    assert kinds == {p.kind for p in PROBLEMS}
    # One template checked against the story it tells: "X has a apples. He gets b more."
    rng_text, answer, kind = next(env.problem(s) for s in range(100) if env.problem(s)[2] == "gain")
    numbers = [int(n) for n in __import__("re").findall(r"\d+", rng_text)]
    assert answer == numbers[0] + numbers[1]


def test_word_problems_steps_choose_templates_and_bad_settings_are_refused():
    assert {WordProblems(steps="1").problem(s)[2] for s in range(200)} == {"gain", "give", "bags"}
    assert {WordProblems(steps="3").problem(s)[2] for s in range(50)} == {"stall"}
    for bad in ("", "4", "1a"):
        with pytest.raises(ValueError, match="steps"):
            WordProblems(steps=bad)
    env = WordProblems()
    env.reset(7)
    result = env.step(f"The answer is {env.answer}.")
    assert result.reward == 1.0 and result.info["kind"] == env.kind


def test_word_problem_calculations_are_right_step_by_step_and_end_in_the_answer():
    env = WordProblems(steps="123", max_number=20)
    for seed in range(600):
        _, answer, kind = env.problem(seed)
        calculation = env.calculation(seed)
        assert final_number(calculation) == answer, (seed, kind, calculation)
        for step in calculation.split(", "):
            left, right = step.split(" = ")
            a, op, b = left.split(" ")
            operation = {"+": operator.add, "-": operator.sub, "x": operator.mul, "/": operator.truediv}[op]
            assert operation(int(a), int(b)) == int(right), (seed, step)


def test_word_problem_shots_are_solved_problems_the_environment_itself_pays_in_full():
    env = WordProblems(shots=2)
    messages = env.reset(7)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert all(m["content"].endswith("Write the calculation, ending with the answer.") for m in messages[::2])
    assert WordProblems(shots=2).reset(7) == messages  # a seed gives the same prompt every time
    assert WordProblems(shots=2).reset(8)[0] != messages[0]  # and another seed other demonstrations
    assert messages[-1]["content"] == env.problem(7)[0]  # the question itself is the seed's, as without shots
    for question, solved in zip(messages[0:4:2], messages[1:4:2]):
        judge = WordProblems(shots=0, instruction="Write the calculation, ending with the answer.")
        seed = next(s for s in range(-40, 0) if judge.problem(s)[0] == question["content"])
        judge.reset(seed)
        assert judge.step(solved["content"]).reward == 1.0  # each demonstration is a right answer
    assert WordProblems().reset(7)[-1]["content"].endswith("Answer with just the number.")
    assert WordProblems(shots=1, instruction="Go.").reset(7)[0]["content"].endswith("Go.")
    for bad in (-1, 5, 1.5, True, "2"):
        with pytest.raises(ValueError, match="word_problems shots must be an integer from 0 to 4"):
            WordProblems(shots=bad)


def test_calculator_evaluates_arithmetic_only_and_never_raises():
    assert calculate("37 * 48") == "1776"
    assert calculate("37 × 48") == "1776"
    assert calculate("(1 + 2) / 4") == "0.75"
    assert calculate("1/0").startswith("error")
    assert calculate("__import__('os')").startswith("error")
    assert calculate("x + 1") == "error: name 'x' is not defined"
    assert calculate("9" * 300).startswith("error: expression longer")
    assert calculate("10**100").startswith("error")  # Pow is not among the operators
    assert calculate(12).startswith("error: expression must be a string")


def test_calculator_episode_pays_the_tool_then_the_answer():
    env = Calculator()
    messages = env.reset(5)
    question = messages[-1]["content"]
    _, answer = make_task(5, "multiply")
    a, b = (int(x) for x in question.removeprefix("What is ").rstrip("?").split(" × "))
    call = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}}\n</tool_call>'
    step = env.step(call)
    assert not step.done and step.messages == [{"role": "tool", "content": str(answer)}]
    final = env.step(f"The answer is {answer}.")
    assert final.done and final.reward == 1.0 and final.info["tool_calls"] == 1 and final.info["tool_errors"] == 0

    env.reset(5)
    env.step(call)
    assert env.step("It is 12.").reward == 0.2  # used the tool, answered wrong
    env.reset(5)
    assert env.step("It is 12.").reward == 0.1  # a number without the tool
    env.reset(5)
    bad = env.step('<tool_call>{"name": "search", "arguments": {}}</tool_call>')
    assert "unknown tool" in bad.messages[0]["content"]
    assert env.step("no idea").reward == 0.0  # only failed calls: no tool credit, no number


def test_calculator_shots_are_worked_episodes_the_environment_itself_pays_in_full():
    env = Calculator(shots=2)
    messages = env.reset(7)
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant", "tool", "assistant"] * 2 + ["user"]
    assert messages[-1]["content"] == make_task(7, "multiply")[0]
    questions = [m["content"] for m in messages if m["role"] == "user"]
    assert len(set(questions)) == 3  # each demonstration is another question than the one asked
    assert Calculator(shots=2).reset(7) == messages  # a seed gives the same prompt every time
    assert Calculator(shots=2).reset(8)[1] != messages[1]  # and another seed other demonstrations
    for shot in range(2):
        user, call, result, answer = messages[1 + 4 * shot: 5 + 4 * shot]
        replay = Calculator()
        replay.reset(0)
        a, b = (int(x) for x in user["content"].removeprefix("What is ").rstrip("?").split(" × "))
        replay.answer = a * b  # the demonstration's own question, answered right
        step = replay.step(call["content"])
        assert step.messages == [{"role": "tool", "content": result["content"]}] and replay.errors == 0
        assert replay.step(answer["content"]).reward == 1.0
    assert Calculator(shots=1, result_role="user").reset(3)[3]["role"] == "user"
    for bad in (-1, 5, 1.5, True, "1"):
        with pytest.raises(ValueError, match="calculator shots must be an integer from 0 to 4"):
            Calculator(shots=bad)


def test_parse_call_reads_openai_style_string_arguments_and_reports_bad_json():
    assert parse_call('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+2\\"}"}</tool_call>') \
        == ("1+2", None)
    expression, error = parse_call("<tool_call>{not json}</tool_call>")
    assert expression is None and "not valid JSON" in error
    assert parse_call("plain answer 3") == (None, None)


@pytest.mark.parametrize("name", ["math", "word_problems", "calculator"])
def test_real_tasks_are_built_by_name_with_their_arguments(name):
    env = make_env(name, {})
    assert env.name == name and env.reset(1)
    with pytest.raises((ValueError, TypeError)):
        make_env(name, {"no_such_argument": 1})


def test_hints_are_optional_and_state_what_should_have_been_different():
    plain = MathQuestion()
    plain.reset(3)
    assert "hint" not in plain.step("5").info
    env = MathQuestion(hints=True)
    env.reset(3)
    assert env.step("5").info["hint"] == f"The answer is {env.answer}."
    words = WordProblems(hints=True)
    words.reset(9)
    assert words.step("1").info["hint"] == f"The answer is {words.answer}."
    calculator = Calculator(hints=True)
    calculator.reset(5)
    calculator.step("<tool_call>{oops}</tool_call>")
    hint = calculator.step("It is 3.").info["hint"]
    _, answer = make_task(5, "multiply")
    assert hint.startswith("Your calculator call failed (error: the tool call is not valid JSON")
    assert hint.endswith(f"and then answer {answer}.") and '"expression": "' in hint
    calculator.reset(5)
    assert calculator.step("It is 3.").info["hint"].startswith("Call the calculator with <tool_call>")
    for cls in (MathQuestion, WordProblems, Calculator):
        with pytest.raises(ValueError, match="hints must be true or false"):
            cls(hints="yes")
    assert make_env("math", {"hints": True}).hints


def test_the_evaluation_reports_the_share_of_calculator_episodes_that_called_the_tool():
    from artmlx.envs.calculator import Calculator, call_text
    from artmlx.rollout.evaluation import summarize
    from artmlx.trajectory import Episode

    def played(replies):
        env = Calculator()
        env.reset(3)
        for reply in replies:
            result = env.step(reply)
        return Episode([1], [True], [0.0], result.reward, result.info)

    with_call = played([call_text(Calculator().expression or "2 * 3"), "6"])
    broken_call = played(["<tool_call>\nnot json\n</tool_call>", "7"])
    without = played(["It is 12."])
    row = summarize([with_call, broken_call, without], Calculator.outcomes)
    assert row["eval_tool_calls_rate"] == 2 / 3 and row["eval_tool_errors_rate"] == 1 / 3
    assert "eval_tool_calls_rate" not in summarize([Episode([1], [True], [0.0], 1.0, {"outcome": "correct"})], ("correct",))


def test_hint_on_wrong_gives_the_answer_only_to_replies_that_missed_it():
    from artmlx.envs import make_env

    for name in ("math", "word_problems"):
        env = make_env(name, {"hints": True, "hint_on": "wrong"})
        env.reset(3)
        answer = env.answer
        assert "hint" not in env.step(f"It is {answer}.").info
        env.reset(3)
        assert env.step(f"It is {answer + 1}.").info["hint"] == f"The answer is {answer}."
        env.reset(3)
        assert env.step("no idea").info["hint"] == f"The answer is {answer}."
        env = make_env(name, {"hints": True})  # every episode by default
        env.reset(3)
        assert env.step(f"It is {env.answer}.").info["hint"] == f"The answer is {env.answer}."
        with pytest.raises(ValueError, match="hint_on must be one of every, wrong"):
            make_env(name, {"hints": True, "hint_on": "sometimes"})
