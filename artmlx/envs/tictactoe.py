"""Tic-tac-toe: the agent plays X and moves first against a random or a perfect (minimax) O.

Each user message is the board with every cell written next to its number (`1X 2. 3O 4. ...`);
at the tiny model's size that encoding is learned far faster than a 3x3 grid. The
agent replies with a cell number; the first digit 1-9 in its reply is the move. A reply without
one, or naming an occupied cell, ends the game as `illegal` with the lowest reward.

Rewards (defaults): win 1, draw 0.5, loss 0, illegal -0.5. `score` is 1 for a win or a draw.

`style="grid"` poses the game for a real instruct model instead: the rules in words and the board
as a 3 x 3 grid whose empty cells show their numbers (`render_grid`); the reply is parsed the same way.

`hints=True` gives a lost or illegal game a directive hint (`learner/distill.py`): the rule the move
broke ("cell 5 was already taken", with the empty cells), or the best moves of the position X last
moved in (minimax).
"""

from __future__ import annotations

import functools
import random
import re

from .answers import check_flag
from .base import StepResult

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
INSTRUCTION = "Play X: reply with an empty cell.\n"
_MOVE = re.compile(r"[1-9]")


def winner(board: str) -> str | None:
    """'X' or 'O' if that side has three in a row, else None. `board` is 9 chars of 'X', 'O', '.'."""
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return None


def render(board: str) -> str:
    return " ".join(f"{i + 1}{cell}" for i, cell in enumerate(board))


GRID_INSTRUCTION = ("We are playing tic-tac-toe. You are X and I am O; three in a row wins. "
                    "Empty cells show their number. Reply with the number of the cell for your X.\n\n")


def render_grid(board: str) -> str:
    """The board as a 3 x 3 grid, an empty cell showing its number."""
    cells = [str(i + 1) if cell == "." else cell for i, cell in enumerate(board)]
    return "\n---+---+---\n".join(" " + " | ".join(cells[r * 3 : r * 3 + 3]) for r in range(3))


def parse_move(text: str) -> int | None:
    """Cell index 0-8 from the first digit 1-9 in `text`, or None."""
    match = _MOVE.search(text)
    return int(match.group()) - 1 if match else None


def place(board: str, cell: int, mark: str) -> str:
    return board[:cell] + mark + board[cell + 1 :]


@functools.lru_cache(maxsize=None)
def minimax_value(board: str, to_move: str) -> int:
    """Game value for X under perfect play: +1 X wins, 0 draw, -1 O wins."""
    won = winner(board)
    if won:
        return 1 if won == "X" else -1
    if "." not in board:
        return 0
    nxt = "O" if to_move == "X" else "X"
    values = [minimax_value(place(board, c, to_move), nxt) for c, v in enumerate(board) if v == "."]
    return max(values) if to_move == "X" else min(values)


def perfect_moves(board: str, mark: str) -> list[int]:
    """All optimal moves for `mark` (ties kept, so a perfect opponent still varies its play)."""
    nxt = "O" if mark == "X" else "X"
    scored = {c: minimax_value(place(board, c, mark), nxt) for c, v in enumerate(board) if v == "."}
    best = max(scored.values()) if mark == "X" else min(scored.values())
    return [c for c, value in scored.items() if value == best]


class TicTacToe:
    """Agent is X, opponent O is `random` or `perfect`; see the module docstring for rewards."""

    name = "tictactoe"
    outcomes = ("win", "draw", "loss", "illegal")

    def __init__(
        self,
        opponent: str = "random",
        reward_win: float = 1.0,
        reward_draw: float = 0.5,
        reward_loss: float = 0.0,
        reward_illegal: float = -0.5,
        style: str = "cells",
        hints: bool = False,
    ):
        if opponent not in ("random", "perfect"):
            raise ValueError(f"tictactoe opponent must be 'random' or 'perfect', got {opponent!r}")
        if style not in ("cells", "grid"):
            raise ValueError(f"tictactoe style must be 'cells' (the tiny model's) or 'grid' (an instruct model's), "
                             f"got {style!r}")
        self.style, self.hints = style, check_flag("hints", hints)
        self.before = "." * 9  # the position X last moved in (a hint names its best moves)
        self.opponent = opponent
        self.rewards = {"win": reward_win, "draw": reward_draw, "loss": reward_loss, "illegal": reward_illegal}
        self.board = "." * 9
        self.rng = random.Random(0)
        self.done = True

    def reset(self, seed: int) -> list[dict]:
        self.board = "." * 9
        self.rng = random.Random(seed)
        self.done = False
        if self.style == "grid":
            return [{"role": "user", "content": GRID_INSTRUCTION + render_grid(self.board)}]
        return [{"role": "user", "content": INSTRUCTION + render(self.board)}]

    def _opponent_move(self) -> int:
        if self.opponent == "perfect":
            return self.rng.choice(perfect_moves(self.board, "O"))
        return self.rng.choice([c for c, v in enumerate(self.board) if v == "."])

    def _end(self, outcome: str, move: int | None) -> StepResult:
        self.done = True
        info = {"outcome": outcome, "score": float(outcome in ("win", "draw")), "move": move}
        if self.hints and outcome in ("illegal", "loss"):
            info["hint"] = self.hint(outcome, move)
        return StepResult([], self.rewards[outcome], True, info)

    def hint(self, outcome: str, move: int | None) -> str:
        """The rule a move broke, or the moves that were best where X lost (a directive hint)."""
        empty = ", ".join(str(c + 1) for c, v in enumerate(self.board) if v == ".")
        if outcome == "illegal":
            broken = ("the reply named no cell" if move is None else f"cell {move + 1} was already taken")
            return f"That move was illegal: {broken}. Reply with the number of an empty cell ({empty})."
        best = sorted(perfect_moves(self.before, "X"))
        moves = (f"move was cell {best[0] + 1}" if len(best) == 1
                 else f"moves were cells {', '.join(str(c + 1) for c in best)}")
        return f"You lost. From your last position the best {moves}."

    def step(self, assistant_text: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset() first")
        move = parse_move(assistant_text)
        if move is None or self.board[move] != ".":
            return self._end("illegal", move)
        self.before = self.board
        self.board = place(self.board, move, "X")
        if winner(self.board):
            return self._end("win", move)
        if "." not in self.board:
            return self._end("draw", move)
        self.board = place(self.board, self._opponent_move(), "O")
        if winner(self.board):
            return self._end("loss", move)
        if "." not in self.board:
            return self._end("draw", move)
        board = render_grid(self.board) + "\nYour move." if self.style == "grid" else render(self.board)
        return StepResult([{"role": "user", "content": board}], 0.0, False, {"move": move})
