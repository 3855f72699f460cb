"""Snake: classic snake on a grid with seeded fruit."""

from .client import SnakeEnv
from .models import SnakeAction, SnakeObservation, SnakeState

__all__ = ["SnakeAction", "SnakeEnv", "SnakeObservation", "SnakeState"]
