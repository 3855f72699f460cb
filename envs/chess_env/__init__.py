"""Chess (python-chess) against a random or minimax opponent, as an OpenEnv environment."""

from .client import ChessEnv
from .models import ChessAction, ChessObservation, ChessState

__all__ = ["ChessAction", "ChessEnv", "ChessObservation", "ChessState"]
