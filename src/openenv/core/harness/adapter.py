"""The contract between a :class:`~.environment.HarnessEnvironment` and one kind of agent harness.

An adapter knows how to start a harness (a CLI, an agent program), hand it the environment's tools
(:meth:`~AgenticHarnessAdapter.inject_tools`, before :meth:`~AgenticHarnessAdapter.start`), run one
conversational turn as a stream of :class:`~.events.HarnessEvent` and stop it. Everything else (the
MCP bridge, timeouts, episode bookkeeping, rewards) is the environment's, so an adapter stays small.
Concrete adapters: :mod:`.agentic_adapters`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import AsyncIterator, FrozenSet, List, Optional, Sequence

from openenv.core.env_server.mcp_types import Tool

from .config import HarnessConfig
from .errors import HarnessError
from .events import HarnessEvent, HarnessEventType, HarnessResponse


class AgenticHarnessAdapter(ABC):
    """Drives one external agent harness, one turn per :meth:`send_message`.

    ``BUILTIN_TOOL_NAMES`` are the names of the harness's own tools: an environment tool of the
    same name is offered to it renamed (``env_<name>``, see ``resolve_tool_conflicts``).
    :meth:`stop` must be idempotent and safe before :meth:`start`.
    """

    BUILTIN_TOOL_NAMES: FrozenSet[str] = frozenset()

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config

    @abstractmethod
    async def start(self, working_directory: str) -> None:
        """Start the harness in ``working_directory`` (failure: ``HarnessStartupError``)."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop the harness and release what it holds; idempotent."""

    @abstractmethod
    async def inject_tools(self, tools: List[Tool], bridge_url: Optional[str] = None) -> None:
        """Offer ``tools`` to the harness, served over MCP at ``bridge_url`` (None: no tools to serve).

        Called before :meth:`start`; the names are those the harness must call (renamed already)."""

    @abstractmethod
    async def is_alive(self) -> bool:
        """Whether the harness can take a turn now."""

    @abstractmethod
    def send_message_streaming(self, message: str) -> AsyncIterator[HarnessEvent]:
        """Run one turn on ``message``, yielding its events; the last is of type ``turn_complete``.

        A harness that dies during the turn raises ``HarnessNotRunningError``; the caller bounds the
        turn's time by cancelling the iteration (an adapter stops its work when cancelled)."""

    async def send_message(self, message: str) -> HarnessResponse:
        """One whole turn: the events of :meth:`send_message_streaming`, drained."""
        events = [event async for event in self.send_message_streaming(message)]
        return response_from_events(events)


def response_from_events(events: Sequence[HarnessEvent]) -> HarnessResponse:
    """The :class:`HarnessResponse` of a finished turn; ``HarnessError`` when it did not finish
    (no events, or the last one is not ``turn_complete``)."""
    if not events:
        raise HarnessError("the harness ended its turn without any event")
    last = events[-1]
    if last.type != HarnessEventType.TURN_COMPLETE:
        raise HarnessError(f"the harness's turn ended with a {last.type.value!r} event instead of 'turn_complete'")
    return HarnessResponse(
        response=str(last.data.get("response", "")), events=list(events), done=bool(last.data.get("done"))
    )


__all__ = ["AgenticHarnessAdapter", "response_from_events"]
