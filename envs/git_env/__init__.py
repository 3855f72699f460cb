"""The git environment: git tasks on a throwaway local repository, through MCP tools."""

from .client import GitEnv
from .models import CallToolAction, CallToolObservation, GitObservation, GitState, ListToolsAction

__all__ = ["CallToolAction", "CallToolObservation", "GitEnv", "GitObservation", "GitState", "ListToolsAction"]
