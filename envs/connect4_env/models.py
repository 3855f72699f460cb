"""What an agent sends to the Connect Four environment and what it sees back.

``Connect4Action(column)``, ``Connect4Observation(board, legal_actions)`` and the state's
``board``/``next_player`` are upstream OpenEnv's names; the other fields are additions.
"""

from __future__ import annotations

from typing import List, Optional

from pydantic import Field

from openenv.core.env_server.types import Action, Observation, State


class Connect4Action(Action):
    """Drop a piece into ``column`` (0-6, left to right)."""

    column: int


class Connect4Observation(Observation):
    """The board as the player to move sees it.

    ``board`` is 6 rows of 7 cells, top row first: ``1`` = the agent's pieces, ``-1`` = the
    opponent's, ``0`` = empty. ``legal_actions`` lists the columns that are not full. ``text``
    draws the board (``X`` = you, ``O`` = opponent). ``opponent_last_column`` is where the
    opponent's last piece went. ``winner`` is ``1`` (agent), ``-1`` (opponent) or ``0`` (draw)
    once the game is over. ``error`` says why a move was refused (the board is then unchanged).
    """

    board: List[List[int]] = Field(default_factory=list)
    legal_actions: List[int] = Field(default_factory=list)
    text: str = ""
    opponent_last_column: Optional[int] = None
    winner: Optional[int] = None
    error: Optional[str] = None


class Connect4State(State):
    """The game from above: ``board`` has ``1`` for the first player's pieces and ``-1`` for the
    second's; ``next_player`` is whose turn it is (``1`` or ``-1``); ``agent_player`` the agent's
    colour; ``moves`` every column played, in order."""

    board: List[List[int]] = Field(default_factory=list)
    next_player: int = 1
    agent_player: int = 1
    opponent: str = "random"
    moves: List[int] = Field(default_factory=list)
    winner: Optional[int] = None
    seed: Optional[int] = None
