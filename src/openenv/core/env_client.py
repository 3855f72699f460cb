"""The client trainers use to drive an environment over its ``/ws`` WebSocket.

Subclass :class:`EnvClient` for an environment's typed client and implement three methods:
``_step_payload(action) -> dict`` (the JSON of an action), ``_parse_result(payload) ->
StepResult`` and ``_parse_state(payload) -> State``. Then::

    async with MyEnv(base_url="http://localhost:8000") as env:
        result = await env.reset(seed=0)
        result = await env.step(MyAction(...))

    with MyEnv(base_url="http://localhost:8000").sync() as env:   # same, blocking
        result = env.reset(seed=0)

The public methods are dual-mode like OpenEnv 0.10's: called inside a running event loop they
return coroutines; called from sync code they block. The first call decides which (``async
with`` and ``.sync()`` decide explicitly). ``base_url`` may be ``http(s)://host:port`` or
``unix:///path/to/env.sock`` (a server on a Unix socket).

Against a server that offers it (ours: see :mod:`.env_server.resume` and docs/resume.md), a
connection that drops is re-made and its session resumed, within ``reconnect_timeout_s``: the call
under way is sent again with its number and answered once. Against an upstream server, a dropped
connection ends the episode with :class:`SessionLostError`, as OpenEnv 0.10's client does.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import binascii
import inspect
import json
import logging
import random
import threading
import time
import weakref
from abc import ABC, abstractmethod
from enum import Enum
from typing import Any, Callable, Dict, FrozenSet, Generic, List, Optional, Tuple, TypeVar

from .client_errors import (
    CapacityReachedError,
    EnvClientError,
    ServerBusyError,
    ServerStoppedError,
    SessionLostError,
    connect_failure,
    error_from_frame,
)
from .client_types import Snapshot, StepResult, Usage
from .env_server.resume import (
    LEGACY_SESSION_HEADER,
    RESUME_HEADER,
    RESUME_SESSION_HEADER,
    SEQ_KEY,
    STOPPING_CLOSE_CODE,
    STOPPING_REASON,
    TOKEN_HEADER,
)
from .loop_thread import LoopThread
from .sync_client import SyncEnvClient
from .utils import Endpoint, check_unix_socket, parse_endpoint, timeout_after, within

logger = logging.getLogger("openenv.client")

_RUNNER_LOCK = threading.Lock()

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")

_MIB = 1024 * 1024
_MODES = ("simulation", "production")


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class ClientState(str, Enum):
    """Where a client's connection stands (``EnvClient._state``); moves are checked against
    ``_TRANSITIONS``. Closing is not final: a closed client opens a new connection when used again."""

    NEW = "new"  # never connected
    OPEN = "open"  # a WebSocket is open (until its peer closes it, noticed on the next call)
    LOST = "lost"  # the socket carrying the episode failed and was dropped: only reset() reconnects
    CLOSING = "closing"  # close() is under way (child sessions, the socket, the server it started)
    CLOSED = "closed"  # disconnect() or close() returned


_TRANSITIONS: Dict[ClientState, FrozenSet[ClientState]] = {
    ClientState.NEW: frozenset({ClientState.OPEN, ClientState.CLOSING}),
    ClientState.OPEN: frozenset({ClientState.LOST, ClientState.CLOSED, ClientState.CLOSING}),
    ClientState.LOST: frozenset({ClientState.OPEN, ClientState.CLOSING}),
    ClientState.CLOSING: frozenset({ClientState.CLOSED}),
    ClientState.CLOSED: frozenset({ClientState.OPEN, ClientState.CLOSING}),
}


def _resolve_mode(mode: Optional[str]) -> str:
    import os

    source = "mode" if mode else "OPENENV_CLIENT_MODE"
    raw = mode or os.environ.get("OPENENV_CLIENT_MODE") or "simulation"
    value = raw.lower()
    if value not in _MODES:
        raise ValueError(f"{source} must be 'simulation' or 'production', got {raw!r}")
    return value


class EnvClient(ABC, Generic[ActT, ObsT, StateT]):
    """Async client of one environment session (see the module docstring).

    ``base_url`` is the server (``http(s)://host:port`` or ``unix:///path``), or ``provider``
    starts one when the client connects. ``connect_timeout_s`` bounds each connection attempt,
    ``message_timeout_s`` each reply; ``max_message_size_mb`` is the largest message accepted;
    the WebSocket pings every ``websocket_ping_interval_s`` and gives up on a link silent for
    ``websocket_ping_timeout_s`` (None turns either off). ``headers`` go with every handshake
    (``{"Authorization": "Bearer <token>"}``). A dropped connection is resumed for up to
    ``reconnect_timeout_s`` (0: never) against a server that offers it.

    ``mode`` is ``"simulation"`` or ``"production"`` (not case-sensitive; anything else is a
    ``ValueError``); when not given, ``OPENENV_CLIENT_MODE`` decides, else ``"simulation"``. It is
    fixed for the client's life (``client.mode``). As in OpenEnv 0.10 it changes nothing for this
    class: subclasses read it (MCP clients accept only ``"production"``, see
    :class:`~openenv.core.mcp_client.MCPClientBase`).
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        max_message_size_mb: float = 100.0,
        websocket_ping_interval_s: Optional[float] = 20.0,
        websocket_ping_timeout_s: Optional[float] = 20.0,
        provider: Any = None,
        mode: Optional[str] = None,
        headers: Optional[Dict[str, str]] = None,
        reconnect_timeout_s: float = 30.0,
    ) -> None:
        if base_url is None and provider is None:
            raise ValueError(
                "EnvClient needs a base_url (e.g. 'http://localhost:8000') or a provider that starts a server"
            )
        self._endpoint: Optional[Endpoint] = parse_endpoint(base_url) if base_url else None
        self._connect_timeout_s = connect_timeout_s
        self._message_timeout_s = message_timeout_s
        self._max_message_size_mb = max_message_size_mb
        self._ping_interval_s = websocket_ping_interval_s
        self._ping_timeout_s = websocket_ping_timeout_s
        self._provider = provider
        self._mode = _resolve_mode(mode)
        self._headers = dict(headers or {})
        self._reconnect_timeout_s = reconnect_timeout_s
        self._resume: Optional[Tuple[str, str]] = None  # the session's id and resume token, if offered
        self._resume_header = RESUME_SESSION_HEADER  # the header the server named the session in
        self._seq = 0  # the number of the last call sent on the session
        self._ws: Any = None
        self._ws_loop: Optional[asyncio.AbstractEventLoop] = None
        self._io_lock: Optional[asyncio.Lock] = None
        self._connect_guard: Optional[Tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = None
        self._state = ClientState.NEW
        self._usage = Usage.UNDECIDED
        self._loop_thread: Optional[LoopThread] = None
        self._borrowed_loop_thread = False  # a sync child session runs on its parent's loop
        self._sync_client: Optional[SyncEnvClient[ActT, ObsT, StateT]] = None
        self._children: List[EnvClient[Any, Any, Any]] = []
        self._provider_started = False
        self._launch: Optional[_Launch] = None
        self._warned_step_kwargs = False

    # --- what subclasses implement ----------------------------------------------------------

    @abstractmethod
    def _step_payload(self, action: ActT) -> Dict[str, Any]:
        """The JSON object sent as the ``data`` of a step frame."""

    @abstractmethod
    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[ObsT]:
        """A :class:`StepResult` from the ``data`` of an observation frame."""

    @abstractmethod
    def _parse_state(self, payload: Dict[str, Any]) -> StateT:
        """The state from the ``data`` of a state frame."""

    # --- properties ---------------------------------------------------------------------------

    @property
    def base_url(self) -> Optional[str]:
        """The server's URL (None until a provider has started it)."""
        if self._endpoint is None:
            return None
        return f"unix://{self._endpoint.uds}" if self._endpoint.uds else self._endpoint.http_url

    @property
    def mode(self) -> str:
        """``"simulation"`` or ``"production"``, as resolved at construction (see the class docstring)."""
        return self._mode

    @property
    def headers(self) -> Dict[str, str]:
        return dict(self._headers)

    # --- OpenEnv 0.10's private names, which code written for its client reads ------------------

    @property
    def _base_url(self) -> Optional[str]:
        """The server's base URL, no trailing slash (None until a provider started it): what
        upstream's client keeps here and integrations (verifiers' OpenEnv adapter) read."""
        return self.base_url

    @property
    def _ws_url(self) -> Optional[str]:
        """The session WebSocket's URL (``ws(s)://host:port/ws``; None until a provider started
        the server), as upstream's client keeps it. An MCP client's handshake adds its session
        id to the query; this stays the plain URL, as upstream's does between connections."""
        return None if self._endpoint is None else self._endpoint.ws_url + "/ws"

    async def _send_and_receive(self, message: Dict[str, Any]) -> Dict[str, Any]:
        """Send one frame (a JSON object, e.g. ``{"type": "state"}``) on the session's WebSocket,
        connecting first if needed, and return the server's reply as a dict; an error frame
        raises a :class:`~openenv.core.client_errors.ServerError` (a ``RuntimeError`` that reads
        ``Server error: <message> (code: <code>)``). OpenEnv 0.10's name for this, which clients
        of upstream packages call for frames of their own."""
        return await self._request(dict(message), starts_session=message.get("type") == "reset")

    # --- dual-mode dispatch -------------------------------------------------------------------

    def _transition(self, new: ClientState) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise RuntimeError(f"{type(self).__name__}: invalid state change {self._state.value} -> {new.value}")
        self._state = new

    def _claim(self, usage: Usage) -> None:
        if self._usage is Usage.UNDECIDED:
            self._usage = usage
        elif self._usage is not usage:
            other = self._usage.value
            raise RuntimeError(
                f"{type(self).__name__} is already being used in {other} mode; create one client "
                "for async code and another (or client.sync()) for sync code"
            )

    def _runner(self) -> LoopThread:
        runner = self._loop_thread
        if runner is None:
            with _RUNNER_LOCK:  # first sync calls from several threads: one loop thread
                runner = self._loop_thread
                if runner is None:
                    runner = self._loop_thread = LoopThread()
        return runner

    def _stop_runner(self) -> None:
        if self._borrowed_loop_thread:
            self._loop_thread = None
            self._borrowed_loop_thread = False  # used again, it gets a loop of its own
            return
        if self._loop_thread is not None:
            self._loop_thread.stop()
            self._loop_thread = None

    def _dispatch(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` (a coroutine function): return its coroutine in async use, its result in sync use."""
        if self._usage is Usage.UNDECIDED:
            self._claim(Usage.ASYNC if _loop_running() else Usage.SYNC)
        if self._usage is Usage.ASYNC:
            if not _loop_running():
                raise RuntimeError(
                    f"{type(self).__name__} is being used with async/await; from sync code use "
                    "client.sync() (or a separate client)"
                )
            return fn(*args, **kwargs)
        runner = self._runner()
        if runner.in_loop_thread():
            return fn(*args, **kwargs)
        return runner.run(fn(*args, **kwargs))

    def connect(self) -> Any:
        """Open the WebSocket (and start the provider, if any). Returns the client."""
        return self._dispatch(self._connect_and_return)

    def disconnect(self) -> Any:
        return self._dispatch(self._disconnect_async)

    def reset(self, **kwargs: Any) -> Any:
        """Start an episode; ``kwargs`` (``seed``, ``episode_id``, env options) go to the env's ``reset``."""
        return self._dispatch(self._reset_async, **kwargs)

    def step(self, action: ActT, **kwargs: Any) -> Any:
        """Apply ``action`` and return the :class:`StepResult`."""
        return self._dispatch(self._step_async, action, **kwargs)

    def state(self) -> Any:
        return self._dispatch(self._state_async)

    def close(self) -> Any:
        """Close the session, its child sessions and the provider this client started."""
        if self._usage is Usage.UNDECIDED and not _loop_running():
            return None  # never used: nothing is open (and no loop thread is started for it)
        if self._borrowed_loop_thread and self._loop_thread is not None and self._loop_thread.stopped:
            return None  # a child session: its parent's close already closed it
        if self._usage is Usage.SYNC and not self._runner().in_loop_thread():
            try:
                return self._runner().run(self._close_async())
            finally:
                self._stop_runner()
        return self._dispatch(self._close_async)

    def new_session(self) -> Any:
        """Another client on the same server (a new session), closed together with this one."""
        return self._dispatch(self._new_session_async)

    def snapshot(self) -> Any:
        """This session's state now, sealed by the server: a :class:`~.client_types.Snapshot`
        to keep, save, or hand to :meth:`restore` (the environment must support snapshots:
        ``SUPPORTS_SNAPSHOT``; see docs/snapshots.md)."""
        return self._dispatch(self._snapshot_async)

    def restore(self, snapshot: Snapshot) -> Any:
        """Continue this client's session from ``snapshot`` (on this server, or on any server of
        the same environment that shares the key of the one that made it); returns the restored
        state. A snapshot the server will not load is refused before anything changes."""
        return self._dispatch(self._restore_async, snapshot)

    def agent_token(self) -> Any:
        """A credential for the agent acting in this session (a server with roles, see
        docs/roles.md): ``{"token", "session_id", "expires_at"}``. With it, an agent reaches this
        session's agent-visible tools (``POST /mcp``, ``Authorization: Bearer <token>``) and
        nothing else; it dies with the session."""
        return self._dispatch(self._agent_token_async)

    def grade(self) -> Any:
        """The environment's ``grade()`` verdict on this session, run by the server on a copy of
        it (what the check does never reaches the episode); the environment must support
        snapshots and define ``grade()`` (see docs/roles.md)."""
        return self._dispatch(self._grade_async)

    def trajectory(self) -> Any:
        """This session's record since its last reset: ``{"session_id", "entries", "truncated",
        ...}``, each entry a reset, step or tool call with what it answered. The server must record
        (``OPENENV_MAX_TRAJECTORY_STEPS``, on by default where it has a grader's token; see
        docs/roles.md)."""
        return self._dispatch(self._trajectory_async)

    def diff(self) -> Any:
        """What changed in this session's work directory since its last reset: ``{"added",
        "removed", "modified", "diffs", ...}`` (an environment that declares one with
        ``workspace_dir()``; see docs/roles.md)."""
        return self._dispatch(self._diff_async)

    def fork(self, n: int = 1) -> Any:
        """``n`` new clients whose sessions start from this session's state now, each on its own
        connection to this client's server (behind a ``--workers`` front or a Ray pool, spread
        over its workers), closed together with this one. Each counts against the server's
        capacity: when not all ``n`` fit, none is kept and :class:`CapacityReachedError` says so."""
        return self._dispatch(self._fork_async, n)

    def sync(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        """A blocking view of this client (cached)."""
        if self._sync_client is None:
            self._sync_client = SyncEnvClient(self)
        return self._sync_client

    def __await__(self) -> Any:
        """``client = await Env.from_env(...)``: connect (starting the server if needed)."""
        self._claim(Usage.ASYNC)
        return self._connect_and_return().__await__()

    # --- clients that start their own server -----------------------------------------------------

    @classmethod
    def from_env(
        cls,
        name_or_path: str,
        *,
        provider: Any = None,
        use_docker: Optional[bool] = None,
        isolation: str = "sandbox",
        **kwargs: Any,
    ) -> Any:
        """A client whose server starts when it connects and stops when it closes.

        ``name_or_path`` is an environment package directory (with ``openenv.yaml``) or the name of
        an installed one (``"echo_env"``, ``"echo"``): it is served in a
        :class:`~openenv.core.containers.runtime.SandboxProvider` (``isolation="none"`` for a plain
        process). A Hugging Face Space id (``"org/name"``) runs, as OpenEnv 0.10 does, the Space's
        image ``registry.hf.space/<org-name>:<tag>`` (``tag``, default ``latest``) through
        ``provider`` (default: a :class:`~openenv.core.containers.runtime.LocalDockerProvider`);
        with ``use_docker=False`` its package is fetched from the Space's repository and served in
        the sandbox instead, which needs ``trust_remote_code=True`` or
        ``OPENENV_TRUST_REMOTE_CODE=1`` (see :mod:`openenv.core.spaces`). Keyword arguments of the
        client's constructor go to the client; ``port``, ``env_vars`` and ``workers`` start the
        container; the rest go to the provider this makes (with ``provider`` given, they are a
        ``ValueError``). The result can be awaited (``client = await Env.from_env(...)``),
        entered (``async with`` / ``with``), or made blocking with ``.sync()``.
        """
        from . import spaces
        from .utils import hf_space_subdomain

        client_kwargs, provider_kwargs = split_client_kwargs(cls, kwargs)
        from_hub = spaces.is_hub_id(name_or_path)
        if use_docker or (from_hub and use_docker is None):
            repo_id = spaces.repo_id_of(name_or_path) if from_hub else name_or_path
            image = f"registry.hf.space/{hf_space_subdomain(repo_id)}:{provider_kwargs.pop('tag', 'latest')}"
            start = {k: provider_kwargs.pop(k) for k in ("port", "env_vars", "workers") if k in provider_kwargs}
            if provider is not None and provider_kwargs:
                raise ValueError(f"pass either a provider or provider arguments, not both: {sorted(provider_kwargs)}")
            return cls.from_docker_image(image, provider=provider, **client_kwargs, **start, **provider_kwargs)
        if provider is not None:
            if provider_kwargs:
                raise ValueError(f"pass either a provider or provider arguments, not both: {sorted(provider_kwargs)}")
            return cls(provider=provider, **client_kwargs)
        if from_hub:
            trust = bool(provider_kwargs.pop("trust_remote_code", False))
            space = spaces.sandboxed_space(
                spaces.repo_id_of(name_or_path), trust_remote_code=trust, isolation=isolation, **provider_kwargs
            )
            return cls(provider=space, **client_kwargs)
        from pathlib import Path

        from .containers.runtime.sandbox import SandboxProvider

        path = Path(name_or_path).expanduser()
        if path.exists():
            project = str(path)
        else:
            from .discovery import resolve_environment

            project = str(resolve_environment(name_or_path).path)
        return cls(provider=SandboxProvider(project, isolation=isolation, **provider_kwargs), **client_kwargs)

    @classmethod
    def from_docker_image(cls, image: str, provider: Any = None, **kwargs: Any) -> Any:
        """A client whose server is a Docker container of ``image`` (started on connect, removed on
        close). Keyword arguments of the client's constructor go to the client, the rest to
        ``provider.start_container``."""
        client_kwargs, start_kwargs = split_client_kwargs(cls, kwargs)
        if provider is None:
            from .containers.runtime.docker import LocalDockerProvider

            provider = LocalDockerProvider()
        client = cls(provider=provider, **client_kwargs)
        client._launch = _Launch(
            start=lambda: provider.start_container(image, **start_kwargs),
            ready=provider.wait_for_ready,
            stop=provider.stop_container,
        )
        return client

    async def __aenter__(self) -> EnvClient[ActT, ObsT, StateT]:
        self._claim(Usage.ASYNC)
        try:
            await self._connect_async()
        except BaseException:
            await asyncio.shield(self._close_async())  # a server it started must not outlive this
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._close_async()

    def __enter__(self) -> EnvClient[ActT, ObsT, StateT]:
        self._claim(Usage.SYNC)
        try:
            self._runner().run(self._connect_async())
        except BaseException:
            self.close()  # a server it started must not outlive this, nor the loop thread
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- connection ---------------------------------------------------------------------------

    async def _connect_and_return(self) -> EnvClient[ActT, ObsT, StateT]:
        await self._connect_async()
        return self

    async def _ensure_endpoint(self) -> Endpoint:
        if self._endpoint is not None:
            return self._endpoint
        launch = self._launch or _Launch.of(self._provider)
        starting = asyncio.ensure_future(asyncio.to_thread(launch.start))
        try:
            url = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The start goes on in its thread: stop what it starts, once it has.
            starting.add_done_callback(lambda done: _stop_started(launch, done))
            raise
        self._launch, self._provider_started = launch, True
        try:
            await asyncio.to_thread(launch.ready, url)
        except BaseException:
            await asyncio.to_thread(launch.stop)
            self._provider_started = False
            raise
        self._endpoint = parse_endpoint(url)
        return self._endpoint

    def _ws_path(self) -> str:
        """Path and query of the WebSocket URL (MCP clients attach to a session here)."""
        return "/ws"

    async def _before_connect(self, endpoint: Endpoint) -> None:
        """Hook run before each new WebSocket is opened."""

    def _socket_usable(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self._ws is not None and self._ws_loop is loop and _is_open(self._ws)

    def _refuse_while_closing(self) -> None:
        if self._state is ClientState.CLOSING:
            raise RuntimeError(f"{type(self).__name__} is closing; use it again once close() has returned")

    async def _connect_async(self) -> Any:
        self._refuse_while_closing()
        loop = asyncio.get_running_loop()
        if self._socket_usable(loop):
            return self._ws
        # One connection at a time: calls that find no socket together (asyncio.gather, or sync
        # calls from several threads) must share the one that the first of them opens.
        guard = self._connect_guard
        if guard is None or guard[0] is not loop:
            guard = self._connect_guard = (loop, asyncio.Lock())
        async with guard[1]:
            self._refuse_while_closing()
            if self._socket_usable(loop):
                return self._ws
            if self._ws is not None:  # closed by its peer, or opened on another event loop
                self._drop_socket()
                self._transition(ClientState.LOST)
            return await self._open_socket(loop)

    async def _dial(self, endpoint: Endpoint, url: str, headers: Dict[str, str], open_timeout: float) -> Any:
        """A new WebSocket to ``url`` (the library's exceptions pass through)."""
        options: Dict[str, Any] = dict(
            open_timeout=open_timeout,
            max_size=int(self._max_message_size_mb * _MIB),
            ping_interval=self._ping_interval_s,
            ping_timeout=self._ping_timeout_s,
            # a dead link found by the pings is given up on as soon (the closing handshake over it cannot finish)
            close_timeout=min(10.0, self._ping_timeout_s or 10.0),
            compression=None,
            additional_headers=headers or None,
        )
        from websockets.asyncio.client import connect, unix_connect

        if endpoint.uds:
            check_unix_socket(endpoint.uds)
            return await unix_connect(endpoint.uds, uri=url, **options)
        if endpoint.is_loopback:
            options["proxy"] = None
        return await connect(url, **options)

    async def _open_socket(self, loop: asyncio.AbstractEventLoop) -> Any:
        endpoint = await self._ensure_endpoint()
        await self._before_connect(endpoint)
        url = endpoint.ws_url + self._ws_path()
        headers = dict(self._headers)
        if self._reconnect_timeout_s:
            headers[RESUME_HEADER] = "1"  # a server that resumes answers with the session's id and token
        try:
            ws = await self._redial(endpoint, url, headers, _cut_short)
        except Exception as exc:
            raise connect_failure(exc, url, endpoint.uds) from exc
        if self._state is ClientState.CLOSING:  # close() began while this connected
            await _close_quietly(ws)
            self._refuse_while_closing()
        self._transition(ClientState.OPEN)
        if self._io_lock is None or self._ws_loop is not loop:
            self._io_lock = asyncio.Lock()
        self._ws, self._ws_loop = ws, loop
        _closed_at_exit(self)
        answer = ws.response.headers
        # (a server from before the rename names the session in the old header: resumed by that one)
        named = RESUME_SESSION_HEADER if RESUME_SESSION_HEADER in answer else LEGACY_SESSION_HEADER
        session_id, token = answer.get(named), answer.get(TOKEN_HEADER)
        self._resume = (session_id, token) if session_id and token else None
        self._resume_header = named
        self._seq = 0
        return ws

    async def _resume_socket(self, cause: BaseException) -> Any:
        """Re-make the dropped connection and resume its session, with backoff, for at most
        ``reconnect_timeout_s``; SessionLostError (the session lost) when it cannot be resumed."""
        assert self._resume is not None and self._endpoint is not None
        session_id, token = self._resume
        endpoint = self._endpoint
        url = endpoint.ws_url + self._ws_path()
        headers = {**self._headers, self._resume_header: session_id, TOKEN_HEADER: token}
        self._abandon_socket()
        try:
            ws = await self._redial(endpoint, url, headers, lambda exc: _refusal(exc) is None, within_budget=True)
        except Exception as exc:
            self._lose_session()
            refusal = _refusal(exc)
            if refusal is not None:  # the server says the session is gone, or not this client's
                why = f"the session could not be resumed: {refusal}"
            else:
                why = f"no reconnect succeeded within {self._reconnect_timeout_s:g} s (reconnect_timeout_s): {exc}"
            raise SessionLostError(
                f"the connection dropped ({cause}) and {why}; call reset() to start a new episode"
            ) from exc
        if self._state is ClientState.CLOSING:
            await _close_quietly(ws)
            self._refuse_while_closing()
        self._ws = ws
        return ws

    async def _redial(
        self,
        endpoint: Endpoint,
        url: str,
        headers: Dict[str, str],
        retry: Callable[[Exception], bool],
        *,
        within_budget: bool = False,
    ) -> Any:
        """:meth:`_dial`, tried again with backoff while ``retry(exc)`` and ``reconnect_timeout_s`` allow.

        Each try has ``connect_timeout_s``, or what is left of ``reconnect_timeout_s`` when that is
        less; the first one has the whole ``connect_timeout_s`` unless ``within_budget`` (a resume:
        all of it within ``reconnect_timeout_s``). A client that never reconnects
        (``reconnect_timeout_s=0``) thus still waits ``connect_timeout_s`` for a slow server."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._reconnect_timeout_s
        delay = 0.02
        open_timeout = self._connect_timeout_s
        if within_budget:
            open_timeout = max(0.1, min(open_timeout, self._reconnect_timeout_s))
        while True:
            try:
                return await self._dial(endpoint, url, headers, open_timeout)
            except Exception as exc:
                left = deadline - loop.time()
                if left <= 0 or not retry(exc):
                    raise
            await asyncio.sleep(min(left, delay * random.uniform(0.5, 1.0)))
            delay = min(delay * 2, 1.0)
            open_timeout = max(0.1, min(self._connect_timeout_s, deadline - loop.time()))

    def _abandon_socket(self) -> None:
        """Drop the socket without a closing handshake: the server then keeps its session for a
        resume (a clean close would end it)."""
        ws, self._ws = self._ws, None
        transport = getattr(ws, "transport", None)
        if transport is not None:
            transport.abort()

    def _drop_socket(self) -> None:
        """Forget the socket and close it in the background (its late replies must not be read)."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        loop = self._ws_loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and loop is running:
            loop.create_task(_close_quietly(ws))
        elif loop is not None and not loop.is_closed():
            try:
                asyncio.run_coroutine_threadsafe(_close_quietly(ws), loop)
            except RuntimeError:
                pass

    async def _disconnect_async(self) -> None:
        if self._ws is not None and self._state is ClientState.OPEN:
            self._transition(ClientState.CLOSED)
        await self._close_socket()

    async def _close_socket(self) -> None:
        if self._ws is not None and self._ws_loop is not asyncio.get_running_loop():
            self._drop_socket()  # opened on another event loop: closed there, or gone with it
            return
        ws, self._ws = self._ws, None
        resume, self._resume = self._resume, None
        if ws is None:
            return
        await asyncio.shield(_send_close(ws))
        if resume is not None and self._endpoint is not None and not _closed_by_server(ws):
            # The close may not have reached the server (the connection dropped): resume the
            # session to close it, rather than leave it holding a slot for its grace period.
            endpoint = self._endpoint
            headers = {**self._headers, self._resume_header: resume[0], TOKEN_HEADER: resume[1]}
            try:
                ws = await self._redial(endpoint, endpoint.ws_url + self._ws_path(), headers, _cut_short)
            except Exception:
                return  # gone already, or no server: nothing more to close
            await asyncio.shield(_send_close(ws))

    async def _close_async(self) -> None:
        if self._state is ClientState.CLOSING:
            return  # another close() is under way
        self._transition(ClientState.CLOSING)
        try:
            await self._release()
        finally:
            self._transition(ClientState.CLOSED)

    async def _release(self) -> None:
        """What close() closes: child sessions, the socket, the server this client started."""
        children, self._children = self._children, []
        for child in children:
            try:
                await child._close_async()
            except Exception:
                logger.warning("closing a child session failed", exc_info=True)
        await self._close_socket()
        if self._launch is not None and self._provider_started:
            await asyncio.to_thread(self._launch.stop)
            self._provider_started = False
            self._endpoint = None

    # --- requests -----------------------------------------------------------------------------

    async def _request(self, message: Dict[str, Any], *, starts_session: bool = False) -> Dict[str, Any]:
        """Send one frame and return the reply; error frames raise :class:`ServerError`."""
        if self._state is ClientState.LOST and not starts_session:
            raise SessionLostError(
                "the connection carrying this episode was lost earlier (see the previous error); "
                "call reset() to start a new episode"
            )
        loop = asyncio.get_running_loop()
        stopped = None
        if self._ws is not None and self._ws_loop is loop and not _is_open(self._ws):
            stopped = _stop_notice(self._ws)
            if stopped is not None:  # the server said it stops: the session is gone, nothing to resume
                self._lose_session()
                if not starts_session:
                    raise self._server_stopped(stopped)
        resumable = self._resume is not None and self._ws_loop is loop and self._io_lock is not None
        if not starts_session and self._ws is not None and not self._socket_usable(loop) and not resumable:
            # Lost since the last call (server restarted, session reaped, network), or opened on
            # another event loop (one asyncio.run() per call): a new socket would be a new
            # session, so say so instead of stepping a fresh environment.
            other_loop = self._ws_loop is not loop
            self._lose_session()
            if other_loop:
                raise SessionLostError(
                    "the connection carrying this episode was opened on another event loop (one client "
                    "per event loop, e.g. per asyncio.run()); call reset() to start a new episode"
                )
            raise SessionLostError(
                "the connection carrying this episode was closed since the last call (server restart, "
                "idle timeout or network); call reset() to start a new episode"
            )
        if not resumable:
            try:
                await self._connect_async()
            except ConnectionError as exc:
                if stopped is None:
                    raise
                raise ConnectionError(
                    f"{exc}; the last connection there ended as the server stopped ({stopped})"
                ) from exc
        from .env_server.serialization import dumps_json

        lock = self._io_lock
        assert lock is not None
        async with lock:
            if self._resume is not None:  # the server numbers calls: this one is applied once
                self._seq += 1
                message = {**message, SEQ_KEY: self._seq}
            text = dumps_json(message)
            while True:
                ws = self._ws
                try:
                    if ws is None or not _is_open(ws):
                        raise ConnectionError("the connection was closed since the last call")
                    async with timeout_after(self._message_timeout_s):
                        await ws.send(text)  # a server that stops reading must not hold us forever
                        raw = await ws.recv()
                    break
                except TimeoutError:
                    self._lose_session()
                    raise TimeoutError(
                        f"no reply from the server within {self._message_timeout_s:g} s "
                        f"(message_timeout_s); the connection was dropped, call reset() to start a new episode"
                    ) from None
                except asyncio.CancelledError:
                    self._lose_session()
                    raise
                except Exception as exc:
                    pending = await _pending_error(ws) if ws is not None else None
                    notice = _stop_notice(ws) if ws is not None and pending is None else None
                    if pending is not None or self._resume is None or notice is not None:
                        self._lose_session()
                        if pending is not None:
                            raise error_from_frame(pending) from exc
                        if notice is not None:  # (a resume would find no session: fail now)
                            raise self._server_stopped(notice) from exc
                        raise SessionLostError(f"connection to the server was lost: {exc}") from exc
                    try:
                        await self._resume_socket(exc)
                    except SessionLostError:
                        if not starts_session:
                            raise
                        await self._open_socket(loop)  # a reset may start afresh, on a new session
                        message = {key: value for key, value in message.items() if key != SEQ_KEY}
                        if self._resume is not None:
                            self._seq = 1
                            message[SEQ_KEY] = 1
                        text = dumps_json(message)
        try:
            response = json.loads(raw)
        except (TypeError, ValueError):
            response = None
        if not isinstance(response, dict):
            raise EnvClientError(f"unexpected reply from the server (not a JSON object): {raw[:200]!r}")
        if response.get("type") == "error":
            raise error_from_frame(response.get("data"))
        return response

    def _server_stopped(self, notice: str) -> ServerStoppedError:
        return ServerStoppedError(
            f"the server at {self.base_url} was stopped ({notice}), and with it the session of this "
            "episode; call reset() to start a new episode once a server runs there again"
        )

    def _lose_session(self) -> None:
        if self._state is ClientState.OPEN:  # (not while close() closes the socket under a call)
            self._transition(ClientState.LOST)
        self._resume = None
        self._drop_socket()

    async def _reset_async(self, **kwargs: Any) -> StepResult[ObsT]:
        response = await self._request({"type": "reset", "data": kwargs}, starts_session=True)
        return self._parse_result(response.get("data") or {})

    async def _step_async(self, action: ActT, **kwargs: Any) -> StepResult[ObsT]:
        if kwargs and not self._warned_step_kwargs:
            self._warned_step_kwargs = True
            logger.warning(
                "step() keyword arguments %s are not sent: the /ws protocol carries only the action", sorted(kwargs)
            )
        response = await self._request({"type": "step", "data": self._step_payload(action)})
        return self._parse_result(response.get("data") or {})

    async def _state_async(self) -> StateT:
        response = await self._request({"type": "state"})
        return self._parse_state(response.get("data") or {})

    async def _snapshot_async(self) -> Snapshot:
        response = await self._request({"type": "snapshot"})
        data = response.get("data") or {}
        return Snapshot(_snapshot_bytes(data.get("snapshot")))

    async def _agent_token_async(self) -> Dict[str, Any]:
        response = await self._request({"type": "agent_token"})
        return dict(response.get("data") or {})

    async def _grade_async(self) -> Any:
        response = await self._request({"type": "grade"})
        return (response.get("data") or {}).get("grade")

    async def _trajectory_async(self) -> Dict[str, Any]:
        response = await self._request({"type": "trajectory"})
        return dict(response.get("data") or {})

    async def _diff_async(self) -> Dict[str, Any]:
        response = await self._request({"type": "diff"})
        return dict(response.get("data") or {})

    async def _restore_async(self, snapshot: Snapshot) -> StateT:
        if not isinstance(snapshot, Snapshot):
            raise TypeError(f"restore() takes a Snapshot (from snapshot()), got {type(snapshot).__name__}")
        text = base64.b64encode(snapshot.data).decode("ascii")
        response = await self._request({"type": "restore", "data": {"snapshot": text}}, starts_session=True)
        return self._parse_state((response.get("data") or {}).get("state") or {})

    async def _fork_async(self, n: int) -> List[EnvClient[Any, Any, Any]]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"fork(n) takes a whole number n >= 1, got {n!r}")
        snapshot = await self._snapshot_async()
        made: List[EnvClient[Any, Any, Any]] = []
        # Each restore carries the snapshot (base64): a large one is sent a few at a time, within
        # what a server takes in flight at once by default (OPENENV_MAX_INFLIGHT_MB).
        sending = asyncio.Semaphore(max(1, _FORK_BYTES_IN_FLIGHT // max(1, len(snapshot) * 4 // 3)))

        async def one() -> EnvClient[Any, Any, Any]:
            for attempt in range(_FORK_BUSY_RETRIES + 1):
                child = await self._new_session_async()
                made.append(child)
                try:
                    async with sending:
                        await child._restore_async(snapshot)
                    return child
                except ServerBusyError:  # its budget of bytes in flight was spent: nothing ran
                    if attempt == _FORK_BUSY_RETRIES:
                        raise
                    made.remove(child)
                    self._children.remove(child)
                    await child._close_async()  # (the server closed its connection: 1013)
                    await asyncio.sleep(0.05 * 2**attempt + random.random() * 0.05)
            raise AssertionError("unreachable")

        results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        if not failures:
            return list(results)  # type: ignore[arg-type]
        for child in made:
            if child in self._children:
                self._children.remove(child)
            await child._close_async()
        full = [failure for failure in failures if isinstance(failure, CapacityReachedError)]
        if full:
            raise CapacityReachedError(
                f"fork({n}) needs {n} new sessions on the server and {len(full)} did not fit ({full[0].message}); "
                f"none of the forks was kept: fork fewer, close sessions, or serve more (max_concurrent_envs, --workers)",
                details=full[0].details,
            ) from full[0]
        raise failures[0]

    def _clone_kwargs(self) -> Dict[str, Any]:
        return dict(
            base_url=self.base_url,
            connect_timeout_s=self._connect_timeout_s,
            message_timeout_s=self._message_timeout_s,
            max_message_size_mb=self._max_message_size_mb,
            websocket_ping_interval_s=self._ping_interval_s,
            websocket_ping_timeout_s=self._ping_timeout_s,
            mode=self._mode,
            headers=self._headers or None,
            reconnect_timeout_s=self._reconnect_timeout_s,
        )

    async def _new_session_async(self) -> EnvClient[Any, Any, Any]:
        await self._ensure_endpoint()
        child = type(self)(**self._clone_kwargs())
        if self._usage is Usage.SYNC:  # its connection lives on this client's loop: it runs there too
            child._claim(Usage.SYNC)
            child._loop_thread = self._runner()
            child._borrowed_loop_thread = True
        else:
            child._claim(Usage.ASYNC)
        await child._connect_async()
        self._children.append(child)
        return child

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"


_LEFT_OPEN: weakref.WeakSet = weakref.WeakSet()  # clients that opened a connection (see _closed_at_exit)
_EXIT_CLOSE_S = 3.0


def _closed_at_exit(client: EnvClient[Any, Any, Any]) -> None:
    """Have ``client`` closed at interpreter exit if it is still open then (see :func:`_close_left_open`)."""
    if not _LEFT_OPEN:
        atexit.unregister(_close_left_open)  # (registered once, whatever the number of clients)
        atexit.register(_close_left_open)
    _LEFT_OPEN.add(client)


def _close_left_open() -> None:
    """Close, at interpreter exit, the clients nobody closed, all within a few seconds. Left to
    the interpreter, a connection's keepalive task is destroyed pending (Python prints "Task was
    destroyed but it is pending!") and the server keeps the session for a resume that will not
    come; closed, the session ends at once. Their event loops still run (a sync client's thread is
    a daemon, alive until the very end: these closes run there together) or can be run (a loop
    left unclosed: run here, one after another, within what is left of the time)."""
    deadline = time.monotonic() + _EXIT_CLOSE_S
    by_loop: Dict[asyncio.AbstractEventLoop, List[EnvClient[Any, Any, Any]]] = {}
    for client in list(_LEFT_OPEN):
        loop = client._ws_loop
        if client._ws is not None and loop is not None and not loop.is_closed():
            by_loop.setdefault(loop, []).append(client)
    running = []
    for loop, clients in by_loop.items():
        if loop.is_running():
            running.append(asyncio.run_coroutine_threadsafe(_close_all(clients), loop))
    for future in running:
        try:
            future.result(max(0.0, deadline - time.monotonic()))
        except BaseException:  # exiting: nothing more to do for it
            logger.debug("closing clients at exit failed", exc_info=True)
    for loop, clients in by_loop.items():
        left = deadline - time.monotonic()
        if loop.is_running() or loop.is_closed() or left <= 0:
            continue
        try:
            loop.run_until_complete(within(_close_all(clients), left))
        except BaseException:
            logger.debug("closing clients at exit failed", exc_info=True)


async def _close_all(clients: List[EnvClient[Any, Any, Any]]) -> None:
    await asyncio.gather(*(client._close_async() for client in clients), return_exceptions=True)


class _Launch:
    """How a client starts, waits for and stops the server it owns (calls run in a thread)."""

    __slots__ = ("ready", "start", "stop")

    def __init__(self, start: Callable[[], str], ready: Callable[[str], None], stop: Callable[[], None]) -> None:
        self.start = start
        self.ready = ready
        self.stop = stop

    @classmethod
    def of(cls, provider: Any) -> _Launch:
        if provider is None:
            raise ValueError("no base_url and no provider to start a server")
        if hasattr(provider, "start_container"):
            params = inspect.signature(provider.start_container).parameters.values()
            if any(p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD for p in params):
                raise ValueError(
                    f"{type(provider).__name__}.start_container needs arguments (an image): use "
                    "Client.from_docker_image(image, provider=...) or start the container yourself"
                )
            return cls(provider.start_container, provider.wait_for_ready, provider.stop_container)
        return cls(provider.start, lambda _url: provider.wait_for_ready(), provider.stop)


def _stop_started(launch: _Launch, started: asyncio.Future) -> None:
    """A provider start whose caller was cancelled: stop the server it started (in a thread)."""
    if started.cancelled() or started.exception() is not None:
        return
    threading.Thread(target=_quietly, args=(launch.stop,), name="openenv-provider-stop", daemon=True).start()


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:
        logger.warning("stopping a server whose start was cancelled failed", exc_info=True)


def split_client_kwargs(cls: type, kwargs: Dict[str, Any]) -> tuple:
    """Split keyword arguments into the client constructor's and the rest."""
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "base_url", "provider"}
    client = {k: v for k, v in kwargs.items() if k in accepted}
    return client, {k: v for k, v in kwargs.items() if k not in accepted}


_FORK_BUSY_RETRIES = 8
"""How often ``fork`` sends a restore again that a busy server refused (backing off each time)."""

_FORK_BYTES_IN_FLIGHT = 48 * 1024 * 1024
"""What ``fork`` sends at once in restores of a large snapshot: well within a server's default
budget of bytes in flight (128 MiB)."""


def _snapshot_bytes(text: Any) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (TypeError, ValueError, binascii.Error):
        raise EnvClientError(f"the server answered a snapshot that is not base64: {str(text)[:80]!r}") from None


def _cut_short(exc: BaseException) -> bool:
    """A handshake failure worth another try: the server was reached, its answer lost."""
    return isinstance(exc, (EOFError, ConnectionResetError)) or isinstance(
        exc.__cause__, (EOFError, ConnectionResetError)
    )


def _refusal(exc: BaseException) -> Optional[str]:
    """Why a resume handshake was refused for good (the session is gone: 404, or not this
    client's: 403), from the server's answer; None for a failure worth another try."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status not in (403, 404):
        return None
    try:
        detail = json.loads(response.body)["detail"]
    except Exception:
        detail = f"HTTP {status}"
    return str(detail)


def _is_open(ws: Any) -> bool:
    from websockets.protocol import State

    return ws.state is State.OPEN


async def _pending_error(ws: Any) -> Optional[Dict[str, Any]]:
    """An error frame the server sent just before closing (e.g. a capacity refusal), if any."""
    try:
        raw = await within(ws.recv(), 1.0)
        message = json.loads(raw)
    except Exception:
        return None
    if isinstance(message, dict) and message.get("type") == "error":
        return message.get("data")
    return None


async def _send_close(ws: Any) -> None:
    """Send the close message (the server ends the session), then close the connection."""
    try:
        if _is_open(ws):
            await ws.send('{"type":"close"}')
    except Exception:
        pass
    await _close_quietly(ws)


def _stop_notice(ws: Any) -> Optional[str]:
    """How the server said, closing ``ws``, that it stops on purpose (its sessions end with it:
    :data:`~.env_server.resume.STOPPING_CLOSE_CODE`, or uvicorn's 1012); None if it did not."""
    received = getattr(getattr(ws, "protocol", None), "close_rcvd", None)
    if received is None:
        return None
    if received.code == 1012 or (received.code == STOPPING_CLOSE_CODE and received.reason == STOPPING_REASON):
        return f"it closed the connection with code {received.code}: {received.reason or 'service restart'}"
    return None


def _closed_by_server(ws: Any) -> bool:
    """Whether the server closed ``ws`` normally (as it does once it has ended the session)."""
    received = getattr(getattr(ws, "protocol", None), "close_rcvd", None)
    return received is not None and received.code == 1000


async def _close_quietly(ws: Any) -> None:
    """Close ``ws``; if its closing handshake does not finish (or this is cancelled, as when the
    sync client's loop stops), drop the TCP connection instead of leaving it to the collector."""
    try:
        await within(ws.close(), 5.0)
    except BaseException as exc:
        transport = getattr(ws, "transport", None)
        if transport is not None:
            transport.abort()
        if not isinstance(exc, Exception):
            raise
