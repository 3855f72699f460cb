"""Server side of the Grid World environment: the environment class and its app (``server.app``)."""

from .grid_world_environment import GridWorldEnvironment

__all__ = ["GridWorldEnvironment"]
