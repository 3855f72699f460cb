"""Models of the FinQA environment. Actions are MCP tool calls; the tool names are upstream's."""

from __future__ import annotations

from typing import Optional

from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation, ListToolsAction
from openenv.core.env_server.types import State

AVAILABLE_TOOLS = ["get_descriptions", "get_table_info", "sql_query", "submit_answer"]


class FinQAState(State):
    """The episode: its question, how many tool calls it used, and (once over) the outcome.

    ``ground_truth`` stays ``None`` until the episode is over.
    """

    question_id: Optional[str] = None
    current_question: Optional[str] = None
    current_company: Optional[str] = None
    tool_calls: int = 0
    max_steps: int = 50
    done: bool = False
    submitted_answer: Optional[str] = None
    reward: Optional[float] = None
    ground_truth: Optional[str] = None


__all__ = ["AVAILABLE_TOOLS", "CallToolAction", "CallToolObservation", "FinQAState", "ListToolsAction"]
