"""Server side of the Gymnasium environment: the environment class and its app (``server.app``)."""

from .gymnasium_environment import ClassicControlEnvironment

__all__ = ["ClassicControlEnvironment"]
