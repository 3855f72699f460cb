"""An environment whose step is one conversational turn of an external agent harness (RFC 005).

:class:`HarnessEnvironment` is an :class:`~openenv.core.env_server.mcp_environment.MCPEnvironment`:
its own FastMCP tools are answered as usual (``ListToolsAction``, ``CallToolAction``), and each
:class:`HarnessAction` is a message to the harness, which runs its whole turn (model calls, tool
calls through the MCP bridge) and answers. ``reset`` gives the harness the environment's tools
(renamed where they collide with the harness's built-ins), serves them over the bridge and starts
it; a harness that dies or a turn past its time limit ends the episode with an observation that
says so (``error_type`` ``"harness_crashed"`` or ``"turn_timeout"``).

Unlike upstream, reset and error observations are unscored (``reward=None``): a reward of 0.0 there
would be a score nobody gave. A finished turn is scored by the rubric (0.0 without one, as every
environment's ``_apply_rubric``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from typing import Any, List, Optional, Union

from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import RESERVED_TOOL_NAMES, Tool
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.utils import run_async_safely, timeout_after

from .adapter import AgenticHarnessAdapter, response_from_events
from .bridge import HarnessMCPBridge, build_bridge_server
from .errors import HarnessError, HarnessNotRunningError, HarnessTurnTimeoutError
from .events import HarnessEvent, HarnessEventType, events_to_metadata

logger = logging.getLogger("openenv.harness")


class HarnessAction(Action):
    """A message to the harness: one turn."""

    message: str


class HarnessEnvironment(MCPEnvironment):
    """Runs an external harness through ``adapter``; ``mcp`` holds the environment's tools.

    ``mcp=None`` gives an empty FastMCP server (the harness has only its own tools). ``rubric``
    scores each finished turn; ``transform`` is applied to every observation. ``bridge_uds``: serve
    the tools on that Unix socket instead of ``127.0.0.1`` (what a sandboxed harness needs; the
    adapter gets an ``http+unix://`` URL). Constructing it starts nothing; ``reset`` does.
    """

    SUPPORTS_CONCURRENT_SESSIONS = False

    def __init__(
        self,
        adapter: AgenticHarnessAdapter,
        mcp: Any = None,
        rubric: Any = None,
        transform: Any = None,
        *,
        bridge_uds: Optional[Union[str, os.PathLike]] = None,
    ) -> None:
        if mcp is None:
            from fastmcp import FastMCP

            mcp = FastMCP("harness-env-tools")
        super().__init__(mcp, transform=transform)
        self.rubric = rubric
        self.adapter = adapter
        self.bridge_uds = os.fspath(bridge_uds) if bridge_uds is not None else None
        self._bridge: Optional[HarnessMCPBridge] = None
        self._running = False
        self._episode_id: Optional[str] = None
        self._step_count = 0
        self._trajectory: List[HarnessEvent] = []

    # --- state -------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return State(episode_id=self._episode_id, step_count=self._step_count)

    @property
    def trajectory(self) -> List[HarnessEvent]:
        """Every event of the episode so far (a copy)."""
        return list(self._trajectory)

    @property
    def bridge_url(self) -> Optional[str]:
        """Where the environment's tools are served to the harness this episode (None: not served)."""
        return self._bridge.url if self._bridge is not None else None

    # --- reset -------------------------------------------------------------------------------

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        return run_async_safely(self.reset_async(seed=seed, episode_id=episode_id, **kwargs))

    async def reset_async(
        self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any
    ) -> Observation:
        """Stop the last episode's harness and bridge, offer the tools anew and start the harness.

        The observation's metadata has ``episode_id`` and ``injected_tools`` (the names the
        harness was given). A failure tears down what was started and is raised."""
        await self._teardown()
        try:
            tools = await self._environment_tools()
            resolved = _resolve_tool_conflicts(tools, self.adapter.BUILTIN_TOOL_NAMES)
            bridge_url = None
            if resolved:
                renames = {new.name: old.name for new, old in zip(resolved, tools, strict=True) if new.name != old.name}
                served = await build_bridge_server(self.mcp_server, renames)
                self._bridge = HarnessMCPBridge(served, uds=self.bridge_uds)
                bridge_url = await self._bridge.start_async()
            await self.adapter.inject_tools(resolved, bridge_url)
            await self.adapter.start(self.adapter.config.working_directory)
        except BaseException:
            await self._teardown()
            raise
        self._episode_id = episode_id or str(uuid.uuid4())
        self._step_count = 0
        self._trajectory = []
        self._running = True
        await self._reset_rubric_async()
        observation = Observation(
            done=False,
            reward=None,
            metadata={"episode_id": self._episode_id, "injected_tools": [tool.name for tool in resolved]},
        )
        return self._apply_transform(observation)

    async def _environment_tools(self) -> List[Tool]:
        """The tools of the environment's FastMCP server (those of one server mode are not on it)."""
        try:
            listed = await self.mcp_server.list_tools()
        except Exception as exc:
            raise HarnessError(f"cannot list the environment's MCP tools: {exc}") from exc
        return [
            Tool(name=t.name, description=t.description or "", input_schema=t.parameters or {})
            for t in listed
            if t.name not in RESERVED_TOOL_NAMES
        ]

    # --- step --------------------------------------------------------------------------------

    async def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        if not isinstance(action, HarnessAction):
            raise TypeError(
                f"{type(self).__name__} takes HarnessAction, ListToolsAction or CallToolAction, "
                f"not {type(action).__name__}"
            )
        return await self._turn(action, timeout_s)

    async def _turn(self, action: HarnessAction, timeout_s: Optional[float]) -> Observation:
        if not self._running:
            raise HarnessNotRunningError("the harness is not running: call reset() to start an episode")
        limit = timeout_s if timeout_s is not None else self.adapter.config.session_timeout_s
        events: List[HarnessEvent] = []
        try:
            if not await self.adapter.is_alive():
                raise HarnessNotRunningError(f"harness {self.adapter.config.name!r} is no longer running")
            try:
                async with timeout_after(limit) as scope:
                    await _drain(self.adapter, action.message, events)
            except (TimeoutError, HarnessTurnTimeoutError) as exc:
                if isinstance(exc, HarnessTurnTimeoutError) or scope.expired():
                    message = str(exc) if isinstance(exc, HarnessTurnTimeoutError) else ""
                    return await self._end(events, "turn_timeout", message or f"the turn took longer than {limit:g} s")
                raise
            response = response_from_events(events)
        except HarnessError as exc:
            return await self._end(events, "harness_crashed", str(exc) or type(exc).__name__)
        except BaseException:
            self._trajectory.extend(events)
            await self._teardown()
            raise
        self._step_count += 1
        self._trajectory.extend(events)
        observation = Observation(
            done=response.done,
            reward=None,
            metadata={
                "response": response.response,
                "turn_events": events_to_metadata(events),
                "turn_number": self._step_count,
            },
        )
        observation.reward = await self._apply_rubric_async(action, observation)
        return self._apply_transform(observation)

    async def _end(self, events: List[HarnessEvent], error_type: str, message: str) -> Observation:
        """The episode's last observation after a failed turn: the harness is stopped."""
        events.append(HarnessEvent(type=HarnessEventType.ERROR, data={"message": message, "recoverable": False}))
        self._trajectory.extend(events)
        await self._teardown()
        observation = Observation(
            done=True,
            reward=None,
            metadata={"error": message, "error_type": error_type, "turn_events": events_to_metadata(events)},
        )
        return self._apply_transform(observation)

    # --- ending ------------------------------------------------------------------------------

    async def _teardown(self) -> None:
        """Stop the harness and the bridge; errors are logged (a teardown never hides another)."""
        self._running = False
        try:
            await self.adapter.stop()
        except Exception:
            logger.exception("stopping harness %r failed", self.adapter.config.name)
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            try:
                await bridge.stop_async()
            except HarnessError:
                logger.exception("stopping the MCP bridge failed")

    async def close_async(self) -> None:
        """Stop the harness and the bridge, then close the environment."""
        await self._teardown()
        super().close()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # an event loop already closed under us: nothing runs
            run_async_safely(self._teardown())
        super().close()


async def _drain(adapter: AgenticHarnessAdapter, message: str, events: List[HarnessEvent]) -> None:
    """Collect the turn's events into ``events`` (kept when the turn fails or times out)."""
    stream = adapter.send_message_streaming(message)
    try:
        async for event in stream:
            events.append(event)
            if event.type == HarnessEventType.TURN_COMPLETE:
                break
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _resolve_tool_conflicts(tools: List[Tool], builtin_names: Any) -> List[Tool]:
    from .tools import resolve_tool_conflicts

    return list(resolve_tool_conflicts(tools, builtin_names))


__all__ = ["HarnessAction", "HarnessEnvironment"]
