"""Grid World: an agent walks UP/DOWN/LEFT/RIGHT past walls and pits to a goal."""

from .client import GridWorldEnv
from .models import GridWorldAction, GridWorldObservation, GridWorldState, MoveAction

__all__ = ["GridWorldAction", "GridWorldEnv", "GridWorldObservation", "GridWorldState", "MoveAction"]
