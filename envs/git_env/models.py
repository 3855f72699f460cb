"""Models of the git environment.

Actions are MCP tool calls (:class:`CallToolAction`, :class:`ListToolsAction`); a tool call's
observation is a :class:`CallToolObservation`. ``reset`` answers with a :class:`GitObservation`.
"""

from __future__ import annotations

from shell_env.models import ShellObservation, ShellState

from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation, ListToolsAction


class GitObservation(ShellObservation):
    """The task of a new episode: ``task_id``, ``instruction``, the repository's ``files`` (outside
    ``.git``) and the ``tools``."""


class GitState(ShellState):
    """Episode bookkeeping: ``task_id``, ``max_steps``, ``submitted``, ``passed``."""


__all__ = ["CallToolAction", "CallToolObservation", "GitObservation", "GitState", "ListToolsAction"]
