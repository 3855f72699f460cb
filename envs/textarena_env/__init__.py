"""The TextArena environment: Wordle, GuessTheNumber and Mastermind as text games."""

from .client import TextArenaEnv
from .models import TextArenaAction, TextArenaMessage, TextArenaObservation, TextArenaState

__all__ = ["TextArenaAction", "TextArenaEnv", "TextArenaMessage", "TextArenaObservation", "TextArenaState"]
