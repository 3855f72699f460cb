"""One dispatch: every call on an environment, from any transport, goes through :class:`Dispatcher`.

A transport is a codec around it. It decodes what arrived into a :class:`Call` (an operation, the
session the call names, its sequence number, its payload), hands it to :meth:`Dispatcher.run`
with the session its connection owns if it has one, and encodes what comes back, or renders the
exception raised by its one renderer of the error table (:mod:`.exceptions`). The transports are
``/ws`` and ``WS /mcp`` (:mod:`.transports.ws`), HTTP ``/reset``, ``/step``, ``/state`` and the Task
API (:mod:`.http_server`), JSON-RPC over ``POST /mcp`` and inside ``/ws`` frames
(:mod:`.transports.mcp`), and the web playground (:mod:`.web`). The dispatcher alone decides:

* **which session** a call runs on: the connection's own (``own``); else the one it names by id,
  which finds only sessions made to be shared so (:meth:`.sessions.SessionManager.get`); else,
  for an operation on an environment, a throw-away one (a stateless HTTP call);
* **numbered calls**: a call that carries a sequence number is answered once; sent again, it gets
  the recorded answer (:meth:`.resume.Resume.once`), on every transport alike;
* **MCP**: whether the environment answers tools itself (an ``MCPEnvironment``) or takes MCP
  actions as steps;
* snapshots: sealing a session's state and loading one back (:mod:`.snapshots`);
* the grader's reads of a session: its trajectory since its reset (:mod:`.trajectory`, recorded by
  the session manager) and what changed in its work directory (:mod:`.workspace_diff`); the
  server's metrics;
* the Task API, the environment's metadata and the JSON schemas.

What a transport still owns is what belongs to its wire: framing and parsing, which of its
headers or keys carries the session and the number, noticing a client that leaves, and the shape
of its answers and errors.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, Type

import pydantic

from . import workspace_diff
from .exceptions import (
    NOT_SUPPORTED,
    SESSION_CONFLICT,
    EnvironmentCallError,
    NoMCPError,
    OpenEnvError,
    SessionNotFoundError,
    TaskRefusedError,
)
from .mcp_types import (
    CallToolAction,
    ListToolsAction,
    ListToolsObservation,
    ToolCallFailed,
    ToolError,
    ToolErrorType,
)
from .resume import Resume
from .roles import ALLOWED, OPEN, AgentCredentials, ForbiddenError, Principal, Role, audit_line
from .serialization import to_jsonable
from .sessions import Session, SessionKind, SessionManager
from .snapshots import RestoreFailedError, SnapshotSeal
from .trajectory import render as render_trajectory
from .types import Action, EnvironmentMetadata, Observation, SchemaResponse, State

MCP_ACTION_CLASSES = (CallToolAction, ListToolsAction)

_PRIVILEGED = frozenset(
    {"session/create", "session/close", "snapshot", "restore", "agent/mint", "grade", "trajectory", "diff"}
)
"""Operations an orchestrator makes that leave an audit line (on a server with roles)."""


async def _done(value: Any) -> Any:
    return value


class Op:
    """The operations a :class:`Call` names."""

    RESET = "reset"  # payload: the reset keywords (dict)
    STEP = "step"  # payload: (action, extra keywords of step)
    STATE = "state"
    LIST_TOOLS = "tools/list"  # answers the tools' MCP listings
    CALL_TOOL = "tools/call"  # payload: (name, arguments); answers a :class:`ToolResult`
    CREATE = "session/create"  # payload: a client's create key (or None); answers the Session
    CLOSE = "session/close"  # payload: the id of the session to close
    METADATA = "metadata"
    TASK = "task"  # payload: (environment name, method, arguments)
    VIEW = "view"  # payload: a callable of the environment, run under its session's lock
    SNAPSHOT = "snapshot"  # answers the session's sealed snapshot (bytes)
    RESTORE = "restore"  # payload: a sealed snapshot (bytes); answers the restored state
    MINT_AGENT = "agent/mint"  # answers a credential for the session's agent (see .roles)
    GRADE = "grade"  # answers the environment's grade() of a copy of the session
    SCHEMA = "schema"  # answers the JSON schemas (FastAPI's docs and /list_environments ask it too)
    CAPACITY = "capacity"  # answers the sessions open and the limit
    TRAJECTORY = "trajectory"  # answers the session's trajectory since its last reset (see .trajectory)
    DIFF = "diff"  # answers what changed in the session's work directory since then (see .workspace_diff)
    METRICS = "metrics"  # answers the server's counts and each session's progress


_ON_ENVIRONMENT = frozenset(
    {
        Op.RESET,
        Op.STEP,
        Op.STATE,
        Op.LIST_TOOLS,
        Op.CALL_TOOL,
        Op.VIEW,
        Op.SNAPSHOT,
        Op.RESTORE,
        Op.MINT_AGENT,
        Op.GRADE,
        Op.TRAJECTORY,
        Op.DIFF,
    }
)
"""Operations that run on a session's environment (a throw-away one when the call names none)."""

_OF_A_SESSION = frozenset({Op.SNAPSHOT, Op.RESTORE, Op.MINT_AGENT, Op.GRADE, Op.TRAJECTORY, Op.DIFF})
"""Operations meaningless on a throw-away environment: a call of one names its session."""


@dataclasses.dataclass(slots=True)
class Call:
    """One decoded call: the operation, its payload, the session it names by id (None: the
    connection's own, or none), its sequence number (None: not numbered), and who makes it (the
    principal the edge found: :data:`.roles.OPEN` on a server without tokens)."""

    op: str
    payload: Any = None
    session_id: Optional[str] = None
    seq: Any = None
    principal: Principal = OPEN


@dataclasses.dataclass(slots=True)
class ToolResult:
    """What ``tools/call`` gave: ``value`` is the tool result's payload (an ``MCPEnvironment``'s,
    with both key styles) or, for an environment that takes MCP actions, its observation dumped
    (``observation`` True)."""

    value: Dict[str, Any]
    observation: bool = False


class Dispatcher:
    """Runs :class:`Call` s against one :class:`SessionManager`'s sessions (see the module docstring)."""

    def __init__(
        self,
        manager: SessionManager,
        *,
        env_name: str,
        action_cls: Type[Action],
        observation_cls: Type[Observation],
        state_cls: Type[State],
        reset_observation_cls: Type[Observation],
        snapshots: Optional[SnapshotSeal] = None,
        agents: Optional[AgentCredentials] = None,
    ) -> None:
        self.manager = manager
        self.snapshots = snapshots or SnapshotSeal(env_name=env_name)
        """Seals and opens this server's session snapshots (:mod:`.snapshots`)."""
        self.agents = agents or AgentCredentials()
        """Mints and checks the agents' per-session credentials (:mod:`.roles`)."""
        self.env_name = env_name
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.state_cls = state_cls
        self.reset_observation_cls = reset_observation_cls
        self.takes_mcp_actions = action_cls in MCP_ACTION_CLASSES
        """The environment's actions are MCP actions (it may be no ``MCPEnvironment`` itself)."""
        self._metadata: Optional[EnvironmentMetadata] = None
        self._schema: Optional[Dict[str, Any]] = None
        self._ops: Dict[str, Callable[[Optional[Session], Any], Awaitable[Any]]] = {
            Op.RESET: self._reset,
            Op.STEP: self._step,
            Op.STATE: self._state,
            Op.LIST_TOOLS: self._list_tools,
            Op.CALL_TOOL: self._call_tool,
            Op.VIEW: self._view,
            Op.SNAPSHOT: self._snapshot,
            Op.RESTORE: self._restore,
            Op.MINT_AGENT: self._mint_agent,
            Op.GRADE: self._grade,
            Op.TRAJECTORY: self._trajectory,
            Op.DIFF: self._diff,
        }

    # --- the one entry -------------------------------------------------------------------------

    def run(self, call: Call, own: Optional[Session] = None) -> Awaitable[Any]:
        """The answer to ``call`` (to await); ``own`` is the session of the connection it came
        through. A session named by an id that finds none raises here, before any await. (Not a
        coroutine itself: a step on a connection's own session awaits the session manager's call
        directly, with no frame of the dispatcher's between, as before there was one.)"""
        op = call.op
        principal = call.principal
        if principal is not OPEN:  # a server with roles, and a caller who is no orchestrator
            own = self._authorized(call, own, principal)
        if op not in _ON_ENVIRONMENT:
            return self._session_op(call, own)
        run = self._ops[op]
        session = own if own is not None else self.session_named(call.session_id) if call.session_id else None
        if session is None:
            if op in _OF_A_SESSION:
                raise SessionNotFoundError("", f"'{op}' is of a session: name one (session_id)")
            return self._on_temporary(run, call.payload)
        if call.seq is None:
            return run(session, call.payload)
        record = session.resume
        if record is None:  # numbered calls on a session made without one (HTTP's X-OpenEnv-Seq)
            record = session.resume = Resume(session_id=session.id)
        return record.once(call.seq, lambda: run(session, call.payload))

    async def _on_temporary(self, run: Callable[[Session, Any], Awaitable[Any]], payload: Any) -> Any:
        async with self.manager.temporary() as temporary:
            return await run(temporary, payload)

    # --- roles ------------------------------------------------------------------------------

    def _authorized(self, call: Call, own: Optional[Session], principal: Principal) -> Optional[Session]:
        """Check ``call`` against the table of :mod:`.roles` (:class:`ForbiddenError` when its
        caller may not make it); returns the session it runs on where the role decides that
        (an agent's own; the one a grader names, whatever kind)."""
        op, role = call.op, principal.role
        if role is Role.ORCHESTRATOR:  # (an orchestrator on a server with roles: OPEN is not it)
            if op in _PRIVILEGED:
                audit_line(principal, op, call.session_id or (own.id if own is not None else None), "allowed")
            return own
        if op not in ALLOWED[role]:
            audit_line(principal, op, call.session_id, "refused")
            raise ForbiddenError(principal, op)
        if role is Role.AGENT:
            session = self.agent_session(principal)
            if (call.session_id and call.session_id != session.id) or (own is not None and own is not session):
                audit_line(principal, op, call.session_id, "refused: another session")
                raise ForbiddenError(principal, op, "An agent credential reaches its own session's tools only")
            self._tool_scope(call, session, Role.AGENT)
            return session
        if role is Role.GRADER and op in _ON_ENVIRONMENT:
            if not call.session_id:
                raise ForbiddenError(principal, op, "A grader names the session it inspects (session_id)")
            session = self.manager.find(str(call.session_id))
            if session is None:
                audit_line(principal, op, call.session_id, "refused: no such session")
                raise SessionNotFoundError(str(call.session_id))
            self._tool_scope(call, session, Role.GRADER)
            audit_line(principal, op, session.id, "allowed")
            return session
        return own

    def agent_session(self, principal: Principal) -> Session:
        """The session an agent credential was minted for, while it lives (its nonce matches)."""
        session = self.manager.find(principal.session_id or "")
        if session is None or session.agent_nonce != principal.nonce:
            audit_line(principal, "call", principal.session_id, "refused: the session ended")
            raise ForbiddenError(principal, "tools/call", "This agent credential is no longer valid: its session ended")
        return session

    @staticmethod
    def _tool_scope(call: Call, session: Session, role: Role) -> None:
        """An agent sees all tools but the environment's grader-only ones; a grader only those."""
        grader_tools = frozenset(getattr(type(session.env), "GRADER_TOOLS", ()) or ())
        if call.op == Op.LIST_TOOLS:
            call.payload = (role, grader_tools)
        elif call.op == Op.CALL_TOOL:
            name = call.payload[0]
            if (name in grader_tools) != (role is Role.GRADER):
                raise ToolCallFailed(
                    ToolError(error_type=ToolErrorType.TOOL_NOT_FOUND, message=f"Tool '{name}' not found")
                )

    async def _grade(self, session: Session, _: Any) -> Any:
        """The environment's ``grade()`` run on a copy of ``session`` (sealed, then restored into
        a throw-away instance): the session itself is never touched by the check."""
        seal = self.snapshots
        blob = await self.manager.call(session, "grade (snapshot)", seal.seal)
        async with self.manager.temporary() as copy:
            await self.manager.call(copy, "grade (restore)", lambda env: seal.restore(env, blob))

            def grade(env: Any) -> Any:
                try:
                    return to_jsonable(env.grade())
                except NotImplementedError:
                    raise NoGraderError(type(env).__name__) from None

            return await self.manager.call(copy, "grade", grade)

    async def _trajectory(self, session: Session, _: Any) -> Dict[str, Any]:
        """The session's trajectory (:mod:`.trajectory`): its entries are taken here, on the
        loop, and rendered as JSON in a worker thread (thousands of them take a while)."""
        trajectory = session.trajectory
        if trajectory is None:
            raise NoRecordingError()
        rows, truncated = trajectory.rows()
        rendered = await self.manager.pool.run(render_trajectory, rows, truncated)
        return {"session_id": session.id, **rendered}

    async def _diff(self, session: Session, _: Any) -> Dict[str, Any]:
        """What changed in the session's work directory since its last reset or restore
        (:mod:`.workspace_diff`), walked in the pool under the session's lock."""
        traits = session.traits
        if traits is None or not traits.workspace:
            name = type(session.env).__name__ if session.env is not None else self.env_name
            raise workspace_diff.NoWorkspaceError(name)

        def compare(env: Any) -> Dict[str, Any]:
            before = session.baseline  # (read under the session's lock: the last reset's, or restore's)
            if before is None:
                raise workspace_diff.NoBaselineError(
                    f"Session {session.id} has not been reset since it was made: its work directory has "
                    "no baseline to compare with; reset it first"
                )
            if isinstance(before, workspace_diff.Unavailable):
                raise workspace_diff.NoBaselineError(
                    f"Session {session.id} has no baseline to compare with: {before.why}"
                )
            root = env.workspace_dir()
            if root is None:
                raise workspace_diff.NoWorkspaceError(type(env).__name__)
            return workspace_diff.diff(root, before)

        return {"session_id": session.id, **await self.manager.call(session, "diff", compare)}

    def _mint_agent(self, session: Session, _: Any) -> Awaitable[Dict[str, Any]]:
        credential = self.agents.mint(session.id, session.agent_nonce)
        return _done(credential)

    def session_named(self, session_id: str) -> Session:
        """The session a call names by id (:meth:`.sessions.SessionManager.get`: never another
        connection's own)."""
        return self.manager.get(str(session_id))

    def takes_tools(self, session: Session) -> bool:
        """The session's environment answers ``tools/list`` and ``tools/call``."""
        return (session.traits is not None and session.traits.mcp) or self.takes_mcp_actions

    # --- operations that touch no environment ----------------------------------------------

    async def _session_op(self, call: Call, own: Optional[Session]) -> Any:
        op = call.op
        if op == Op.CREATE:
            if own is not None:  # a connection's own session is the one it creates
                return own
            if call.payload:
                return await self.manager.create_once(call.payload)
            return await self.manager.create(SessionKind.DETACHED)
        if op == Op.CLOSE:
            if own is not None and call.payload == own.id:
                raise CloseOwnSessionError()
            return await self.manager.request_close(str(call.payload))
        if op == Op.METADATA:
            return await self.metadata()
        if op == Op.SCHEMA:
            return self.schema()
        if op == Op.CAPACITY:
            return {"active_sessions": self.manager.active_sessions, "max_sessions": self.manager.max_sessions}
        if op == Op.METRICS:
            return self.manager.metrics()
        if op == Op.TASK:
            return await self._task(*call.payload)
        raise ValueError(f"unknown operation {op!r}")

    def schema(self) -> Dict[str, Any]:
        """The JSON schemas of the action, observation, state and reset observation."""
        if self._schema is None:
            self._schema = SchemaResponse(
                action=self.action_cls.model_json_schema(),
                observation=self.observation_cls.model_json_schema(),
                state=self.state_cls.model_json_schema(),
                reset_observation=self.reset_observation_cls.model_json_schema(),
            ).model_dump()
        return self._schema

    async def env_class(self) -> type:
        """The class the factory builds (when the factory is a function, one is built to see)."""
        if self.manager.env_cls is not None:
            return self.manager.env_cls
        async with self.manager.temporary() as session:
            return type(session.env)

    async def metadata(self) -> EnvironmentMetadata:
        """The environment's ``get_metadata()`` (asked of a throw-away instance, once)."""
        if self._metadata is None:
            async with self.manager.temporary() as session:
                metadata = await self.manager.call(session, "get_metadata", lambda env: env.get_metadata())
            # an EnvironmentMetadata, or a dict of its fields (upstream's response model takes both)
            if not isinstance(metadata, EnvironmentMetadata):
                try:
                    metadata = EnvironmentMetadata.model_validate(to_jsonable(metadata))
                except pydantic.ValidationError as exc:  # the environment's fault, not the client's
                    raise EnvironmentCallError(exc) from exc
            self._metadata = metadata
        return self._metadata

    async def _task(self, env_name: str, method: str, args: Tuple[Any, ...]) -> Any:
        """A Task API ``method`` of a throw-away environment (:class:`TaskRefusedError` when this
        server has no such environment, the environment no such method, or no such task)."""
        if env_name.lower() != self.env_name.lower():
            raise TaskRefusedError(404, f"unknown environment '{env_name}'")
        unsupported = TaskRefusedError(501, f"{method} is not supported for this environment")

        def invoke(env: Any) -> Any:
            return getattr(env, method)(*args)

        async with self.manager.temporary() as session:
            fn = getattr(session.env, method, None)
            if fn is None:
                raise unsupported
            sync_fn, async_fn = (None, invoke) if inspect.iscoroutinefunction(fn) else (invoke, None)
            try:
                return await self.manager.call(session, method, sync_fn, async_fn)
            except NotImplementedError:
                raise unsupported from None
            except IndexError:
                raise TaskRefusedError(400, "Invalid task index") from None

    # --- operations on an environment -------------------------------------------------------

    def _reset(self, session: Session, kwargs: Dict[str, Any]) -> Awaitable[Observation]:
        return self.manager.reset(session, kwargs)

    def _step(self, session: Session, payload: Tuple[Any, Optional[Dict[str, Any]]]) -> Awaitable[Observation]:
        return self.manager.step(session, *payload)

    def _state(self, session: Session, _: Any) -> Awaitable[Any]:
        return self.manager.state(session)

    def _view(self, session: Session, look: Callable[[Any], Any]) -> Awaitable[Any]:
        on_loop = session.traits is not None and session.traits.on_loop
        return self.manager.call(session, "web view", look, inline=on_loop)

    def _snapshot(self, session: Session, _: Any) -> Awaitable[bytes]:
        # in the pool, also for an environment on the loop: a large state takes a while to seal
        return self.manager.call(session, "snapshot", self.snapshots.seal)

    async def _restore(self, session: Session, blob: bytes) -> Any:
        """Load a snapshot into the session's environment; its state is the answer. A snapshot
        this server will not load is refused before the environment is touched; an environment
        whose ``restore_state`` fails is discarded (the session's next call gets a fresh one)."""
        seal = self.snapshots
        seal.check_size(blob)  # before the session is waited for
        workspace = session.traits is not None and session.traits.workspace
        taken: List[Any] = []

        def load(env: Any) -> Any:
            state = seal.restore(env, blob)
            if workspace:  # the grader's diff now compares with the restored work directory
                taken.append(workspace_diff.baseline_of(env, "restore"))
            return state

        try:
            state = await self.manager.call(session, "restore", load)
        except RestoreFailedError as exc:
            self.manager.discard_env(session)
            raise EnvironmentCallError(exc.__cause__ or exc) from exc
        self.manager.restored(session, taken[-1] if taken else None)
        return state

    async def _list_tools(self, session: Session, scope: Any) -> list:
        assert session.traits is not None
        if session.traits.mcp:
            tools = await self.manager.call(session, "tools/list", None, lambda env: env.fastmcp_tools())
            listed = [_tool_listing(tool) for tool in tools]
        else:
            observation = await self._step_mcp_action(session, ListToolsAction())
            if not isinstance(observation, ListToolsObservation):
                raise NoMCPError("Environment answered tools/list without a ListToolsObservation")
            listed = [{**tool.model_dump(), "inputSchema": tool.input_schema} for tool in observation.tools]
        if scope is None:  # an orchestrator: every tool
            return listed
        role, grader_tools = scope
        return [tool for tool in listed if (tool["name"] in grader_tools) == (role is Role.GRADER)]

    async def _call_tool(self, session: Session, payload: Tuple[str, Dict[str, Any]]) -> ToolResult:
        name, arguments = payload
        assert session.traits is not None
        if not session.traits.mcp:
            observation = await self._step_mcp_action(session, CallToolAction(tool_name=name, arguments=arguments))
            return ToolResult(observation.model_dump(mode="json"), observation=True)
        try:
            result = await self.manager.call(
                session,
                "tools/call",
                None,
                lambda env: env.call_tool_payload(name, arguments),
                step=True,
                record=payload,
            )
        except ToolCallFailed:
            session.touch(step=True)  # a failed call is a step too
            raise
        return ToolResult({**result, "structuredContent": result["structured_content"], "isError": result["is_error"]})

    async def _step_mcp_action(self, session: Session, action: Action) -> Observation:
        """The answer of an environment that is no MCPEnvironment but takes MCP actions."""
        if not self.takes_mcp_actions:
            raise NoMCPError("Environment does not support MCP")
        return await self.manager.step(session, action)


class NoRecordingError(OpenEnvError):
    """``trajectory`` on a server that records none."""

    kind = NOT_SUPPORTED

    def __init__(self) -> None:
        super().__init__(
            "This server records no trajectories: set OPENENV_MAX_TRAJECTORY_STEPS (10000, say) or "
            "give it a grader's token (OPENENV_GRADER_TOKEN), which turns recording on"
        )


class NoGraderError(OpenEnvError):
    """``grade`` of an environment that defines no ``grade()``."""

    kind = NOT_SUPPORTED

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} defines no grade(): it has no check for a grader to run")


class CloseOwnSessionError(OpenEnvError):
    """``openenv/session/close`` of the session of the connection it came through."""

    kind = SESSION_CONFLICT

    def __init__(self) -> None:
        super().__init__("Cannot close the session of this connection; close the connection instead")


def _tool_listing(tool: Any) -> Dict[str, Any]:
    """A tools/list entry: the MCP ``Tool`` with its wire names (``inputSchema``, ``_meta``) and
    its empty fields as null, plus ``meta``, so that it carries every key upstream sends
    (name, title, description, inputSchema, outputSchema, icons, annotations, meta, execution)."""
    entry = tool.to_mcp_tool().model_dump(mode="json", by_alias=True)
    entry.setdefault("meta", entry.get("_meta"))
    for key in ("title", "description", "outputSchema", "icons", "annotations", "execution"):
        entry.setdefault(key, None)
    return entry
