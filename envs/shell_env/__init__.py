"""The shell environment: shell tasks in a sandboxed work directory, through MCP tools."""

from .client import ShellEnv
from .models import CallToolAction, CallToolObservation, ListToolsAction, ShellObservation, ShellState

__all__ = ["CallToolAction", "CallToolObservation", "ListToolsAction", "ShellEnv", "ShellObservation", "ShellState"]
