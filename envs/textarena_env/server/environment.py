"""Upstream's import path: ``from textarena_env.server.environment import TextArenaEnvironment``."""

from .textarena_environment import TextArenaEnvironment

__all__ = ["TextArenaEnvironment"]
