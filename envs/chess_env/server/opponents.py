"""Built-in chess opponents: a random mover and a small material minimax (alpha-beta)."""

from __future__ import annotations

import random
from typing import Optional

import chess

OPPONENTS = ("random", "minimax")
"""``random``: a uniformly random legal move. ``minimax``: a depth-limited alpha-beta search
over material (P=1, N=B=3, R=5, Q=9; mate beats any material), ties broken at random."""

_VALUES = {chess.PAWN: 1, chess.KNIGHT: 3, chess.BISHOP: 3, chess.ROOK: 5, chess.QUEEN: 9, chess.KING: 0}
_MATE = 1000


def material(board: chess.Board) -> int:
    """Material balance from the side to move's point of view."""
    score = 0
    for piece in board.piece_map().values():
        value = _VALUES[piece.piece_type]
        score += value if piece.color == board.turn else -value
    return score


def _negamax(board: chess.Board, depth: int, alpha: int, beta: int) -> int:
    if not any(board.generate_legal_moves()):
        return -_MATE - depth if board.is_check() else 0  # mates found sooner score higher
    if depth == 0:
        return material(board)
    best = -_MATE * 2
    for move in board.legal_moves:
        board.push(move)
        score = -_negamax(board, depth - 1, -beta, -alpha)
        board.pop()
        if score > best:
            best = score
        alpha = max(alpha, score)
        if alpha >= beta:
            break
    return best


def choose(opponent: str, board: chess.Board, rng: random.Random, depth: int = 2) -> chess.Move:
    """The move ``opponent`` plays in ``board`` (which must have a legal move)."""
    moves = list(board.legal_moves)
    rng.shuffle(moves)
    if opponent == "random":
        return moves[0]
    best_score: Optional[int] = None
    best_moves = []
    for move in moves:
        board.push(move)
        score = -_negamax(board, depth - 1, -_MATE * 2, _MATE * 2)
        board.pop()
        if best_score is None or score > best_score:
            best_score, best_moves = score, [move]
        elif score == best_score:
            best_moves.append(move)
    return best_moves[0]
