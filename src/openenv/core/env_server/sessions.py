"""Sessions: one environment instance each, and the rules around them.

Every route of the server (``/ws``, ``/mcp`` over HTTP and WebSocket, stateless HTTP calls) goes
through one :class:`SessionManager`. It owns:

* **capacity** — at most ``max_sessions`` sessions (creating ones included) exist at once;
* **execution** — async environments run on the event loop; sync ones run in a bounded
  :class:`WorkerPool` (one thread when ``REQUIRES_SINGLE_THREAD_EXECUTOR``), one call at a time
  per session (an ``asyncio.Lock``, not a thread per session);
* **time limits** — a reset/step/state/tool call that runs past ``step_timeout_s`` is abandoned:
  the caller gets :class:`StepTimeoutError` and the session's environment is discarded (closed once
  its call returns; the next call builds a fresh one). A sync call whose caller went away keeps the
  environment busy: the session's next call waits for it, so two calls never run on one instance;
* **lifetime** — a socket's session lives as long as the socket; one created over HTTP
  (``openenv/session/create``) until it is closed or has been idle, with no socket attached, for
  ``session_timeout_s`` (default :data:`DEFAULT_DETACHED_SESSION_TIMEOUT_S`). A session with a
  socket attached and no call for ``attached_idle_timeout_s`` (``OPENENV_SESSION_IDLE_TIMEOUT_S``)
  is closed too, so idle connections cannot hold every slot; its next call, and a later lookup of
  its id, say why. No session is reaped while a call runs on it. A resumable socket's session
  (:mod:`.resume`) outlives a connection that drops uncleanly, still holding its slot, until its
  grace clock (time without a connection since its last call) passes ``resume_grace_s`` or its
  time without a connection in all passes ``resume_max_suspended_s``;
* **reach** — a call that names a session by id (HTTP ``session_id``, ``Mcp-Session-Id``, the
  playground's ``X-OpenEnv-Session``, ``openenv/session/*``, ``/ws?session_id=``) finds only one
  made to be shared so (:attr:`SessionKind.DETACHED`); a socket's session is reached only through
  its connection or a resume with its token (:meth:`SessionManager.get`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import operator
import secrets
import time
import uuid
from collections import OrderedDict
from enum import Enum
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, FrozenSet, List, Optional, Set, Tuple

import pydantic

from ..utils import timeout_after, within
from . import workspace_diff
from .exceptions import (
    ConcurrencyConfigurationError,
    EnvironmentCallError,
    EnvironmentFactoryError,
    ResumeRefusedError,
    SessionCapacityError,
    SessionCreationError,
    SessionNotFoundError,
    StepTimeoutError,
    WorkersStuckError,
)
from .resume import Resume
from .settings import ServerSettings
from .trajectory import Trajectory
from .types import ConcurrencyConfig, ServerCapacityStatus, SessionInfo
from .workers import Job, WorkerPool

logger = logging.getLogger("openenv.server")

DEFAULT_DETACHED_SESSION_TIMEOUT_S = 300.0
"""Idle seconds after which a session with no socket attached is closed, unless configured."""

CLOSE_TIMEOUT_S = 30.0

REMEMBERED_REAPED = 1024
"""How many ids of sessions closed for idleness are remembered, to tell a late caller why."""
_IDLE_ATTACHED = "(the server's idle timeout, OPENENV_SESSION_IDLE_TIMEOUT_S); open a new connection to start again"
_IDLE_DETACHED = "or a socket attached (ConcurrencyConfig.session_timeout)"
_UNKNOWN = (
    "Unknown session_id: {}. A call that names a session reaches one made with openenv/session/create "
    "and still open; a WebSocket's own session is reached only through its connection (or a resume "
    "with its token)"
)

TEMPORARY_WAIT_S = 30.0
"""How long a stateless HTTP call waits for one of the ``max_sessions`` slots for such calls
when the server has no step timeout (with one, it waits up to that)."""

MCP_ACTIONS = ("list_tools", "call_tool")
"""Action types an MCP environment answers on the event loop, whatever its other steps do."""
_STEP_POSITIONAL = frozenset({"self", "action"})
_read_state = operator.attrgetter("state")


class SessionState(str, Enum):
    CREATING = "creating"
    READY = "ready"
    CLOSING = "closing"
    CLOSED = "closed"


_TRANSITIONS: Dict[SessionState, FrozenSet[SessionState]] = {
    SessionState.CREATING: frozenset({SessionState.READY, SessionState.CLOSING}),
    SessionState.READY: frozenset({SessionState.CLOSING}),
    SessionState.CLOSING: frozenset({SessionState.CLOSED}),
    SessionState.CLOSED: frozenset(),
}


class SessionKind(str, Enum):
    SOCKET = "socket"  # created by a WebSocket and destroyed with it
    DETACHED = "detached"  # created over HTTP; sockets may attach to it one at a time
    TEMPORARY = "temporary"  # one stateless HTTP call; never listed, never counted


@dataclasses.dataclass(eq=False, slots=True)
class Session:
    """One environment instance and its bookkeeping. Fields are only touched on the event loop."""

    id: str
    kind: SessionKind
    state: SessionState = SessionState.CREATING
    env: Any = None
    traits: Optional[EnvTraits] = None
    created_at: float = dataclasses.field(default_factory=time.time)
    last_activity_at: float = 0.0
    step_count: int = 0
    attached: bool = False
    close_requested: bool = False
    close_reason: Optional[str] = None  # why the server closed it, for its next caller
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # one call at a time (FIFO)
    inflight: Optional[Job] = None  # the pool call running on ``env`` (its caller may have left)
    resume: Optional[Resume] = None  # its resume record, where calls carry sequence numbers
    agent_nonce: str = dataclasses.field(default_factory=lambda: secrets.token_hex(8))
    """Bound into the agent credentials minted for it (see :mod:`.roles`): theirs only."""
    trajectory: Optional[Trajectory] = None  # its calls since its last reset, where recording is on
    baseline: Any = None  # its work directory at its last reset or restore (see .workspace_diff)
    # its progress, for the observer (see SessionManager.metrics): since its last reset
    episodes: int = 0
    episode_steps: int = 0
    done: bool = False
    last_reward: Any = None
    reward_total: float = 0.0

    def __post_init__(self) -> None:
        self.last_activity_at = self.created_at
        self.attached = self.kind is SessionKind.SOCKET

    def transition(self, new: SessionState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"session {self.id}: invalid transition {self.state.value} -> {new.value}")
        self.state = new

    def touch(self, step: bool = False) -> None:
        self.last_activity_at = time.time()
        if step:
            self.step_count += 1

    def info(self) -> SessionInfo:
        return SessionInfo(
            session_id=self.id,
            created_at=self.created_at,
            last_activity_at=self.last_activity_at,
            step_count=self.step_count,
            environment_type=type(self.env).__name__ if self.env is not None else "",
        )


def _accepted_kwargs(method: Callable[..., Any], skip: int) -> Optional[FrozenSet[str]]:
    """Names a method accepts as keywords after its first ``skip`` parameters; None: ``**kwargs``."""
    try:
        params = list(inspect.signature(method).parameters.values())[skip:]
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _overrides(cls: type, name: str, base: type) -> bool:
    """``cls`` has a method ``name`` that is not ``base``'s."""
    method = getattr(cls, name, None)
    return method is not None and method is not getattr(base, name, None)


class EnvTraits:
    """How to call one environment class, worked out once per class."""

    __slots__ = ("async_reset", "async_step", "mcp", "on_loop", "reset_kwargs", "step_kwargs", "workspace")

    def __init__(self, cls: type) -> None:
        from .interfaces import Environment

        self.mcp = bool(getattr(cls, "ANSWERS_MCP", False))
        """It answers tools/list and tools/call itself (an MCPEnvironment)."""
        self.on_loop = bool(getattr(cls, "RUNS_ON_EVENT_LOOP", False))
        """The sync reset/step/state are called on the event loop (the class opted in)."""
        self.async_reset = _overrides(cls, "reset_async", Environment)
        if self.mcp:  # MCP actions always run on the loop; others where _step_impl runs
            mcp_base = next(k for k in reversed(cls.__mro__) if vars(k).get("ANSWERS_MCP"))  # (MCPEnvironment)
            self.async_step = _overrides(cls, "step_async", mcp_base) or inspect.iscoroutinefunction(
                getattr(cls, "_step_impl", None)
            )
        else:
            self.async_step = _overrides(cls, "step_async", Environment)
        self.reset_kwargs = _accepted_kwargs(getattr(cls, "reset_async" if self.async_reset else "reset"), 1)
        self.workspace = _overrides(cls, "workspace_dir", Environment)
        """It declares a work directory (``workspace_dir``): its resets take a baseline of it."""
        self.step_kwargs = _accepted_kwargs(getattr(cls, "step_async" if self.async_step else "step"), 2)

    def steps_on_loop(self, action: Any) -> bool:
        """``action`` is stepped with ``step_async`` on the event loop: the class's step is async,
        or it is an MCP action of an environment that answers MCP itself."""
        return self.async_step or (self.mcp and getattr(action, "type", None) in MCP_ACTIONS)

    @staticmethod
    def filter(
        kwargs: Dict[str, Any], accepted: Optional[FrozenSet[str]], positional: FrozenSet[str] = frozenset({"self"})
    ) -> Dict[str, Any]:
        """The ``kwargs`` the method accepts (``accepted``; None: it takes ``**kwargs``), never one
        naming a parameter that is passed positionally (``self``, a step's ``action``)."""
        if not kwargs:
            return kwargs
        if accepted is None:
            if positional.isdisjoint(kwargs):
                return kwargs
            return {k: v for k, v in kwargs.items() if k not in positional}
        return {k: v for k, v in kwargs.items() if k in accepted}


env_traits = functools.cache(EnvTraits)  # one EnvTraits per class


@dataclasses.dataclass
class Counts:
    """What a server's sessions did since it started (temporary ones included): for the observer."""

    resets: int = 0
    steps: int = 0
    """Steps and tool calls that ran to their end."""
    episodes_done: int = 0
    """Episodes that reached ``done``."""
    errors: int = 0
    """Resets, steps and tool calls that failed (the environment's exception, a timeout, a tool's
    error)."""


class SessionManager:
    """Creates, runs and retires sessions; see the module docstring.

    ``factory`` builds one session's environment. ``settings`` says how sessions are run: how
    many, the step timeout, the worker threads, the id prefix, and its limits on idle and
    suspended sessions. Its fields may stand for it: ``SessionManager(Env, max_sessions=2)`` is
    ``SessionManager(Env, ServerSettings(max_sessions=2))``. ``concurrency`` is what the app's
    code says (upstream's :class:`~.types.ConcurrencyConfig`): how many sessions where
    ``settings.max_sessions`` is None, and ``session_timeout``, the idle time after which a session
    with no socket attached is closed (None: :data:`DEFAULT_DETACHED_SESSION_TIMEOUT_S`)."""

    def __init__(
        self,
        factory: Callable[[], Any],
        settings: Optional[ServerSettings] = None,
        *,
        concurrency: Optional[ConcurrencyConfig] = None,
        **fields: Any,
    ) -> None:
        if not callable(factory):
            raise TypeError("factory must be callable")
        if settings is None:
            settings = ServerSettings(**fields)
        elif fields:
            raise TypeError("Pass either settings or the fields it holds, not both")
        self.settings = settings
        concurrency = concurrency or ConcurrencyConfig()
        max_sessions = concurrency.max_concurrent_envs if settings.max_sessions is None else settings.max_sessions
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        limits = settings.limits
        self._factory = factory
        self.factory_name = getattr(factory, "__name__", None) or type(factory).__name__
        self.max_sessions = max_sessions
        # "w3-<uuid>": the id says which of several server processes holds the session.
        self._id_prefix = f"{settings.session_id_prefix}-" if settings.session_id_prefix else ""
        self.session_timeout_s = concurrency.session_timeout or DEFAULT_DETACHED_SESSION_TIMEOUT_S
        self.attached_idle_timeout_s = limits.session_idle_timeout_s or None
        self.resume_grace_s = limits.resume_grace_s
        """How long a resumable socket's session waits for a resume (0: sockets are not resumable)."""
        self.resume_max_suspended_s = limits.resume_suspended_cap_s
        """The most time in all such a session may wait for resumes (None: no bound but the grace)."""
        # id -> (why it was closed, whether calls naming it by id may be told so)
        self._reaped: OrderedDict[str, Tuple[str, bool]] = OrderedDict()
        self.step_timeout_s = settings.step_timeout_s or None
        built = factory  # the class the factory builds, when that can be told without calling it
        while isinstance(built, functools.partial):
            built = built.func
        self.env_cls = built if isinstance(built, type) else None
        if self.env_cls is not None:
            self._check_concurrency(self.env_cls)
        # One thread and no replacement for an environment that needs a single thread: while a
        # call that was given up on still runs, other calls wait for that thread.
        if getattr(self.env_cls, "REQUIRES_SINGLE_THREAD_EXECUTOR", False):
            self.pool = WorkerPool(1, name="openenv-env", batch=settings.sched_batch, max_stuck=0)
        else:
            threads = settings.worker_threads or min(max_sessions + 1, 16)
            self.pool = WorkerPool(threads, name="openenv-env", batch=settings.sched_batch)
        self._sessions: Dict[str, Session] = {}
        self._temporary_slots = asyncio.Semaphore(max_sessions)
        self._background: Set[asyncio.Task] = set()
        self._awaiting_return: Set[Job] = set()  # calls whose environment is closed once they return
        self._max_backlog = 2 * max_sessions + 8  # calls that may wait while every worker is stuck
        self._reaper: Optional[asyncio.Task] = None
        self._closed = False
        self.prepare: Optional[Callable[[Session], None]] = None
        """Called with each session once its environment is in place (also after a rebuild)."""
        self.trajectory_entries = settings.trajectory_entries
        """Entries of each session's trajectory kept (0: none recorded; see :mod:`.trajectory`)."""
        self.counts = Counts()
        """What the sessions did, server-wide (see :class:`Counts`)."""

    # --- capacity and lookup --------------------------------------------------------------

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    def capacity_status(self) -> ServerCapacityStatus:
        return ServerCapacityStatus.from_counts(min(len(self._sessions), self.max_sessions), self.max_sessions)

    def get(self, session_id: str) -> Session:
        """The session named ``session_id`` by a call on any transport, ready for calls:
        :class:`SessionNotFoundError` when there is none, :class:`SessionCreationError` while its
        environment is still being built.

        Only sessions made to be shared by id (:attr:`SessionKind.DETACHED`) are found. A socket's
        own session, attached or waiting for its resume, is answered exactly as an id this server
        never made: ids are seen (handshake headers, logs, error messages), and one alone must not
        step, read or close another client's episode. Its connection holds it; :meth:`resume` (with
        its token) gives it back."""
        session = self._sessions.get(session_id)
        if session is None or session.kind is SessionKind.SOCKET:
            why, by_id = self._reaped.get(session_id, (None, False))
            raise SessionNotFoundError(session_id, why if by_id else _UNKNOWN.format(session_id))
        if session.state is SessionState.CREATING:
            raise SessionCreationError("initializing", f"Session {session_id} is still initializing; retry shortly")
        return session

    def find(self, session_id: str) -> Optional[Session]:
        """The ready session named ``session_id``, of any kind, or None. Only for a caller whose
        credential gives it the right to reach the session (an agent's own, a grader's): an id
        alone reaches none but shared ones (:meth:`get`)."""
        session = self._sessions.get(session_id)
        return session if session is not None and session.state is SessionState.READY else None

    def session_info(self, session_id: str) -> Optional[SessionInfo]:
        session = self._sessions.get(session_id)
        return session.info() if session is not None else None

    def sessions(self) -> Dict[str, Session]:
        return dict(self._sessions)

    # --- environment construction ---------------------------------------------------------

    def _check_concurrency(self, cls: type) -> None:
        if self.max_sessions > 1 and not getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False):
            raise ConcurrencyConfigurationError(cls.__name__, self.max_sessions)

    def _check_workers(self, operation: str) -> None:
        """Refuse a call when every worker is stuck and enough calls already wait for one (each
        session has at most one waiting; the rest are stateless calls or ones given up on)."""
        pool = self.pool
        if pool.exhausted and pool.backlog >= self._max_backlog:
            raise WorkersStuckError(operation, self.step_timeout_s, pool.stuck)

    async def _build_env(self) -> Any:
        operation = "environment construction"
        self._check_workers(operation)
        job = self.pool.submit(self._factory)
        try:
            env = await _with_timeout(job.future, self.step_timeout_s, operation)
        except (asyncio.CancelledError, StepTimeoutError) as exc:
            started = self.pool.abandon(job)
            job.add_done_callback(lambda: self._close_built(job))  # nobody will use what it builds
            if isinstance(exc, StepTimeoutError) and not started:  # it waited for a worker all along
                raise WorkersStuckError(operation, self.step_timeout_s, self.pool.stuck, waited=True) from None
            raise
        except Exception as exc:
            logger.exception("environment factory %r failed", self.factory_name)
            raise EnvironmentFactoryError(self.factory_name) from exc
        if self.env_cls is None:
            try:
                self._check_concurrency(type(env))
            except ConcurrencyConfigurationError:
                self._close_soon(env, None)
                raise
        return env

    def _close_built(self, job: Job) -> None:
        ok, env = job.returned  # type: ignore[misc]
        if ok:
            self._close_soon(env, None)

    # --- session lifecycle ----------------------------------------------------------------

    def new_id(self) -> str:
        """A fresh session id; it starts with this server's prefix (``OPENENV_SESSION_ID_PREFIX``)."""
        return f"{self._id_prefix}{uuid.uuid4()}"

    async def create(self, kind: SessionKind = SessionKind.DETACHED, resume: Optional[Resume] = None) -> Session:
        """Reserve a slot and build the session's environment (raises SessionCapacityError).
        ``resume``: the record of a resumable socket's session, whose id it names already."""
        if self._closed:
            raise SessionCreationError("server is shutting down")
        if len(self._sessions) >= self.max_sessions:
            raise SessionCapacityError(len(self._sessions), self.max_sessions)
        session = Session(resume.session_id if resume is not None else self.new_id(), kind, resume=resume)
        if self.trajectory_entries:
            session.trajectory = Trajectory(self.trajectory_entries)
        self._sessions[session.id] = session
        try:
            env = await self._build_env()
            if session.state is not SessionState.CREATING:  # destroyed while its env was being built
                self._close_soon(env, None)
                raise SessionCreationError("session was closed while it was being created")
            self._install(session, env)
        except BaseException:
            self._sessions.pop(session.id, None)
            if session.state is SessionState.CREATING:
                session.transition(SessionState.CLOSING)
                session.transition(SessionState.CLOSED)
            self._discard_env(session)
            raise
        session.transition(SessionState.READY)
        self._ensure_reaper()
        return session

    def _install(self, session: Session, env: Any) -> None:
        session.env = env
        session.traits = env_traits(type(env))
        if self.prepare is not None:
            self.prepare(session)

    def attach(self, session_id: str) -> Session:
        """Attach a socket to a detached session (one socket at a time); a socket's own session
        is not found by id (:meth:`get`)."""
        session = self.get(session_id)  # a session in the table that is not creating is ready
        if session.attached:
            raise SessionCreationError("attached", f"Session {session_id} is already attached to another connection")
        session.attached = True
        session.touch()
        return session

    async def detach(self, session: Session) -> None:
        """A socket let go of ``session``: destroy it if the socket owned it or a close was requested."""
        session.attached = False
        session.touch()
        if session.kind is SessionKind.SOCKET or session.close_requested:
            await self.destroy(session)

    async def suspend(self, session: Session) -> None:
        """A resumable socket's connection dropped uncleanly: its session waits for :meth:`resume`
        while its clocks allow (:meth:`.resume.Resume.expired`), then the reaper closes it."""
        assert session.resume is not None
        session.resume.suspend()
        session.attached = False
        session.touch()
        if not self.resume_grace_s:
            await self.destroy(session)
        else:
            self._ensure_reaper()

    async def create_once(self, key: str) -> Session:
        """A detached session for the HTTP create with ``key`` (:data:`.resume.CREATE_KEY_HEADER`):
        the one an earlier create with the same key made, if it still exists, else a new one."""
        for session in self._sessions.values():
            if session.resume is not None and session.resume.create_key == key:
                while session.state is SessionState.CREATING:  # the first create still builds it
                    await asyncio.sleep(0.01)
                return self.get(session.id)
        return await self.create(SessionKind.DETACHED, resume=Resume(self.new_id(), create_key=key))

    def resume(self, session_id: str, token: str, owner: Any) -> Tuple[Session, Any]:
        """Give the session named ``session_id`` to the connection ``owner``, if ``token`` is its
        resume token; returns it and the connection that served it until now (None: none). A
        refusal (SessionNotFoundError, ResumeRefusedError) leaves the session as it was."""
        session = self._sessions.get(session_id)
        record = session.resume if session is not None else None
        if session is None or record is None or session.state not in (SessionState.CREATING, SessionState.READY):
            why = self._reaped.get(session_id, ("",))[0] or (
                f"Session {session_id} is not on this server: it was closed, or the server restarted "
                "since (sessions do not survive a restart)"
            )
            raise SessionNotFoundError(session_id, why)
        if not record.admits(token):
            raise ResumeRefusedError(session_id)
        if session.state is SessionState.CREATING:
            raise SessionCreationError("initializing", f"Session {session_id} is still initializing; retry shortly")
        previous = record.take(owner)
        session.attached = True
        session.touch()
        return session, previous

    async def request_close(self, session_id: str) -> Dict[str, Any]:
        """``openenv/session/close``: close now, or once the attached socket lets go."""
        session = self.get(session_id)
        if session.attached:
            session.close_requested = True
            return {"session_id": session_id, "closed": False, "closing": True}
        await self.destroy(session)
        return {"session_id": session_id, "closed": True}

    async def destroy(self, session: Session) -> None:
        """Free the slot at once; close the environment when no call is running on it.

        The closing goes on if the caller is cancelled meanwhile (it waits for the session's lock)."""
        if session.state in (SessionState.CLOSING, SessionState.CLOSED):
            return
        session.transition(SessionState.CLOSING)
        self._sessions.pop(session.id, None)
        await asyncio.shield(self._spawn(self._close_session(session)))

    async def _close_session(self, session: Session) -> None:
        async with session.lock:
            session.transition(SessionState.CLOSED)
            self._discard_env(session)

    def _close_soon(self, env: Any, job: Optional[Job]) -> None:
        """Close ``env`` in the pool, after ``job`` (a call still running on it) has returned, and
        after a sync MCP tool call given up on that still runs on it."""
        if job is None or job.done:
            job = getattr(env, "_abandoned_tool_call", None)
        if isinstance(job, Job) and not job.done:
            self._awaiting_return.add(job)  # shutdown() waits for it

            def returned() -> None:
                self._awaiting_return.discard(job)
                self._close_soon(env, None)

            job.add_done_callback(returned)
            return
        self._spawn(self._close_env(env))

    async def _close_env(self, env: Any) -> None:
        close = getattr(env, "close", None)
        if close is None:
            return
        name = type(env).__name__
        try:
            job = self.pool.submit(close)
        except RuntimeError:  # the pool is shut down: close inline as a last resort
            with contextlib.suppress(Exception):
                close()
            return
        seen_running = False
        while True:
            try:
                await within(asyncio.shield(job.future), CLOSE_TIMEOUT_S)
                return
            except asyncio.TimeoutError:
                if seen_running:  # a whole window since it was seen running
                    logger.warning("%s.close() did not return within %g s", name, CLOSE_TIMEOUT_S)
                    self.pool.abandon(job)  # its worker is stuck: let another take its place
                    return
                seen_running = job.started  # one that started late in this window gets a full one
                if not seen_running:  # every worker is busy (stuck ones, say): a close is never skipped
                    logger.warning("%s.close() still waits for a free worker", name)
            except Exception:
                logger.exception("%s.close() failed", name)
                return

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @contextlib.asynccontextmanager
    async def temporary(self) -> AsyncIterator[Session]:
        """A throw-away session for one stateless HTTP call, never counted as a slot. At most
        ``max_sessions`` run at once; one that waits past :data:`TEMPORARY_WAIT_S` for its turn is
        refused with SessionCapacityError rather than queue forever behind slow ones."""
        slots = self._temporary_slots
        wait = self.step_timeout_s or TEMPORARY_WAIT_S
        try:
            await within(slots.acquire(), wait)
        except asyncio.TimeoutError:
            raise SessionCapacityError(
                self.max_sessions,
                self.max_sessions,
                f"All {self.max_sessions} slots for stateless calls stayed busy for {wait:g} s; try again later",
            ) from None
        session = Session("temporary", SessionKind.TEMPORARY)
        session.transition(SessionState.READY)
        try:
            self._install(session, await self._build_env())
            yield session
        finally:
            session.transition(SessionState.CLOSING)
            session.transition(SessionState.CLOSED)
            self._discard_env(session)
            slots.release()

    # --- calls on a session's environment ---------------------------------------------------

    async def call(
        self,
        session: Session,
        operation: str,
        sync_fn: Optional[Callable[[Any], Any]],
        async_fn: Optional[Callable[[Any], Any]] = None,
        step: bool = False,
        inline: bool = False,
        record: Any = None,
    ) -> Any:
        """Run ``async_fn(env)`` on the loop, or ``sync_fn(env)`` in the pool, under the session's
        lock and the step timeout; then mark the session active (``step`` counts a step). A
        reset, step or tool call gives ``record``, what it asks (its keywords, the action, the
        tool's name and arguments): its outcome goes into the session's progress and trajectory."""
        ok = False
        await session.lock.acquire()
        try:
            env = await self._env_for_call(session, operation)
            timeout = self.step_timeout_s
            job: Optional[Job] = None
            if async_fn is None and not inline:
                self._check_workers(operation)
                job = session.inflight = self.pool.submit(sync_fn, env)  # type: ignore[arg-type]
            try:
                if inline:  # an environment that opted in (RUNS_ON_EVENT_LOOP): no timeout can apply
                    result = sync_fn(env)  # type: ignore[misc]
                else:
                    pending = async_fn(env) if job is None else job.future  # type: ignore[misc]
                    result = await (pending if timeout is None else _with_timeout(pending, timeout, operation))
                    session.inflight = None
            except StepTimeoutError:
                self._given_up(session, job, operation, timeout)
                raise
            except asyncio.CancelledError:
                self._given_up(session, job, operation)
                raise
            # SystemExit, re-raised in a task, would stop the event loop; a ValidationError here is
            # the environment's, not the client's input.
            except (SystemExit, pydantic.ValidationError) as exc:
                raise EnvironmentCallError(exc) from exc
            ok = True
        except Exception as exc:
            if record is not None:
                self.counts.errors += 1
                if session.trajectory is not None:
                    session.trajectory.add(operation, record, None, exc)
            raise
        finally:
            session.lock.release()
            session.touch(step and ok)  # a failing call is activity too: the reaper must wait
            if session.resume is not None:
                session.resume.called()  # (a resume that makes no call does not get here)
        if record is None:
            return result
        # A reset, step or tool call ran to its end: count it, note the session's progress (for
        # the observer: a reward is a number, nothing else of the answer), add it to its trajectory.
        counts = self.counts
        if operation == "reset":
            counts.resets += 1
            session.episodes += 1
            session.episode_steps = 0
            session.reward_total = 0.0
            session.last_reward = None
            session.done = False
        else:
            counts.steps += 1
            session.episode_steps += 1
        reward = getattr(result, "reward", None)
        if isinstance(reward, (int, float)):
            session.last_reward = float(reward)
            if math.isfinite(reward):
                session.reward_total += reward
        if not session.done and getattr(result, "done", False) is True:
            session.done = True
            counts.episodes_done += 1
        if session.trajectory is not None:
            session.trajectory.add(operation, record, result)
        return result

    def metrics(self) -> Dict[str, Any]:
        """Progress, for the observer: the sessions open and the limit, what they did since the
        server started (:class:`Counts`), and each open session's progress since its last reset
        (``steps``; ``total_steps`` since it was made; ``episodes`` begun, ``done``,
        ``last_reward``, ``reward_total``, ``age_s``, ``idle_s``). Never an observation, an action
        or a state."""
        now = time.time()
        counts = self.counts
        return {
            "active_sessions": len(self._sessions),
            "max_sessions": self.max_sessions,
            "resets": counts.resets,
            "steps": counts.steps,
            "episodes_done": counts.episodes_done,
            "errors": counts.errors,
            "sessions": [
                {
                    "session_id": s.id,
                    "kind": s.kind.value,
                    "steps": s.episode_steps,
                    "total_steps": s.step_count,
                    "episodes": s.episodes,
                    "done": s.done,
                    "last_reward": s.last_reward,
                    "reward_total": s.reward_total,
                    "age_s": round(now - s.created_at, 3),
                    "idle_s": round(now - s.last_activity_at, 3),
                }
                for s in self._sessions.values()
                if s.state is SessionState.READY
            ],
        }

    def restored(self, session: Session, baseline: Any) -> None:
        """A snapshot was loaded into the session: its trajectory and work directory's baseline
        start there (the progress counts go on)."""
        if baseline is not None:
            session.baseline = baseline
        if session.trajectory is not None:
            session.trajectory.add("restore", None, None)

    def _given_up(self, session: Session, job: Optional[Job], operation: str, timeout: Optional[float] = None) -> None:
        """The caller stopped waiting: past the step ``timeout`` when one is given, else cancelled.
        An async call (no ``job``) was interrupted halfway: its environment's state is unknown, so
        it is discarded. A pool call that never started is skipped and leaves the environment alone
        (after a timeout: WorkersStuckError); one that runs on keeps ``session.inflight`` (the next
        call waits for it) and, after a timeout, costs the session its environment."""
        if job is None:
            self._discard_env(session)
        elif not self.pool.abandon(job):
            session.inflight = None
            if timeout is not None:
                raise WorkersStuckError(operation, timeout, self.pool.stuck, waited=True) from None
        elif timeout is not None:
            self._discard_env(session)

    async def _env_for_call(self, session: Session, operation: str) -> Any:
        """The session's environment, ready for a call (the session's lock is held)."""
        if session.state is not SessionState.READY:
            raise SessionNotFoundError(session.id, session.close_reason or f"Session {session.id} is closed")
        previous = session.inflight
        if previous is not None and not previous.done:
            # A call whose caller went away still runs on this environment: wait for it, under the
            # step timeout (past it, the environment is closed once that call returns).
            try:
                await _with_timeout(previous.when_done(), self.step_timeout_s, operation)
            except StepTimeoutError:
                self._discard_env(session)
                raise
            session.inflight = None
        env = session.env
        if env is None:  # discarded after a timeout
            env = await self._build_env()
            self._install(session, env)
        return env

    def _discard_env(self, session: Session) -> None:
        env, session.env = session.env, None
        job, session.inflight = session.inflight, None
        if env is not None:
            self._close_soon(env, job)
            if session.baseline is not None:  # the next call builds a fresh one, never reset
                session.baseline = workspace_diff.Unavailable(
                    "its environment was discarded (a call on it timed out, or a restore failed) and rebuilt; "
                    "reset the session to compare with a new baseline"
                )

    def discard_env(self, session: Session) -> None:
        """Close the session's environment (its state is no longer known): its next call builds a
        fresh one."""
        self._discard_env(session)

    def reset(self, session: Session, kwargs: Dict[str, Any]) -> Awaitable[Any]:
        """Reset the session's environment (kwargs filtered by its ``reset`` signature); one that
        declares a work directory has it walked in the same call (the baseline of the grader's
        diff, :mod:`.workspace_diff`)."""
        traits = session.traits
        assert traits is not None
        asked = kwargs
        kwargs = traits.filter(kwargs, traits.reset_kwargs)
        if traits.workspace:
            return self._reset_with_baseline(session, traits, kwargs, asked)
        if traits.async_reset:
            return self.call(session, "reset", None, lambda env: env.reset_async(**kwargs), record=asked)
        return self.call(session, "reset", lambda env: env.reset(**kwargs), inline=traits.on_loop, record=asked)

    async def _reset_with_baseline(
        self, session: Session, traits: EnvTraits, kwargs: Dict[str, Any], asked: Dict[str, Any]
    ) -> Any:
        taken: List[Any] = []
        if traits.async_reset or traits.on_loop:  # the walk still runs in the pool: it reads files

            async def reset_on_loop(env: Any) -> Any:
                observation = await env.reset_async(**kwargs) if traits.async_reset else env.reset(**kwargs)
                taken.append(await self.pool.run(workspace_diff.baseline_of, env, "reset"))
                return observation

            observation = await self.call(session, "reset", None, reset_on_loop, record=asked)
        else:

            def reset(env: Any) -> Any:
                observation = env.reset(**kwargs)
                taken.append(workspace_diff.baseline_of(env, "reset"))
                return observation

            observation = await self.call(session, "reset", reset, record=asked)
        session.baseline = taken[-1]
        return observation

    def step(self, session: Session, action: Any, kwargs: Optional[Dict[str, Any]] = None) -> Awaitable[Any]:
        """Step the session's environment (kwargs filtered by its ``step`` signature)."""
        traits = session.traits
        assert traits is not None
        if kwargs:
            kwargs = traits.filter(kwargs, traits.step_kwargs, _STEP_POSITIONAL)
        if traits.steps_on_loop(action):
            if kwargs:
                return self.call(
                    session, "step", None, lambda env: env.step_async(action, **kwargs), step=True, record=action
                )
            return self.call(session, "step", None, lambda env: env.step_async(action), step=True, record=action)
        sync = (lambda env: env.step(action, **kwargs)) if kwargs else (lambda env: env.step(action))
        return self.call(session, "step", sync, step=True, inline=traits.on_loop, record=action)

    def state(self, session: Session) -> Awaitable[Any]:
        # ``state`` is a plain property even on async environments and may block (read a file, ask
        # a subprocess): it is read in the pool, under the step timeout, never on the loop, unless
        # the environment opted in to RUNS_ON_EVENT_LOOP.
        traits = session.traits
        return self.call(session, "state", _read_state, inline=traits is not None and traits.on_loop)

    # --- idle reaping and shutdown ----------------------------------------------------------

    def _ensure_reaper(self) -> None:
        if (self._reaper is None or self._reaper.done()) and not self._closed:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        shortest = min(
            self.session_timeout_s,
            self.attached_idle_timeout_s or self.session_timeout_s,
            self.resume_grace_s or self.session_timeout_s,
            self.resume_max_suspended_s or self.session_timeout_s,
        )
        interval = max(0.05, min(shortest / 4, 5.0))
        while True:
            await asyncio.sleep(interval)
            await self.reap_idle()

    async def reap_idle(self) -> int:
        """Destroy the sessions idle past their limit (see the module docstring); returns how many."""
        now = time.time()
        idle = []
        for s in self._sessions.values():
            if s.state is not SessionState.READY or s.lock.locked():
                continue
            if not s.attached and s.kind is SessionKind.SOCKET and s.resume is not None:  # waiting for its resume
                spent = s.resume.expired(self.resume_grace_s, self.resume_max_suspended_s)
                if spent is not None:
                    idle.append((s, f"Session {s.id} was closed: {spent}"))
                continue
            bound = self.attached_idle_timeout_s if s.attached else self.session_timeout_s
            if bound is not None and s.last_activity_at < now - bound:
                why = _IDLE_ATTACHED if s.attached else _IDLE_DETACHED
                idle.append((s, f"Session {s.id} was closed after {bound:g} s without a call {why}"))
        for session, reason in idle:
            logger.info("%s", reason)
            session.close_reason = reason
            self._reaped[session.id] = (reason, session.kind is not SessionKind.SOCKET)
            while len(self._reaped) > REMEMBERED_REAPED:
                self._reaped.popitem(last=False)
            await self.destroy(session)
        return len(idle)

    def reopen(self) -> None:
        """Accept sessions again after :meth:`shutdown` (the app is served again: a second
        ``TestClient(app)`` block, say), with a fresh worker pool."""
        if not self._closed:
            return
        self._closed = False
        # calls of a loop that has closed: nothing can wait for them (or close their envs) now
        self._awaiting_return = {job for job in self._awaiting_return if not job.future.get_loop().is_closed()}
        old = self.pool
        self.pool = WorkerPool(old.max_workers, name="openenv-env", batch=old.batch, max_stuck=old.max_stuck)
        self._temporary_slots = asyncio.Semaphore(self.max_sessions)

    async def shutdown(self) -> None:
        """Destroy every session and stop the reaper; no new sessions until :meth:`reopen`."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for session in list(self._sessions.values()):
            await self.destroy(session)
        # Environments whose last call still runs (a client left mid-step): close them when it
        # returns, rather than leave them (and whatever they hold) open after the server.
        loop = asyncio.get_running_loop()
        returns = [job.when_done() for job in self._awaiting_return if job.future.get_loop() is loop]
        if returns:
            logger.info("waiting up to %.0f s for %d environment call(s) to return", CLOSE_TIMEOUT_S, len(returns))
            await asyncio.wait(returns, timeout=CLOSE_TIMEOUT_S)
        if self._background:
            await asyncio.wait(set(self._background), timeout=CLOSE_TIMEOUT_S)
        if self._awaiting_return:
            logger.warning(
                "%d environment(s) left unclosed: their calls did not return within %.0f s",
                len(self._awaiting_return),
                CLOSE_TIMEOUT_S,
            )
        self.pool.shutdown()


async def _with_timeout(awaitable: Any, timeout: Optional[float], operation: str) -> Any:
    """Await ``awaitable``; past ``timeout`` seconds (None: no limit), raise StepTimeoutError."""
    if timeout is None:
        return await awaitable
    try:
        async with timeout_after(timeout) as scope:
            return await awaitable
    except TimeoutError:
        if scope.expired():
            raise StepTimeoutError(operation, timeout) from None
        raise  # the environment's own TimeoutError
