"""The WebSocket routes: ``/ws`` (the session protocol) and ``WS /mcp`` (JSON-RPC), one connection
each, one session per connection.

Both are served by :class:`WSConnection`, which owns what belongs to a socket: the handshake, the
session it opens, attaches to (``?session_id=``) or resumes (:mod:`..resume`), noticing a client
that leaves, and the close. What a text frame means is its route's :class:`WSProtocol`:
:class:`SessionFrames` for ``/ws`` (JSON objects ``{"type": ..., "data": ...}``, the spec's
section 4) and :class:`MCPFrames` for ``WS /mcp`` (one JSON-RPC message per frame, answered by
:mod:`.mcp`); each decodes a frame into a call for the one dispatch (:mod:`..dispatch`)
and encodes its answer. A bad frame of any kind (not JSON, not an object, binary, too large,
unknown type, invalid action) gets an error answer and the connection goes on.

A client leaving during a long call is noticed within ``WATCH_AFTER_S`` (:class:`ConnectionWatch`):
the call is cancelled (a sync one finishes in its worker, then its environment is closed) and the
session's slot is freed; but on a resumable connection the call runs to its end and its answer
waits, with the session, for the client to resume. A frame may carry its call's number (``"seq"``
beside the frame's own keys) once the handshake granted a resume. A server that stops on purpose
closes its connections with :data:`..resume.STOPPING_CLOSE_CODE` and :data:`..resume.STOPPING_REASON`
(:meth:`WSContext.stopping`, and the protocol of :mod:`.._compat.uvicorn`): their sessions end, and
clients are not left trying to resume them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import urllib.parse
from enum import Enum
from typing import Any, Deque, Dict, FrozenSet, Optional, Sequence, Set

import pydantic
from starlette.routing import Match

from .. import resume
from ..dispatch import Call, Dispatcher, Op
from ..edges.middleware import refuse_handshake, route_path
from ..exceptions import MessageTooLargeError, OpenEnvError, kind_of
from ..mcp_types import JsonRpcErrorCode, JsonRpcResponse, WSMCPMessage
from ..roles import ForbiddenError, Role, audit_line, principal_of
from ..serialization import (
    WS_ENVELOPE_KEYS,
    deserialize_action,
    dumps_json,
    error_frame,
    error_frame_of,
    observation_message_json,
    parse_json,
)
from ..sessions import Session, SessionKind, SessionState
from ..snapshots import snapshot_bytes, snapshot_text
from ..types import ResetRequest, WSErrorCode, WSResetMessage, WSStateMessage, WSStepMessage
from .mcp import BINARY_FRAME, MCPProtocol, rpc_error

PIPELINE_DEPTH = 16
"""Frames a watcher reads ahead while a step runs; beyond that TCP backpressure applies."""

PIPELINE_MAX_CHARS = 1024 * 1024
"""Characters a watcher reads ahead while a step runs: a connection holds at most this plus one
frame of up to the message limit (not ``PIPELINE_DEPTH`` frames of that size)."""

WATCH_AFTER_S = 0.05
"""A step running longer than this gets a watcher that notices the client leaving."""

_BARE_KEYS = frozenset({"type"})
_OF_THE_SESSION = {"agent_token": Op.MINT_AGENT, "grade": Op.GRADE, "trajectory": Op.TRAJECTORY, "diff": Op.DIFF}
"""Bare frames answered with what the dispatch says of the connection's own session."""
_EMPTY_RESULT = JsonRpcResponse.success({})
_RESET_CHECKED = ("seed", "episode_id")


_BINARY = error_frame(
    WSErrorCode.UNSUPPORTED_FRAME, "Binary frames are not supported: send each message as a JSON text frame"
)


def _envelope_error(model: type, message: Any) -> str:
    """Validate a malformed envelope against its model to report pydantic's own errors."""
    try:
        model.model_validate(message)
    except pydantic.ValidationError as exc:
        return error_frame_of(exc, "")
    return error_frame(WSErrorCode.VALIDATION_ERROR, "Invalid message")


CLOSE = object()  # a protocol's reply to a close message
READ_TO_END_S = 1.0  # how long a connection whose reply failed is read for how it ended


def _is_close_message(text: str) -> bool:
    try:
        message = parse_json(text)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("type") == "close"


class ConnectionWatch:
    """Starts watchers for connections whose current step has run past ``WATCH_AFTER_S``: one
    sweeper task per server wakes every ``WATCH_AFTER_S`` while connections exist, so a step costs
    two attribute writes rather than a task of its own."""

    def __init__(self) -> None:
        self._connections: Set[WSConnection] = set()
        self._sweeper: Optional[asyncio.Task] = None

    def register(self, connection: WSConnection) -> None:
        self._connections.add(connection)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def unregister(self, connection: WSConnection) -> None:
        self._connections.discard(connection)

    def connections(self) -> Set[WSConnection]:
        """The connections being served now."""
        return set(self._connections)

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while self._connections:
            await asyncio.sleep(WATCH_AFTER_S)
            late = loop.time() - WATCH_AFTER_S
            for connection in list(self._connections):
                since = connection.busy_since
                if since is not None and since <= late:
                    connection.start_watcher()


@dataclasses.dataclass
class WSContext:
    """What the WebSocket routes need of their server."""

    dispatcher: Dispatcher
    max_message_chars: int
    mcp: MCPProtocol
    watch: ConnectionWatch = dataclasses.field(default_factory=ConnectionWatch)
    protocols: Dict[str, WSProtocol] = dataclasses.field(default_factory=dict)
    """Each WebSocket route's protocol, by path."""

    def __post_init__(self) -> None:
        self.manager = self.dispatcher.manager
        self.protocols = {"/ws": SessionFrames(self), "/mcp": MCPFrames(self)}

    async def stopping(self) -> None:
        """The server stops on purpose (its app's lifespan ends): close every connection still
        served with the close code and reason that say so, so that no client waits to resume."""
        await asyncio.gather(*(connection.server_stopping() for connection in self.watch.connections()))


class WebSocketRoutes:
    """ASGI middleware serving the WebSocket routes (``/ws``, ``/mcp``) itself, ahead of the
    framework's routing and exception wrappers (they would add a layer to every frame sent);
    everything else passes through, but a WebSocket handshake to a path none of ``routes`` (the
    app's) takes gets a 404 that says so. (Starlette's own answer is a close before accepting,
    which reaches the client as a 403, the status of a refused token.)"""

    def __init__(self, app: Any, context: WSContext, routes: Sequence[Any] = ()) -> None:
        self.app = app
        self.context = context
        self.routes = routes

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        protocol = self.context.protocols.get(route_path(scope))
        if protocol is not None:
            await WSConnection(self.context, scope, receive, send, protocol).run()
        elif self.routes and not any(route.matches(scope)[0] is not Match.NONE for route in self.routes):
            path = route_path(scope)
            detail = f"no WebSocket route at {path}: this server's are /ws and /mcp, under its base URL"
            await refuse_handshake(receive, send, scope, 404, {"detail": detail, "code": "NOT_FOUND"})
        else:
            await self.app(scope, receive, send)


class ConnectionState(str, Enum):
    """Where a ``/ws`` connection stands; moves are checked against ``_CONNECTION_MOVES``."""

    HANDSHAKE = "handshake"  # accepted or being accepted; no session yet
    OPEN = "open"  # its session is attached: messages are served
    GONE = "gone"  # the client left (or its transport failed): nothing more is read or sent
    CLOSING = "closing"  # the server is closing it (a close message, a session refused or reaped)
    CLOSED = "closed"  # its session is let go of: the handler has returned


_CONNECTION_MOVES: Dict[ConnectionState, FrozenSet[ConnectionState]] = {
    ConnectionState.HANDSHAKE: frozenset(
        {ConnectionState.OPEN, ConnectionState.GONE, ConnectionState.CLOSING, ConnectionState.CLOSED}
    ),
    ConnectionState.OPEN: frozenset({ConnectionState.GONE, ConnectionState.CLOSING, ConnectionState.CLOSED}),
    ConnectionState.GONE: frozenset({ConnectionState.CLOSED}),
    ConnectionState.CLOSING: frozenset({ConnectionState.GONE, ConnectionState.CLOSED}),
    ConnectionState.CLOSED: frozenset(),
}


class WSConnection:
    """Serves one WebSocket connection over raw ASGI ``receive``/``send``; ``protocol`` says what
    its frames mean."""

    def __init__(
        self, context: WSContext, scope: Dict[str, Any], receive: Any, send: Any, protocol: WSProtocol
    ) -> None:
        self.context = context
        self.manager = context.manager
        self.protocol = protocol
        self.scope = scope
        self.receive = receive
        self.send = send
        self.session: Optional[Session] = None
        self.max_chars = context.max_message_chars
        self.busy_since: Optional[float] = None  # loop time the current step began
        self.state = ConnectionState.HANDSHAKE
        self._task: Optional[asyncio.Task] = None
        self._watcher: Optional[asyncio.Task] = None
        self._backlog: Deque[Dict[str, Any]] = collections.deque()
        self.clean = False  # the client ended the session (a close message, or close code 1000)
        self.stopping = False  # the connection ended because the server stops (or its client goes away)
        self.superseded = False  # a resume gave its session to another connection
        self.accepted = False
        self.principal = principal_of(scope)
        """Who opened the connection (see :mod:`..roles`): every frame's call is theirs."""

    def _move(self, new: ConnectionState) -> None:
        if new not in _CONNECTION_MOVES[self.state]:
            raise RuntimeError(f"/ws connection: invalid transition {self.state.value} -> {new.value}")
        self.state = new

    def _gone(self) -> None:
        """The client left: say so, once (a closing connection may notice it too)."""
        if self.state in (ConnectionState.HANDSHAKE, ConnectionState.OPEN, ConnectionState.CLOSING):
            self._move(ConnectionState.GONE)

    async def _close(self, code: int) -> None:
        """Send the close frame (the server closes the connection)."""
        if self.state not in (ConnectionState.GONE, ConnectionState.CLOSING):  # (closing already as the server stops)
            self._move(ConnectionState.CLOSING)
        with contextlib.suppress(Exception):
            await self.send({"type": "websocket.close", "code": code})

    async def run(self) -> None:
        try:
            if (await self.receive())["type"] == "websocket.connect":
                self.session = await self._open_session()
                if self.session is not None:
                    self._move(ConnectionState.OPEN)
                    await self._serve()
        finally:
            self._move(ConnectionState.CLOSED)

    async def _serve(self) -> None:
        # The connection's calls run in a task of their own. A coroutine resumed after an await
        # re-enters every frame that awaits it: here, the ASGI chain of uvicorn, Starlette,
        # FastAPI and the edges (about a dozen frames), once per message, or twice for a step
        # handed to a worker. Awaiting a task, that chain sleeps until the connection ends.
        # Cancelling this coroutine's task (the server stopping) cancels the awaited one too.
        await asyncio.get_running_loop().create_task(self._serve_here())

    async def _serve_here(self) -> None:
        self._task = asyncio.current_task()
        watch = self.context.watch
        watch.register(self)
        try:
            await self._process()
        except asyncio.CancelledError:
            if self.state is not ConnectionState.GONE:
                raise  # cancelled from outside (server shutdown)
            if hasattr(self._task, "uncancel"):  # Python 3.11+
                self._task.uncancel()  # type: ignore[union-attr]
        finally:
            watch.unregister(self)
            await self._stop_watcher()
            await self._release()

    async def _release(self) -> None:
        """Let go of the session, once: it waits for a resume if its connection dropped uncleanly."""
        session, self.session = self.session, None
        if session is None or self.superseded:
            return
        if session.resume is not None:
            if session.resume.owner not in (None, self):  # another connection has resumed it
                return
            session.resume.owner = None
        if (
            session.kind is SessionKind.SOCKET
            and session.resume is not None
            and session.resume.seq  # (before its first call there is nothing to resume)
            and not self.clean
            and not self.stopping  # (no resume will come: the server's sessions end with it)
            and session.state is SessionState.READY
        ):
            await self.manager.suspend(session)
        else:
            await self.manager.detach(session)

    async def server_stopping(self) -> None:
        """Close this connection because the server stops (see :meth:`WSContext.stopping`); the
        session is let go of once the client has answered the close, or its call has returned."""
        if self.state is not ConnectionState.OPEN:
            return
        self.stopping = True
        self._move(ConnectionState.CLOSING)
        message = {"type": "websocket.close", "code": resume.STOPPING_CLOSE_CODE, "reason": resume.STOPPING_REASON}
        with contextlib.suppress(Exception):  # (bounded: a client that reads nothing must not hold the stop up)
            await asyncio.wait_for(self.send(message), READ_TO_END_S)

    def supersede(self) -> None:
        """A resume took this connection's session: stop serving it (a call under way finishes,
        its answer recorded for the resumed connection)."""
        self.superseded = True
        self._gone()
        if self.busy_since is None and self._task is not None:
            self._task.cancel()

    # --- noticing a client that leaves while a long step runs ---------------------------------
    # This task reads frames between steps; while a step runs past WATCH_AFTER_S, a watcher task
    # (started by ConnectionWatch) reads for it: frames go to the backlog, a disconnect cancels the step.

    def start_watcher(self) -> None:
        if self._watcher is None and self.state is ConnectionState.OPEN:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        backlog = self._backlog
        held = sum(len(m.get("text") or "") for m in backlog)
        try:
            while len(backlog) < PIPELINE_DEPTH and held < PIPELINE_MAX_CHARS:
                message = self._admit(await self.receive())
                if message["type"] == "websocket.disconnect":
                    break
                held += len(message.get("text") or "")
                backlog.append(message)
            else:
                return  # backlog full: leave the rest in the socket (backpressure)
        except Exception:  # the transport failed: same as a disconnect
            pass
        self._gone()
        resumable = self.session is not None and self.session.resume is not None
        if self.busy_since is not None and self._task is not None and not resumable:
            self._task.cancel()

    async def _stop_watcher(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    def _admit(self, message: Dict[str, Any]) -> Dict[str, Any]:
        """The message as kept until it is handled: too large a text, or any binary payload, is
        kept as the ``reply`` (an error frame) it gets."""
        text = message.get("text")
        if text is not None:
            if len(text) <= self.max_chars:
                return message
            too_large = MessageTooLargeError(len(text), self.max_chars, "characters")
            return {"type": "websocket.receive", "reply": self.protocol.refusal(too_large)}
        if message["type"] == "websocket.disconnect":
            code = message.get("code")
            self.clean = code == 1000
            # 1001/1012: the server closes it as it stops (or the client goes away): no resume
            self.stopping = self.stopping or code in resume.SERVER_CLOSE_CODES
            return message
        return {"type": "websocket.receive", "reply": self.protocol.binary}

    async def _open_session(self) -> Optional[Session]:
        """Accept the handshake and open (or attach to, or resume) the connection's session."""
        if self.principal.role is not Role.ORCHESTRATOR:  # a socket opens a session: the orchestrator's to do
            refused = ForbiddenError(self.principal, "session/create")
            audit_line(self.principal, "session/create", None, "refused: a WebSocket session")
            await refuse_handshake(None, self.send, self.scope, 403, {"detail": refused.text, "code": "FORBIDDEN"})
            return None
        query = urllib.parse.parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        session_id = query.get("session_id", [None])[-1]
        opt_in, target = resume.handshake_asks(self.scope.get("headers") or ())
        resumable = opt_in and bool(self.manager.resume_grace_s)
        if resumable and target is not None:
            return await self._resume(*target)
        try:
            if session_id:  # a detached session: resumable by its id, so its token is no extra secret
                session = self.manager.attach(session_id)
                if resumable:
                    session.resume = session.resume or resume.Resume(session_id=session.id)
                    session.resume.owner = self
                try:
                    await self._accept(session.resume if resumable else None)
                except BaseException:
                    await self.manager.detach(session)  # (the handshake failed: let it go again)
                    raise
                return session
            record = resume.Resume(self.manager.new_id(), owner=self) if resumable else None
            await self._accept(record)
            return await self.manager.create(SessionKind.SOCKET, resume=record)
        except Exception as exc:
            frame = self.protocol.open_refused(exc)
            close_code = kind_of(exc).close_code
        if not self.accepted:  # (an attach refused before the accept)
            await self._accept(None)
        with contextlib.suppress(Exception):
            await self.send({"type": "websocket.send", "text": frame})
        await self._close(close_code)
        return None

    async def _accept(self, record: Optional[resume.Resume]) -> None:
        await self.send({"type": "websocket.accept", "headers": resume.handshake_grant(record) if record else []})
        self.accepted = True

    async def _resume(self, session_id: str, token: str) -> Optional[Session]:
        try:
            session, previous = self.manager.resume(session_id, token, self)
        except OpenEnvError as exc:
            kind = kind_of(exc)
            await refuse_handshake(
                None, self.send, self.scope, kind.http_status, {"detail": exc.text, "code": kind.ws_code}
            )
            return None
        if previous is not None:  # before any await: the old connection must not let go of it
            previous.supersede()
        await self._accept(session.resume)
        return session

    async def _process(self) -> None:
        send, receive, backlog = self.send, self.receive, self._backlog
        loop = asyncio.get_running_loop()
        # Our protocol writes a text message at once where it can (see _compat.uvicorn), sparing the
        # ASGI send's coroutine and websockets' framing.
        send_now = getattr(getattr(send, "__self__", None), "send_text_now", None)
        protocol = self.protocol
        while True:
            if self.superseded:
                return
            if backlog:
                message = backlog.popleft()
            elif self.state is ConnectionState.GONE:
                return
            else:
                message = self._admit(await receive())
                if message["type"] == "websocket.disconnect":
                    self._gone()
                    return
            text = message.get("text")
            self.busy_since = loop.time()
            try:
                reply = await protocol.reply(self, text) if text is not None else message["reply"]
            finally:
                self.busy_since = None
            if self._watcher is not None:
                await self._stop_watcher()
            if reply is CLOSE:
                self.clean = True
                # Free the slot before the close frame goes out: a client that reconnects as soon as
                # its close completes must find it free.
                await self._release()
                await self._close(1000)
                return
            if reply is None:  # (a JSON-RPC notification: no answer)
                continue
            if send_now is None or not send_now(reply):
                try:
                    await send({"type": "websocket.send", "text": reply})
                except Exception:
                    await self._read_how_it_ended()
                    self._gone()
                    return
            session = self.session
            if session is not None and session.close_reason is not None:
                # the server closed the session under this socket (it sat idle too long): the
                # error frame just sent says why, and the connection has nothing left to serve
                await self._close(1008)
                return

    async def _read_how_it_ended(self) -> None:
        """A reply could not be sent: the client may have closed on purpose while its call ran
        (its close message and close frame already received, and answered by the protocol
        layer). Read what is left, briefly, so such a session ends rather than wait for a resume."""
        if any(_is_close_message(message.get("text") or "") for message in self._backlog):
            self.clean = True  # (read by the watcher while the call ran)
            return
        if self.state is ConnectionState.GONE:
            return  # the watcher read up to the disconnect (and its close code)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._read_to_the_end(), READ_TO_END_S)

    async def _read_to_the_end(self) -> None:
        for _ in range(PIPELINE_DEPTH + 2):
            message = self._admit(await self.receive())  # (a disconnect: records its close code)
            if message["type"] == "websocket.disconnect":
                return
            if _is_close_message(message.get("text") or ""):
                self.clean = True
                return


class WSProtocol:
    """What one WebSocket route's frames mean: how a text frame is answered (a text to send, None
    for nothing, or :data:`CLOSE`), and how its refusals read."""

    binary: str
    """The answer to a binary frame."""

    async def reply(self, connection: WSConnection, text: str) -> Any:
        raise NotImplementedError

    def refusal(self, exc: BaseException) -> str:
        """The answer to a frame refused before it is read (one too large, say)."""
        raise NotImplementedError

    def open_refused(self, exc: BaseException) -> str:
        """The frame sent before closing a connection whose session could not be opened."""
        raise NotImplementedError


class SessionFrames(WSProtocol):
    """``/ws``: ``{"type": "reset" | "step" | "state" | "mcp" | "close", "data": ...}`` frames, and
    ours: ``snapshot`` (answered ``{"type": "snapshot", "data": {"snapshot": <base64>, "bytes": n}}``)
    and ``restore`` (``"data": {"snapshot": <base64>}``, answered with the restored state), and the
    bare ``agent_token``, ``grade``, ``trajectory`` and ``diff``, answered ``{"type": <the same>,
    "data": ...}`` with what their HTTP routes answer of the connection's session (see docs/roles.md)."""

    binary = _BINARY

    def __init__(self, context: WSContext) -> None:
        self.dispatcher = context.dispatcher
        self.action_cls = context.dispatcher.action_cls
        self.mcp = context.mcp

    def refusal(self, exc: BaseException) -> str:
        return error_frame_of(exc, "")

    def open_refused(self, exc: BaseException) -> str:
        return error_frame_of(exc, "could not open a session", fallback=WSErrorCode.SESSION_ERROR)

    async def reply(self, connection: WSConnection, text: str) -> Any:
        """The reply to one text frame of at most the message limit (or CLOSE)."""
        try:
            message = parse_json(text)
        except ValueError as exc:
            return error_frame(WSErrorCode.INVALID_JSON, f"Invalid JSON: {exc}")
        if not isinstance(message, dict):
            return _envelope_error(WSStepMessage, message)
        session = connection.session
        seq = None
        if session is not None and session.resume is not None and resume.SEQ_KEY in message:
            seq = message.pop(resume.SEQ_KEY)
        kind = message.get("type")
        try:
            if kind == "step":  # the hot path, kept first
                data = message.get("data")
                if message.keys() != WS_ENVELOPE_KEYS or not isinstance(data, dict):
                    return _envelope_error(WSStepMessage, message)
                action = deserialize_action(data, self.action_cls)
                observation = await self.dispatcher.run(
                    Call(Op.STEP, (action, None), None, seq, connection.principal), session
                )
                return observation_message_json(observation)
            if kind == "reset":
                data = message.get("data", {})
                if not message.keys() <= WS_ENVELOPE_KEYS or not isinstance(data, dict):
                    return _envelope_error(WSResetMessage, message)
                if any(key in data for key in _RESET_CHECKED):
                    ResetRequest.model_validate(data)  # same bounds on seed / episode_id as HTTP /reset
                observation = await self.dispatcher.run(Call(Op.RESET, data, None, seq, connection.principal), session)
                return observation_message_json(observation)
            if kind == "state" or kind == "close":
                if message.keys() != _BARE_KEYS:
                    return _envelope_error(WSStateMessage, message)
                if kind == "close":
                    return CLOSE
                state = await self.dispatcher.run(Call(Op.STATE, None, None, seq, connection.principal), session)
                return '{"type":"state","data":' + dumps_json(_state_data(state)) + "}"
            if kind == "mcp":
                if not message.keys() <= WS_ENVELOPE_KEYS or not isinstance(message.get("data"), dict):
                    return _envelope_error(WSMCPMessage, message)
                response = await self.mcp.answer(message["data"], session, seq, connection.principal)  # type: ignore[arg-type]
                session.touch()  # type: ignore[union-attr]
                # Every frame gets a reply (the client waits for one): a notification's is an empty result.
                return '{"type":"mcp","data":' + dumps_json((response or _EMPTY_RESULT).model_dump()) + "}"
            if kind == "snapshot":
                if message.keys() != _BARE_KEYS:
                    return _envelope_error(WSStateMessage, message)
                blob = await self.dispatcher.run(Call(Op.SNAPSHOT, None, None, seq, connection.principal), session)
                return dumps_json({"type": "snapshot", "data": {"snapshot": snapshot_text(blob), "bytes": len(blob)}})
            if isinstance(kind, str) and kind in _OF_THE_SESSION:
                if message.keys() != _BARE_KEYS:
                    return _envelope_error(WSStateMessage, message)
                op = _OF_THE_SESSION[kind]
                answer = await self.dispatcher.run(Call(op, None, None, seq, connection.principal), session)
                return dumps_json({"type": kind, "data": {"grade": answer} if op == Op.GRADE else answer})
            if kind == "restore":
                data = message.get("data")
                if message.keys() != WS_ENVELOPE_KEYS or not isinstance(data, dict) or data.keys() != {"snapshot"}:
                    return error_frame(
                        WSErrorCode.VALIDATION_ERROR,
                        'A restore frame is {"type": "restore", "data": {"snapshot": "<base64>"}}',
                    )
                blob = snapshot_bytes(data["snapshot"])
                state = await self.dispatcher.run(Call(Op.RESTORE, blob, None, seq, connection.principal), session)
                return '{"type":"restore","data":{"state":' + dumps_json(_state_data(state)) + "}}"
        except Exception as exc:
            return error_frame_of(exc, "environment call failed")
        shown = kind if isinstance(kind, str) else ("" if kind is None else json.dumps(kind))
        return error_frame(WSErrorCode.UNKNOWN_TYPE, f"Unknown message type: {shown}")


def _state_data(state: Any) -> Any:
    if state is None:
        return {}
    if not isinstance(state, (dict, pydantic.BaseModel)):
        return dict(state)
    return state


class MCPFrames(WSProtocol):
    """``WS /mcp``: one JSON-RPC message per text frame (a notification gets no answer)."""

    binary = dumps_json(BINARY_FRAME.model_dump())

    def __init__(self, context: WSContext) -> None:
        self.mcp = context.mcp

    def refusal(self, exc: BaseException) -> str:
        code = JsonRpcErrorCode.INVALID_REQUEST
        return dumps_json(JsonRpcResponse.error_response(code, str(exc)).model_dump())

    def open_refused(self, exc: BaseException) -> str:
        return dumps_json(rpc_error(exc, None, "could not open an MCP session").model_dump())

    async def reply(self, connection: WSConnection, text: str) -> Any:
        session = connection.session
        assert session is not None
        seq = None
        if session.resume is not None and resume.SEQ_KEY in text:
            try:
                message = parse_json(text)
            except ValueError:
                message = text  # (answered as a parse error below)
            if isinstance(message, dict) and resume.SEQ_KEY in message:
                seq = message.pop(resume.SEQ_KEY)
            text = message
        response = await self.mcp.answer(text, session, seq, connection.principal)
        return None if response is None else dumps_json(response.model_dump())
