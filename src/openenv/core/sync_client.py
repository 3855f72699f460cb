"""Synchronous use of an :class:`~openenv.core.env_client.EnvClient`.

The async client does all the work on a private event loop that runs on a daemon thread
(:class:`~openenv.core.loop_thread.LoopThread`); sync calls submit coroutines to it and wait.
Because that loop is not the caller's, this works the same from a plain script, from worker
threads (calls are serialised) and from inside a running event loop such as a Jupyter cell,
without deadlock.

The async client makes this facade (``client.sync()``), so this module sits below
:mod:`~openenv.core.env_client`: it names the client by what it calls (:class:`AsyncClient`).
"""

from __future__ import annotations

import inspect
from typing import Any, Coroutine, Generic, Protocol, TypeVar

from .client_types import StepResult, Usage
from .loop_thread import LoopThread

T = TypeVar("T")
ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")


class AsyncClient(Protocol):
    """What :class:`SyncEnvClient` drives: an :class:`~openenv.core.env_client.EnvClient`, seen
    through the methods the facade calls (its loop, its claim on the usage, its coroutines)."""

    def _claim(self, usage: Usage) -> None: ...

    def _runner(self) -> LoopThread: ...

    async def _connect_async(self) -> Any: ...

    async def _disconnect_async(self) -> None: ...

    async def _reset_async(self, **kwargs: Any) -> StepResult[Any]: ...

    async def _step_async(self, action: Any, **kwargs: Any) -> StepResult[Any]: ...

    async def _state_async(self) -> Any: ...

    async def _new_session_async(self) -> Any: ...

    async def _snapshot_async(self) -> Any: ...

    async def _restore_async(self, snapshot: Any) -> Any: ...

    async def _fork_async(self, n: int) -> Any: ...

    async def _agent_token_async(self) -> Any: ...

    async def _grade_async(self) -> Any: ...

    async def _trajectory_async(self) -> Any: ...

    async def _diff_async(self) -> Any: ...

    def close(self) -> Any: ...

    def _step_payload(self, action: Any) -> dict: ...

    def _parse_result(self, payload: dict) -> StepResult[Any]: ...

    def _parse_state(self, payload: dict) -> Any: ...


class SyncEnvClient(Generic[ActT, ObsT, StateT]):
    """Blocking facade over an async :class:`~openenv.core.env_client.EnvClient` (what ``client.sync()`` returns).

    Same methods as the async client, returning values instead of coroutines. Attributes it does
    not define are looked up on the async client; its coroutine methods (e.g. ``list_tools`` and
    ``call_tool`` of MCP clients) run on the private loop.
    """

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        client._claim(Usage.SYNC)

    @property
    def async_client(self) -> Any:
        """The async client this wraps (an :class:`~openenv.core.env_client.EnvClient`)."""
        return self._client

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._client._runner().run(coro)

    def connect(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        self._run(self._client._connect_async())
        return self

    def disconnect(self) -> None:
        self._run(self._client._disconnect_async())

    def reset(self, **kwargs: Any) -> StepResult[ObsT]:
        return self._run(self._client._reset_async(**kwargs))

    def step(self, action: ActT, **kwargs: Any) -> StepResult[ObsT]:
        return self._run(self._client._step_async(action, **kwargs))

    def state(self) -> StateT:
        return self._run(self._client._state_async())

    def new_session(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        """Another session on the same server, closed with this client."""
        return self._run(self._client._new_session_async()).sync()  # it runs on this client's loop

    def snapshot(self) -> Any:
        """This session's state now, sealed by the server (see ``EnvClient.snapshot``)."""
        return self._run(self._client._snapshot_async())

    def restore(self, snapshot: Any) -> StateT:
        """Continue this session from ``snapshot`` (see ``EnvClient.restore``)."""
        return self._run(self._client._restore_async(snapshot))

    def agent_token(self) -> dict:
        """A credential for this session's agent (see ``EnvClient.agent_token``)."""
        return self._run(self._client._agent_token_async())

    def grade(self) -> Any:
        """The environment's verdict on a copy of this session (see ``EnvClient.grade``)."""
        return self._run(self._client._grade_async())

    def trajectory(self) -> dict:
        """This session's record since its last reset (see ``EnvClient.trajectory``)."""
        return self._run(self._client._trajectory_async())

    def diff(self) -> dict:
        """What changed in this session's work directory since its reset (see ``EnvClient.diff``)."""
        return self._run(self._client._diff_async())

    def fork(self, n: int = 1) -> list:
        """``n`` new clients starting from this session's state now (see ``EnvClient.fork``)."""
        return [child.sync() for child in self._run(self._client._fork_async(n))]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        try:
            return self.connect()
        except BaseException:
            self.close()  # a server it started must not outlive this, nor the loop thread
            raise

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_client":  # copy/pickle probe these before __init__ ran
            raise AttributeError(name)
        attr = getattr(self._client, name)
        if inspect.iscoroutinefunction(attr):

            def blocking(*args: Any, **kwargs: Any) -> Any:
                return self._run(attr(*args, **kwargs))

            blocking.__name__ = name
            blocking.__doc__ = attr.__doc__
            return blocking
        return attr

    def _step_payload(self, action: ActT) -> dict:
        return self._client._step_payload(action)

    def _parse_result(self, payload: dict) -> StepResult[ObsT]:
        return self._client._parse_result(payload)

    def _parse_state(self, payload: dict) -> StateT:
        return self._client._parse_state(payload)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._client!r})"


__all__ = ["AsyncClient", "LoopThread", "SyncEnvClient"]
