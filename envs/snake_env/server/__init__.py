"""Server side of the Snake environment: the environment class and its app (``server.app``)."""

from .snake_environment import SnakeEnvironment

__all__ = ["SnakeEnvironment"]
