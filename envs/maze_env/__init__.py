"""Maze: find the exit of a maze generated from the seed."""

from .client import MazeEnv
from .models import MazeAction, MazeObservation, MazeState

__all__ = ["MazeAction", "MazeEnv", "MazeObservation", "MazeState"]
