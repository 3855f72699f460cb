"""The echo environment: MCP tools that echo a message back."""

from .client import EchoEnv
from .models import CallToolAction, CallToolObservation, EchoObservation, ListToolsAction

__all__ = ["CallToolAction", "CallToolObservation", "EchoEnv", "EchoObservation", "ListToolsAction"]
