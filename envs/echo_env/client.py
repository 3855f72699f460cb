"""Client of the echo environment."""

from __future__ import annotations

from openenv.core.mcp_client import MCPToolClient


class EchoEnv(MCPToolClient):
    """Talks to an echo environment server.

    ``reset()`` greets with ``observation.echoed_message``; ``step(CallToolAction(...))`` calls a
    tool and returns its value in ``observation.result``; ``list_tools()`` and
    ``call_tool(name, **arguments)`` do the same without a step.
    """
