"""Models of the echo environment."""

from __future__ import annotations

from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation, ListToolsAction
from openenv.core.env_server.types import Observation


class EchoObservation(Observation):
    """What ``reset`` returns: a greeting, and the length of the last echoed message."""

    echoed_message: str = ""
    message_length: int = 0


__all__ = ["CallToolAction", "CallToolObservation", "EchoObservation", "ListToolsAction"]
