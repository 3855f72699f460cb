"""The FinQA environment: financial questions answered with SQL over MCP tools."""

from .client import FinQAEnv
from .models import AVAILABLE_TOOLS, CallToolAction, CallToolObservation, FinQAState, ListToolsAction

__all__ = ["AVAILABLE_TOOLS", "CallToolAction", "CallToolObservation", "FinQAEnv", "FinQAState", "ListToolsAction"]
