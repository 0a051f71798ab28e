import random

import pytest

from artmlx.envs import make_env
from artmlx.envs.arithmetic import Arithmetic
from artmlx.envs.tictactoe import TicTacToe, minimax_value, parse_move, perfect_moves, render, winner


def test_board_rendering_and_move_parsing():
    assert render("X.O......") == "1X 2. 3O 4. 5. 6. 7. 8. 9."
    assert parse_move("5") == 4
    assert parse_move(" I play 9 then 1") == 8
    assert parse_move("0") is None
    assert parse_move("none") is None


def test_winner_detection():
    assert winner("XXX......") == "X"
    assert winner("O...O...O") == "O"
    assert winner("..X.X.X..") == "X"
    assert winner("XOXXOOOXX") is None


def play(env, moves):
    result = None
    for move in moves:
        result = env.step(str(move))
        if result.done:
            return result
    return result


def test_illegal_moves_end_the_game_with_lowest_reward():
    env = TicTacToe()
    env.reset(0)
    result = env.step("no digits here")
    assert result.done and result.info["outcome"] == "illegal" and result.reward == -0.5
    env.reset(0)
    first = env.step("5")
    assert not first.done
    occupied = env.step("5")
    assert occupied.done and occupied.info["outcome"] == "illegal" and occupied.info["score"] == 0.0
    with pytest.raises(RuntimeError):
        env.step("1")


def test_a_win_and_the_opponent_reply_are_in_the_next_message():
    # Against a random O, search seeds for a game where X wins along the top row.
    for seed in range(200):
        env = TicTacToe()
        env.reset(seed)
        r1 = env.step("1")
        if "2O" in r1.messages[0]["content"] or "3O" in r1.messages[0]["content"]:
            continue
        r2 = env.step("2")
        if r2.done or "3O" in r2.messages[0]["content"]:
            continue
        r3 = env.step("3")
        assert r3.done and r3.info["outcome"] == "win" and r3.reward == 1.0 and r3.info["score"] == 1.0
        return
    pytest.fail("no seed produced the scripted win")


def test_perfect_opponent_never_loses_and_draws_are_scored():
    outcomes = {}
    rng = random.Random(0)
    for seed in range(150):
        env = TicTacToe(opponent="perfect")
        env.reset(seed)
        while True:
            free = [i + 1 for i, v in enumerate(env.board) if v == "."]
            result = env.step(str(rng.choice(free)))
            if result.done:
                break
        outcomes[result.info["outcome"]] = outcomes.get(result.info["outcome"], 0) + 1
        if result.info["outcome"] == "draw":
            assert result.reward == 0.5 and result.info["score"] == 1.0
    assert outcomes.get("win", 0) == 0
    assert outcomes.get("loss", 0) > 0


def test_minimax_knows_the_game_is_a_draw():
    assert minimax_value("." * 9, "X") == 0
    # O must block X's open row.
    assert perfect_moves("XX..O....", "O") == [2]


def test_same_seed_same_opponent():
    a, b = TicTacToe(), TicTacToe()
    assert a.reset(7) == b.reset(7)
    assert a.step("5").messages == b.step("5").messages


def test_registry_and_module_class_loading():
    assert isinstance(make_env("tictactoe", {"opponent": "perfect"}), TicTacToe)
    assert isinstance(make_env("artmlx.envs.arithmetic:Arithmetic"), Arithmetic)
    with pytest.raises(ValueError, match="neither a built-in"):
        make_env("chess")
    with pytest.raises(ValueError, match="cannot import"):
        make_env("no_such_module_xyz:Env")
    with pytest.raises(ValueError, match="bad env_args"):
        make_env("tictactoe", {"colour": "red"})
    with pytest.raises(ValueError, match="opponent"):
        make_env("tictactoe", {"opponent": "grandmaster"})


def test_arithmetic_scores_answers():
    env = Arithmetic()
    prompt = env.reset(3)[0]["content"]
    a, op, b = prompt[0], prompt[1], prompt[2]
    answer = int(a) + int(b) if op == "+" else int(a) - int(b)
    assert env.step(f"{answer}").info["outcome"] == "correct"
    env.reset(3)
    assert env.step(f"{answer + 1}").reward == 0.0
    env.reset(3)
    assert env.step("dunno").info["outcome"] == "unparseable"


def test_hints_name_the_broken_rule_or_the_best_moves_and_are_off_by_default():
    from artmlx.envs.tictactoe import TicTacToe

    env = TicTacToe(hints=True)
    env.reset(0)
    result = env.step("5")
    while not result.done:
        taken = next(c for c, v in enumerate(env.board) if v != ".")
        result = env.step(str(taken + 1))  # an occupied cell: illegal
    assert result.info["outcome"] == "illegal"
    assert result.info["hint"].startswith(f"That move was illegal: cell {taken + 1} was already taken.")
    empty = [str(c + 1) for c, v in enumerate(env.board) if v == "."]
    assert result.info["hint"].endswith(f"({', '.join(empty)}).")
    env.reset(0)
    assert env.step("no move").info["hint"].startswith("That move was illegal: the reply named no cell.")

    lost = TicTacToe(opponent="perfect", hints=True)
    for seed in range(20):
        lost.reset(seed)
        result = lost.step("2")
        while not result.done:
            result = lost.step(str(next(c for c, v in enumerate(lost.board) if v == ".") + 1))
        if result.info["outcome"] == "loss":
            assert result.info["hint"].startswith("You lost. From your last position the best move")
            break
    else:
        raise AssertionError("no loss against the perfect opponent in 20 games")
    plain = TicTacToe()
    plain.reset(0)
    assert "hint" not in plain.step("no move").info
