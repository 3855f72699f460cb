"""Server side of the TextArena environment."""

from .textarena_environment import TextArenaEnvironment

__all__ = ["TextArenaEnvironment"]
