"""Small environments the tests serve. Each is real code run by a real server."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class CounterAction(Action):
    delta: int = 1
    sleep_s: float = 0.0
    fail: bool = False


class CounterObservation(Observation):
    value: int = 0


class CounterState(State):
    value: int = 0


class Tracker:
    """Counts constructions and closes of environments across threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created = 0
        self.closed = 0
        self.threads: set = set()

    def reset(self) -> None:
        with self.lock:
            self.created = self.closed = 0
            self.threads = set()

    @property
    def alive(self) -> int:
        return self.created - self.closed


TRACKER = Tracker()


class CounterEnv(Environment[CounterAction, CounterObservation, CounterState]):
    """Adds ``delta`` to a counter; done at 10. ``sleep_s`` blocks the step, ``fail`` raises."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = CounterState(episode_id=None, step_count=0, value=0)
        with TRACKER.lock:
            TRACKER.created += 1
        self._closed = False

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, start: int = 0) -> CounterObservation:
        value = start if seed is None else seed % 5
        self._state = CounterState(episode_id=episode_id or "episode", step_count=0, value=value)
        return CounterObservation(value=value, reward=0.0, metadata={"seed": seed} if seed is not None else {})

    def step(
        self, action: CounterAction, timeout_s: Optional[float] = None, request_id: Optional[str] = None
    ) -> CounterObservation:
        with TRACKER.lock:
            TRACKER.threads.add(threading.current_thread().name)
        if action.sleep_s:
            time.sleep(action.sleep_s)
        if action.fail:
            raise ValueError("the step failed on purpose")
        self._state.step_count += 1
        self._state.value += action.delta
        meta: Dict[str, Any] = {"request_id": request_id} if request_id else {}
        return CounterObservation(
            value=self._state.value, reward=action.delta, done=self._state.value >= 10, metadata=meta
        )

    @property
    def state(self) -> CounterState:
        return self._state

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with TRACKER.lock:
                TRACKER.closed += 1

    # Task API
    def list_splits(self) -> List[str]:
        return ["train", "holdout"]

    def num_tasks(self, split: str) -> int:
        return 3

    def get_task(self, split: str, index: int) -> Dict[str, Any]:
        if not 0 <= index < 3:
            raise IndexError(index)
        return {"split": split, "index": index}

    def get_task_range(
        self, split: str, start: Optional[int] = None, stop: Optional[int] = None
    ) -> List[Dict[str, Any]]:
        return [{"split": split, "index": i} for i in range(3)[start:stop]]


class AsyncCounterEnv(CounterEnv):
    """The same counter with async reset/step: runs on the event loop."""

    async def reset_async(
        self, seed: Optional[int] = None, episode_id: Optional[str] = None, start: int = 0
    ) -> CounterObservation:
        return self.reset(seed=seed, episode_id=episode_id, start=start)

    async def step_async(self, action: CounterAction, timeout_s: Optional[float] = None) -> CounterObservation:
        if action.sleep_s:
            await asyncio.sleep(action.sleep_s)
        return self.step(action.model_copy(update={"sleep_s": 0.0}))


class SerialEnv(CounterEnv):
    """A counter that does not declare concurrent sessions."""

    SUPPORTS_CONCURRENT_SESSIONS = False


class SingleThreadEnv(CounterEnv):
    REQUIRES_SINGLE_THREAD_EXECUTOR = True


class BrokenFactoryEnv(CounterEnv):
    def __init__(self) -> None:
        raise RuntimeError("cannot build this environment")


def make_counter() -> CounterEnv:
    """A factory function (not a class)."""
    return CounterEnv()


# --- MCP ---------------------------------------------------------------------------------------

from fastmcp import FastMCP  # noqa: E402

from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.mcp_types import (  # noqa: E402
    CallToolAction,
    ListToolsAction,
    ListToolsObservation,
    Tool,
)


class ToolEnv(MCPEnvironment):
    """Tools: add, boom (raises), nap (async sleep); a simulation-only tool 'peek'."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("tools")

        @mcp.tool
        def add(a: int, b: int = 2) -> int:
            """Add two numbers."""
            self.calls += 1
            return a + b

        @mcp.tool
        def boom() -> str:
            """Always fails."""
            raise ValueError("kaboom")

        @mcp.tool
        async def nap(seconds: float) -> str:
            """Sleep, then answer."""
            await asyncio.sleep(seconds)
            return "rested"

        super().__init__(mcp)
        self.calls = 0
        self._state = State(episode_id="tools", step_count=0)

        @self.tool(mode="simulation")
        def peek() -> int:
            """How many calls so far (simulation only)."""
            return self.calls

        with TRACKER.lock:
            TRACKER.created += 1

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self.calls = 0
        return Observation(reward=0.0, metadata={"status": "ready"})

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": "tools only"})

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        with TRACKER.lock:
            TRACKER.closed += 1
        super().close()


class ToolsOnlyEnv(MCPEnvironment):
    """An MCP environment whose reset, non-tool steps and state do nothing."""

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        return Observation()

    def _step_impl(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation()

    @property
    def state(self) -> State:
        return State()


class LegacyToolEnv(Environment):
    """An environment that answers MCP actions in its own step (no MCPEnvironment)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        return Observation()

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        from openenv.core.env_server.mcp_types import CallToolObservation

        if isinstance(action, ListToolsAction):
            return ListToolsObservation(
                tools=[Tool(name="shout", description="Upper-case", input_schema={"type": "object"})]
            )
        assert isinstance(action, CallToolAction)
        return CallToolObservation(tool_name=action.tool_name, result=str(action.arguments.get("text", "")).upper())

    @property
    def state(self) -> State:
        return State()


# --- a typed client -------------------------------------------------------------------------------

from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_client import EnvClient  # noqa: E402


class CounterClient(EnvClient[CounterAction, CounterObservation, CounterState]):
    def _step_payload(self, action: CounterAction) -> Dict[str, Any]:
        return action.model_dump(exclude_defaults=True)

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[CounterObservation]:
        observation = CounterObservation(
            **payload["observation"], done=payload.get("done", False), reward=payload.get("reward")
        )
        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> CounterState:
        return CounterState(**payload)
