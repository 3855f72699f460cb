"""A small MCP environment for the interop check: two FastMCP tools, ``add`` and ``shout``.

Written only against the public API that OpenEnv 0.10 and this implementation share. Serve with
``python -m uvicorn mcp_app:app --port P`` from this directory, under either core.

Every tool invocation (through ``step``, ``tools/call`` or a ``{"type": "mcp"}`` frame) counts as
one step of the episode: ``state.step_count`` is the number of tool calls since ``reset``.
"""

from __future__ import annotations

from typing import Any, Optional

from fastmcp import FastMCP

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State

READY = "mcp interop ready"


class InteropMCPEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("interop_mcp")

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two integers."""
            self._state.step_count += 1
            return a + b

        @mcp.tool()
        def shout(text: str) -> str:
            """Upper-case a text."""
            self._state.step_count += 1
            return text.upper()

        super().__init__(mcp)
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(done=False, reward=0.0, metadata={"message": READY})

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"unsupported action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    InteropMCPEnvironment,
    CallToolAction,
    CallToolObservation,
    env_name="interop_mcp",
    max_concurrent_envs=4,
)
