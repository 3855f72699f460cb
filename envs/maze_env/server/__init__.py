"""Server side of the Maze environment: the environment class and its app (``server.app``)."""

from .maze_environment import MazeEnvironment

__all__ = ["MazeEnvironment"]
