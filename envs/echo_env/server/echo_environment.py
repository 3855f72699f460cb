"""The echo environment: two MCP tools, ``echo_message`` and ``echo_with_length``.

A tool call that echoes a message earns ``0.1`` per character of that message.
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import uuid4

from fastmcp import FastMCP

from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation, State

try:
    from ..models import EchoObservation
except ImportError:  # served from the package directory as `server.app:app`
    from models import EchoObservation  # type: ignore[no-redef]

READY_MESSAGE = "Echo environment ready!"


class EchoLengthReward:
    """Reward of a tool call: 0.1 per character of the echoed message (0 for anything else)."""

    def __call__(self, action: Action, observation: Observation) -> float:
        if isinstance(action, CallToolAction) and getattr(observation, "error", None) is None:
            return 0.1 * len(str(action.arguments.get("message", "")))
        return 0.0

    def reset(self) -> None:
        pass


def _echo_tools() -> FastMCP:
    mcp = FastMCP("echo_env")

    # Instant tools: run_in_thread=False runs them on the event loop, without a worker thread.
    @mcp.tool(run_in_thread=False)
    def echo_message(message: str) -> str:
        """Echo back the provided message."""
        return message

    @mcp.tool(run_in_thread=False)
    def echo_with_length(message: str) -> dict:
        """Echo back the message together with its length."""
        return {"message": message, "length": len(message)}

    return mcp


# The tools keep no state of their own, so every session shares one FastMCP server: sessions are
# cheaper to open, and many concurrent sessions step faster (one server stays in the CPU's caches).
_TOOLS = _echo_tools()


class EchoEnvironment(MCPEnvironment):
    """Echoes messages back through MCP tools."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    # The session is plain data: the episode id, the step counter and the (stateless) rubric. The
    # default snapshot saves them; the tools keep nothing, and the shared FastMCP server is left
    # out by MCPEnvironment.
    SUPPORTS_SNAPSHOT = True

    def __init__(self) -> None:
        mcp = _TOOLS
        super().__init__(mcp)
        self.rubric = EchoLengthReward()
        self._episode_id = str(uuid4())
        self._steps = 0  # a plain counter: State is built when asked for (it validates assignments)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> EchoObservation:
        self._episode_id = episode_id or str(uuid4())
        self._steps = 0
        self._reset_rubric()
        return EchoObservation(echoed_message=READY_MESSAGE, message_length=0, reward=0.0, metadata={"status": "ready"})

    async def _after_mcp_action(self, action: Action, observation: Observation) -> Observation:
        self._steps += 1
        return await super()._after_mcp_action(action, observation)

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(
            metadata={"error": f"echo_env takes CallToolAction or ListToolsAction, not {type(action).__name__}"}
        )

    @property
    def state(self) -> State:
        return State(episode_id=self._episode_id, step_count=self._steps)
