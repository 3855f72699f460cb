"""Connect Four rules on a 6x7 board (row 0 at the top) and the two built-in opponents."""

from __future__ import annotations

import random
from typing import List, Optional

ROWS, COLUMNS = 6, 7
_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


class Board:
    """Cells hold ``1`` (first player), ``-1`` (second player) or ``0``."""

    def __init__(self) -> None:
        self.cells = [[0] * COLUMNS for _ in range(ROWS)]

    def copy(self) -> Board:
        other = Board()
        other.cells = [row[:] for row in self.cells]
        return other

    def legal_columns(self) -> List[int]:
        return [c for c in range(COLUMNS) if self.cells[0][c] == 0]

    def full(self) -> bool:
        return not self.legal_columns()

    def drop(self, column: int, player: int) -> int:
        """Put ``player``'s piece in ``column``; returns the row it lands in."""
        for row in range(ROWS - 1, -1, -1):
            if self.cells[row][column] == 0:
                self.cells[row][column] = player
                return row
        raise ValueError(f"column {column} is full")

    def connects_four(self, row: int, column: int) -> bool:
        """Whether the piece at (row, column) is part of four in a row."""
        player = self.cells[row][column]
        for dr, dc in _DIRECTIONS:
            count = 1
            for sign in (1, -1):
                r, c = row + sign * dr, column + sign * dc
                while 0 <= r < ROWS and 0 <= c < COLUMNS and self.cells[r][c] == player:
                    count += 1
                    r, c = r + sign * dr, c + sign * dc
            if count >= 4:
                return True
        return False

    def wins_with(self, column: int, player: int) -> bool:
        """Whether ``player`` would connect four by playing ``column``."""
        trial = self.copy()
        return trial.connects_four(trial.drop(column, player), column)

    def render(self, me: int) -> str:
        """The board drawn with ``X`` for ``me``, ``O`` for the other player, ``.`` for empty."""
        marks = {me: "X", -me: "O", 0: "."}
        lines = [" ".join(str(c) for c in range(COLUMNS))]
        lines += [" ".join(marks[v] for v in row) for row in self.cells]
        return "\n".join(lines)


OPPONENTS = ("random", "greedy")
"""``random``: a uniformly random legal column. ``greedy``: wins at once when it can, else blocks
the agent's immediate win, else avoids giving the agent one, preferring central columns."""


def choose(opponent: str, board: Board, player: int, rng: random.Random) -> int:
    """The column ``opponent`` plays for ``player``."""
    legal = board.legal_columns()
    if opponent == "random":
        return rng.choice(legal)
    for target in (player, -player):  # win, else block
        for column in legal:
            if board.wins_with(column, target):
                return column
    safe = [c for c in legal if not _gives_away(board, c, player)] or legal
    best = min(abs(c - COLUMNS // 2) for c in safe)
    return rng.choice([c for c in safe if abs(c - COLUMNS // 2) == best])


def _gives_away(board: Board, column: int, player: int) -> bool:
    after = board.copy()
    after.drop(column, player)
    return any(after.wins_with(c, -player) for c in after.legal_columns())


def winner_of(board: Board, row: Optional[int], column: int) -> Optional[int]:
    """The winner after a piece landed at (row, column): its player, 0 for a draw, None if play goes on."""
    if row is not None and board.connects_four(row, column):
        return board.cells[row][column]
    return 0 if board.full() else None
