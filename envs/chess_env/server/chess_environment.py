"""Chess against a built-in opponent, with python-chess.

The agent plays one colour (``agent_color``, default white); after each of its moves the
opponent answers: ``random`` or ``minimax`` (a material alpha-beta search of ``opponent_depth``
plies, default 2). Moves are accepted in UCI or SAN.

Reward: +1 when the agent wins, -1 when it loses, 0 for a draw and for every other move. A move
that is illegal or cannot be parsed gets ``ILLEGAL_MOVE_PENALTY`` (-0.1) and an ``error``; the
position is unchanged and the game goes on. After ``max_plies`` half-moves (default 500) the game
ends as a draw. The terminal observation's metadata carries ``discounted_rewards``: the final
reward spread back over the agent's moves as ``gamma ** (T - 1 - t) * R`` (``gamma`` 0.99).

``reset(seed=s)`` seeds the opponent's choices, so the same seed and moves replay the same game.
``reset(fen=...)`` starts from a given position. Defaults: ``CHESS_OPPONENT`` (``minimax``),
``CHESS_OPPONENT_DEPTH`` (2), ``CHESS_MAX_PLIES`` (500), ``CHESS_AGENT_COLOR`` (``white``).
"""

from __future__ import annotations

import os
import random
from typing import Any, List, Optional
from uuid import uuid4

import chess
import chess.svg

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

try:
    from ..models import ChessAction, ChessObservation, ChessState
    from .opponents import OPPONENTS, choose
except ImportError:  # served from the package directory as `server.app:app`
    from models import ChessAction, ChessObservation, ChessState  # type: ignore[no-redef]
    from server.opponents import OPPONENTS, choose  # type: ignore[no-redef]

ILLEGAL_MOVE_PENALTY = -0.1
GAMMA = 0.99
MAX_OPPONENT_DEPTH = 3
_COLORS = {"white": chess.WHITE, "black": chess.BLACK}


def ascii_board(board: chess.Board) -> str:
    """The board from White's side, ranks 8 to 1, with file letters and rank numbers."""
    rows = [f"{8 - i} {line}" for i, line in enumerate(str(board).splitlines())]
    return "\n".join([*rows, "  a b c d e f g h"])


def parse_move(board: chess.Board, text: str) -> chess.Move:
    """The legal move ``text`` names, in UCI or SAN; ``ValueError`` saying why when there is none."""
    text = text.strip()
    try:
        move = chess.Move.from_uci(text)
    except ValueError:
        move = None
    if move is not None and move in board.legal_moves:
        return move
    try:
        return board.parse_san(text)
    except chess.AmbiguousMoveError:
        raise ValueError(f"ambiguous move {text!r}: say which piece moves (e.g. Nbd2) or use UCI") from None
    except chess.IllegalMoveError:
        raise ValueError(f"illegal move {text!r} in this position") from None
    except ValueError:
        if move is not None:
            raise ValueError(f"illegal move {text!r} in this position") from None
        raise ValueError(f"cannot read move {text!r}: give it in UCI (e2e4) or SAN (e4, Nf3, O-O)") from None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


class ChessEnvironment(Environment[ChessAction, ChessObservation, ChessState]):
    """Chess, the agent against a built-in opponent; see the module docstring.

    Snapshots save the game as python-chess itself writes it: the position the game started from
    (its FEN, with the en-passant square as the board holds it) and every move since, in UCI; a
    restore replays them onto a new board, so its move stack, and with it the repetition and
    fifty-move history that draw claims read, is the original's. With it: the opponent's seeded
    generator (its next choices), its last move, the agent's move count, the termination and the
    state, and the session's defaults.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True

    def __init__(self) -> None:
        super().__init__()
        self.default_opponent = os.environ.get("CHESS_OPPONENT") or "minimax"
        self.default_depth = _env_int("CHESS_OPPONENT_DEPTH", 2)
        self.default_max_plies = _env_int("CHESS_MAX_PLIES", 500)
        self.default_color = os.environ.get("CHESS_AGENT_COLOR") or "white"
        self._board: Optional[chess.Board] = None
        self._rng = random.Random()
        self._opponent_move: Optional[chess.Move] = None
        self._opponent_san = ""
        self._agent_moves = 0
        self._termination: Optional[str] = None
        self._state = ChessState(opponent=self.default_opponent, agent_color=self.default_color)

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        opponent: Optional[str] = None,
        opponent_depth: Optional[int] = None,
        agent_color: Optional[str] = None,
        max_plies: Optional[int] = None,
        fen: Optional[str] = None,
        **kwargs: Any,
    ) -> ChessObservation:
        """A new game (from ``fen`` if given); when the opponent's colour is to move, it moves first."""
        if kwargs:
            raise ValueError(
                f"unknown reset options {sorted(kwargs)}: accepted are seed, episode_id, opponent, "
                "opponent_depth, agent_color, max_plies, fen"
            )
        opponent = (opponent or self.default_opponent).lower()
        if opponent not in OPPONENTS:
            raise ValueError(f"unknown opponent {opponent!r}: choose one of {', '.join(OPPONENTS)}")
        depth = self.default_depth if opponent_depth is None else opponent_depth
        if not 1 <= depth <= MAX_OPPONENT_DEPTH:
            raise ValueError(f"opponent_depth must be 1..{MAX_OPPONENT_DEPTH}, got {depth}")
        color = (agent_color or self.default_color).lower()
        if color not in _COLORS:
            raise ValueError(f"agent_color must be 'white' or 'black', got {color!r}")
        plies = self.default_max_plies if max_plies is None else max_plies
        if plies < 1:
            raise ValueError(f"max_plies must be at least 1, got {plies}")
        board = chess.Board()
        if fen is not None:
            try:
                board = chess.Board(fen)
            except ValueError as exc:
                raise ValueError(f"bad fen {fen!r}: {exc}") from None
            if not board.is_valid():
                raise ValueError(f"fen {fen!r} is not a legal position ({board.status()!r})")
        self._board = board
        self._rng = random.Random(seed if seed is not None else random.SystemRandom().getrandbits(64))
        self._opponent_move = None
        self._agent_moves = 0
        self._termination = None
        self._state = ChessState(
            episode_id=episode_id or str(uuid4()),
            fen=board.fen(),
            start_fen=board.fen(),
            agent_color=color,
            opponent=opponent,
            opponent_depth=depth,
            max_plies=plies,
            seed=seed,
        )
        if not self._check_over() and board.turn != _COLORS[color]:
            self._opponent_turn()
        return self._observe(reward=0.0)

    def step(self, action: ChessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> ChessObservation:
        """Play the agent's move, then the opponent's answer."""
        board = self._board
        if board is None:
            return ChessObservation(reward=0.0, error="no game is running: call reset() first")
        self._state.step_count += 1
        if self._state.result != "*":
            return self._observe(reward=0.0, error="the game is over: call reset() to start a new one")
        try:
            move = parse_move(board, action.move)
        except ValueError as exc:
            return self._observe(reward=ILLEGAL_MOVE_PENALTY, error=str(exc))
        self._opponent_move = None
        self._push(move)
        self._agent_moves += 1
        if not self._check_over():
            self._opponent_turn()
        return self._observe(reward=self._final_reward())

    @property
    def state(self) -> ChessState:
        return self._state

    def snapshot_state(self) -> Any:
        data = super().snapshot_state()
        board: Optional[chess.Board] = data.pop("_board")
        data["_board"] = None
        if board is not None:
            data["_board"] = {
                "start": board.root().fen(en_passant="fen"),
                "chess960": board.chess960,
                "moves": [move.uci() for move in board.move_stack],
            }
        move: Optional[chess.Move] = data.pop("_opponent_move")
        data["_opponent_move"] = None if move is None else move.uci()
        return data

    def restore_state(self, data: Any) -> None:
        data = dict(data)
        saved = data.pop("_board")
        board = None
        if saved is not None:
            board = chess.Board(saved["start"], chess960=saved["chess960"])
            for uci in saved["moves"]:
                board.push(chess.Move.from_uci(uci))
        move = data.pop("_opponent_move")
        super().restore_state(
            {**data, "_board": board, "_opponent_move": None if move is None else chess.Move.from_uci(move)}
        )

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="chess_env",
            description="Chess against a random or minimax opponent; UCI or SAN moves; +1 win, 0 draw, -1 loss",
            version="0.1.0",
        )

    # --- the web playground -------------------------------------------------------------------

    def render_web(self, observation: dict) -> Optional[str]:
        """The board as SVG (from the agent's side), the opponent's last move marked."""
        try:
            board = chess.Board(observation.get("fen") or chess.STARTING_FEN)
        except ValueError:
            return None
        last = observation.get("opponent_move")
        lastmove = chess.Move.from_uci(last) if last and len(last) in (4, 5) else None
        flipped = observation.get("agent_color") == "black"
        check = board.king(board.turn) if board.is_check() else None
        return chess.svg.board(board, size=400, flipped=flipped, lastmove=lastmove, check=check)

    def web_actions(self, observation: dict) -> List[tuple]:
        """Every legal move, a button each (labelled in SAN, sent in UCI)."""
        moves = observation.get("legal_moves") or []
        sans = observation.get("legal_moves_san") or moves
        return [(san, {"move": uci}) for uci, san in zip(moves, sans, strict=False)]

    # --- the game -----------------------------------------------------------------------------

    def _push(self, move: chess.Move) -> None:
        self._board.push(move)
        self._state.move_history.append(move.uci())
        self._state.fen = self._board.fen()

    def _opponent_turn(self) -> None:
        move = choose(self._state.opponent, self._board, self._rng, self._state.opponent_depth)
        self._opponent_san = self._board.san(move)
        self._opponent_move = move
        self._push(move)
        self._check_over()

    def _check_over(self) -> bool:
        outcome = self._board.outcome(claim_draw=True)
        if outcome is not None:
            self._state.result = outcome.result()
            self._termination = outcome.termination.name.lower()
        elif len(self._state.move_history) >= self._state.max_plies:
            self._state.result = "1/2-1/2"
            self._termination = "max_plies"
        return self._state.result != "*"

    def _final_reward(self) -> float:
        result = self._state.result
        if result in ("*", "1/2-1/2"):
            return 0.0
        white_won = result == "1-0"
        return 1.0 if white_won == (self._state.agent_color == "white") else -1.0

    # --- observations -------------------------------------------------------------------------

    def _observe(self, reward: float, error: Optional[str] = None) -> ChessObservation:
        board = self._board
        over = self._state.result != "*"
        legal: List[chess.Move] = [] if over else list(board.legal_moves)
        sans = [board.san(m) for m in legal]
        picture = ascii_board(board)
        color = self._state.agent_color
        lines = []
        if error:
            lines.append(f"Error: {error}.")
        if self._opponent_move is not None:
            lines.append(f"Opponent played {self._opponent_move.uci()} ({self._opponent_san}).")
        lines += [f"You play {color.capitalize()}.", picture, f"FEN: {board.fen()}"]
        metadata = {}
        if over:
            lines.append(f"Game over: {self._state.result} ({self._termination}).")
            final = self._final_reward()
            n = self._agent_moves
            metadata = {"discounted_rewards": [GAMMA ** (n - 1 - t) * final for t in range(n)], "gamma": GAMMA}
        else:
            if board.is_check():
                lines.append("You are in check.")
            lines.append("Legal moves: " + " ".join(sans))
        return ChessObservation(
            fen=board.fen(),
            legal_moves=[m.uci() for m in legal],
            legal_moves_san=sans,
            is_check=board.is_check(),
            result=self._state.result,
            termination=self._termination,
            ascii_board=picture,
            agent_color=color,
            opponent_move=None if self._opponent_move is None else self._opponent_move.uci(),
            text="\n".join(lines),
            error=error,
            reward=reward,
            done=over,
            metadata=metadata,
        )
