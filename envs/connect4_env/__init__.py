"""Connect Four (6x7) against a random or greedy opponent, as an OpenEnv environment."""

from .client import Connect4Env
from .models import Connect4Action, Connect4Observation, Connect4State

__all__ = ["Connect4Action", "Connect4Env", "Connect4Observation", "Connect4State"]
