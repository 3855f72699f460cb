"""What an agent sends to the chess environment and what it sees back.

``ChessAction(move)`` and the observation's ``fen``, ``legal_moves``, ``is_check`` and ``result``
are upstream OpenEnv's names; the other fields are additions.
"""

from __future__ import annotations

from typing import List, Optional

from pydantic import Field

from openenv.core.env_server.types import Action, Observation, State


class ChessAction(Action):
    """A move in UCI (``e2e4``, ``e7e8q``) or SAN (``e4``, ``Nf3``, ``O-O``, ``exd8=Q+``)."""

    move: str


class ChessObservation(Observation):
    """The position with the agent to move (or the final one).

    ``legal_moves`` are UCI strings and ``legal_moves_san`` the same moves in SAN, same order.
    ``result`` is ``"1-0"``, ``"0-1"`` or ``"1/2-1/2"`` once the game is over, else ``"*"``;
    ``termination`` says why it ended (``checkmate``, ``stalemate``, ``insufficient_material``,
    ``seventyfive_moves``, ``fivefold_repetition``, ``fifty_moves``, ``threefold_repetition``,
    ``max_plies``). ``ascii_board`` draws the board from White's side (upper case = White);
    ``text`` adds whose side the agent plays, the opponent's last move and the legal moves.
    ``error`` says why a move was refused (the position is then unchanged).
    """

    fen: str = ""
    legal_moves: List[str] = Field(default_factory=list)
    legal_moves_san: List[str] = Field(default_factory=list)
    is_check: bool = False
    result: str = "*"
    termination: Optional[str] = None
    ascii_board: str = ""
    agent_color: str = "white"
    opponent_move: Optional[str] = None
    text: str = ""
    error: Optional[str] = None


class ChessState(State):
    """The game: current ``fen``, the UCI ``move_history`` since the start position ``start_fen``,
    the agent's colour, the opponent, the ply limit and the result."""

    fen: str = ""
    start_fen: str = ""
    move_history: List[str] = Field(default_factory=list)
    agent_color: str = "white"
    opponent: str = "minimax"
    opponent_depth: int = 2
    max_plies: int = 500
    result: str = "*"
    seed: Optional[int] = None
