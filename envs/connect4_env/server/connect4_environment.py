"""Connect Four against a built-in opponent.

The agent drops pieces into a 6x7 board; after each of its moves the opponent (``random`` or
``greedy``, chosen at reset) answers. Reward: +1 when the agent connects four, -1 when the
opponent does, 0 for a draw (full board) and for every other move. A move into a full or
non-existent column is refused: the board is unchanged, ``error`` says why and the reward is
``ILLEGAL_MOVE_PENALTY`` (-0.1); the game goes on.

``reset(seed=s)`` seeds the opponent's choices, so the same seed and moves replay the same game.
Defaults: ``CONNECT4_OPPONENT`` (``random``); the agent plays first unless
``reset(agent_player=-1)``.
"""

from __future__ import annotations

import os
import random
from typing import Any, List, Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

try:
    from ..models import Connect4Action, Connect4Observation, Connect4State
    from .board import COLUMNS, OPPONENTS, Board, choose, winner_of
except ImportError:  # served from the package directory as `server.app:app`
    from models import Connect4Action, Connect4Observation, Connect4State  # type: ignore[no-redef]
    from server.board import COLUMNS, OPPONENTS, Board, choose, winner_of  # type: ignore[no-redef]

ILLEGAL_MOVE_PENALTY = -0.1


class Connect4Environment(Environment[Connect4Action, Connect4Observation, Connect4State]):
    """Connect Four, the agent against a built-in opponent; see the module docstring."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True  # its state is plain Python data: the default snapshot_state carries it exactly
    RUNS_ON_EVENT_LOOP = True  # short pure-Python calls that never block: spare the thread hand-offs

    def __init__(self, opponent: Optional[str] = None) -> None:
        super().__init__()
        self.default_opponent = opponent or os.environ.get("CONNECT4_OPPONENT") or "random"
        self._board: Optional[Board] = None
        self._rng = random.Random()
        self._opponent_last: Optional[int] = None
        self._state = Connect4State(opponent=self.default_opponent)

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        opponent: Optional[str] = None,
        agent_player: int = 1,
        **kwargs: Any,
    ) -> Connect4Observation:
        """A new game against ``opponent``; with ``agent_player=-1`` the opponent moves first."""
        if kwargs:
            raise ValueError(
                f"unknown reset options {sorted(kwargs)}: accepted are seed, episode_id, opponent, agent_player"
            )
        opponent = (opponent or self.default_opponent).lower()
        if opponent not in OPPONENTS:
            raise ValueError(f"unknown opponent {opponent!r}: choose one of {', '.join(OPPONENTS)}")
        if agent_player not in (1, -1):
            raise ValueError(f"agent_player must be 1 (moves first) or -1 (moves second), got {agent_player!r}")
        self._board = Board()
        self._rng = random.Random(seed if seed is not None else random.SystemRandom().getrandbits(64))
        self._opponent_last = None
        self._state = Connect4State(
            episode_id=episode_id or str(uuid4()),
            board=self._board.cells,
            next_player=1,
            agent_player=agent_player,
            opponent=opponent,
            seed=seed,
        )
        if agent_player == -1:
            self._opponent_move()
        return self._observe(reward=0.0)

    def step(self, action: Connect4Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Connect4Observation:
        """Drop the agent's piece in ``action.column``, then let the opponent answer."""
        board = self._board
        if board is None:
            return Connect4Observation(reward=0.0, error="no game is running: call reset() first")
        self._state.step_count += 1
        if self._state.winner is not None:
            return self._observe(reward=0.0, error="the game is over: call reset() to start a new one")
        legal = board.legal_columns()
        if action.column not in legal:
            why = "is full" if 0 <= action.column < COLUMNS else f"does not exist (columns are 0-{COLUMNS - 1})"
            return self._observe(
                reward=ILLEGAL_MOVE_PENALTY,
                error=f"illegal move: column {action.column} {why}; legal columns are {legal}",
            )
        self._opponent_last = None
        if self._play(action.column) is None:
            self._opponent_move()
        winner = self._state.winner
        return self._observe(reward=0.0 if winner is None else float(winner * self._state.agent_player))

    @property
    def state(self) -> Connect4State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="connect4_env",
            description="Connect Four (6x7) against a random or greedy opponent; +1 win, 0 draw, -1 loss",
            version="0.1.0",
        )

    # --- the web playground -------------------------------------------------------------------

    def render_web(self, observation: dict) -> Optional[str]:
        """The board: yellow discs are the agent's, red the opponent's."""
        colours = {1: "#f2c40f", -1: "#d63a2f", 0: "#fff"}
        rows = "".join(
            "<tr>" + "".join(f'<td style="background:{colours.get(cell, "#fff")}"></td>' for cell in row) + "</tr>"
            for row in observation.get("board") or []
        )
        head = "".join(f"<th>{column}</th>" for column in range(len((observation.get("board") or [[]])[0])))
        style = (
            "table{border-collapse:separate;border-spacing:6px;background:#2553b8;border-radius:10px;padding:4px}"
            "td{width:42px;height:42px;border-radius:50%}th{color:#fff;font:14px sans-serif}"
        )
        return f"<style>{style}</style><table><tr>{head}</tr>{rows}</table>"

    def web_actions(self, observation: dict) -> List[tuple]:
        """A button per column that is not full."""
        return [(f"column {column}", {"column": column}) for column in observation.get("legal_actions") or []]

    def _play(self, column: int) -> Optional[int]:
        player = self._state.next_player
        row = self._board.drop(column, player)
        self._state.moves.append(column)
        self._state.next_player = -player
        self._state.winner = winner_of(self._board, row, column)
        self._state.board = self._board.cells
        return self._state.winner

    def _opponent_move(self) -> None:
        column = choose(self._state.opponent, self._board, self._state.next_player, self._rng)
        self._opponent_last = column
        self._play(column)

    def _observe(self, reward: float, error: Optional[str] = None) -> Connect4Observation:
        me = self._state.agent_player
        board = self._board
        winner = self._state.winner
        done = winner is not None
        lines = []
        if error:
            lines.append(f"Error: {error}.")
        if self._opponent_last is not None:
            lines.append(f"Opponent played column {self._opponent_last}.")
        lines.append(board.render(me))
        if done:
            outcome = {me: "You win.", -me: "You lose.", 0: "Draw: the board is full."}[winner]
            lines.append(f"Game over. {outcome}")
        else:
            lines.append(f"You are X. Legal columns: {board.legal_columns()}")
        return Connect4Observation(
            board=[[cell * me for cell in row] for row in board.cells],
            legal_actions=[] if done else board.legal_columns(),
            text="\n".join(lines),
            opponent_last_column=self._opponent_last,
            winner=None if winner is None else winner * me,
            error=error,
            reward=reward,
            done=done,
        )
