"""Models of the shell environment.

Actions are MCP tool calls (:class:`CallToolAction`, :class:`ListToolsAction`); a tool call's
observation is a :class:`CallToolObservation`. ``reset`` answers with a :class:`ShellObservation`.
"""

from __future__ import annotations

from typing import List

from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation, ListToolsAction
from openenv.core.env_server.types import Observation, State


class ShellObservation(Observation):
    """The task of a new episode: what to do, and the files the work directory starts with."""

    task_id: str = ""
    instruction: str = ""
    files: List[str] = []
    tools: List[str] = []


class ShellState(State):
    """Episode bookkeeping: the task, the step budget, and whether (and how) it was submitted."""

    task_id: str = ""
    max_steps: int = 0
    submitted: bool = False
    passed: bool = False


__all__ = ["CallToolAction", "CallToolObservation", "ListToolsAction", "ShellObservation", "ShellState"]
