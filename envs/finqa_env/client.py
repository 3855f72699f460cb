"""Client of the FinQA environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.mcp_client import MCPToolClient

from .models import FinQAState


class FinQAEnv(MCPToolClient):
    """Talks to a FinQA environment server.

    ``reset()`` poses a question (``observation.metadata["question"]`` and ``["company"]``);
    ``step(CallToolAction(...))`` calls a tool and carries the reward and ``done`` (set by
    ``submit_answer``); ``list_tools()`` and ``call_tool(name, **arguments)`` call tools directly
    (their value only: read the outcome from ``state()``).
    """

    def _parse_state(self, payload: Dict[str, Any]) -> FinQAState:
        return FinQAState.model_validate(payload)
