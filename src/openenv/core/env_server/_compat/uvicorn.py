"""Everything that relies on uvicorn's internals: a subclass of its sans-I/O WebSocket protocol
(:class:`OpenEnvWebSocketProtocol`) and a guard in front of its HTTP protocol (:func:`guard_http`),
used only where :func:`tested` (for the guard, :func:`guard_tested`) holds: a uvicorn in
:data:`TESTED_UVICORN`, a websockets in :data:`TESTED_WEBSOCKETS`, and ``OPENENV_LIBRARY_INTERNALS``
not ``0``. Elsewhere the runner serves with uvicorn's own protocols and public options: a message
past the frame limit (websockets' ``max_size``) then closes the connection with 1009 instead of
getting an error frame, and the per-client connection cap, the header timeout, the budget of bytes
in flight for WebSocket frames and the bound on unread bytes do not apply.

What it relies on, besides uvicorn's public options:

* of ``WebSocketsSansIOProtocol``: ``data_received`` passing bytes to ``conn.receive_data`` and
  then handling events; ``send_receive_event_to_app`` queueing a message on ``queue`` (from
  ``frames``) and pausing reading (``read_paused``, ``transport.pause_reading``), and ``receive``
  resuming it once the queue is empty; ``handshake_initiated``, ``handshake_complete``,
  ``initial_response``, ``close_sent``, ``disconnected``, ``writable``, ``handle_ping``,
  ``handle_parser_exception``, ``connection_lost``; ``shutdown`` (what uvicorn's server calls on
  each connection when it shuts down) and ``stop_keepalive``;
* of websockets' sans-I/O ``ServerProtocol`` (``conn``): ``extensions``, ``state``, ``fail``,
  ``send_close``, ``data_to_send``, ``close_sent``, ``parser_exc``, ``max_message_size``, and that
  ``receive_data`` parses all it is given before it returns;
* of uvicorn's server, for the guard (``tests/security/test_hostile_clients.py`` checks these
  against the installed release): ``Config(http=...)`` accepts a callable, called with ``config``,
  ``server_state``, ``app_state`` and ``_loop`` for each connection, that returns its
  ``asyncio.Protocol``; an upgrade to WebSocket replaces the protocol with
  ``transport.set_protocol(...)`` inside ``data_received``; the task running the app for a request
  is created inside ``data_received`` with ``loop.create_task``, so it inherits the context
  variables set around that call (uvicorn's opt-in ``reset_contextvars`` breaks this: the runner
  does not guard then).

**The WebSocket protocol** reads a read holding exactly one whole small text frame (under
:data:`PLAIN_MAX_BYTES`, no compression) itself, and writes answers with a frame header of its own
(:meth:`~OpenEnvWebSocketProtocol.send_text_now`), sparing websockets' frame machinery and the ASGI
send's coroutine. It pays for itself (``bench/bench_ws.py``, 2026-12-05, a quiet machine, with it
and without it): server CPU per step at one session 1.63x the raw floor's against 2.09x without
(sync environment), 1.13x against 1.38x (async), 1.42x against 1.57x (echo MCP); at 512 sessions
0.83 of the floor's steps/s against 0.71 (async), 0.60 against 0.48 (echo MCP), 0.65 against 0.58
(sync). Reading
pauses after each message until the app takes it, as in uvicorn's own. It bounds what a client
may make the server hold (the limits table of :mod:`..settings`): following the client's frames
by their headers, it refuses a frame declared larger than the message limit before any of it is
buffered (an uncompressed, unfragmented one gets a ``MESSAGE_TOO_LARGE`` error frame and is
skipped, the connection staying open; any other gets the error frame, then websockets' close code
1009, since skipping it would break the compression context or the message under way); it draws
each large frame's declared size, and each large inflated message's size, from the server's budget
of bytes in flight until the app has taken the message (once spent: a ``SERVER_BUSY`` error frame
and close code 1013); and it drops a client that leaves more than ``max_unsent`` bytes unread (a
ping flood whose pongs it never reads).

When uvicorn shuts the server down, the protocol closes each WebSocket with
:data:`~..resume.STOPPING_CLOSE_CODE` (1001) and :data:`~..resume.STOPPING_REASON` where
uvicorn's own sends 1012 without a reason: the client is told the server stopped on purpose.

**The connection guard** (:class:`GuardedConnection`) bounds what uvicorn's options do not: it has
no time limit while a request head (or a handshake) arrives, so a client sending a byte now and
then holds a connection for ever, and its ``limit_concurrency`` is server-wide and acts only once a
head is complete. The guard refuses a connection (``503``, ``connection: close``) when its client
address has ``max_connections_per_client`` open already (loopback and Unix-socket peers share the
address :data:`~..limits.LOCAL`, capped by ``max_local``, none by default: they are the trainer's own
rollouts, and whatever a forwarder in front relays, which it must bound itself); and it closes a
connection that spends ``header_timeout_s`` without a request under way (:class:`GuardedApp` tells
it): from its accept to its first request reaching the app, and from the end of each HTTP request
to the next (a WebSocket's request lasts as long as the socket).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import sys
from typing import Any, Callable, Dict, Optional, Tuple

import uvicorn
import websockets
from websockets.protocol import State

try:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
except ImportError:  # a uvicorn without the sans-I/O protocol: tested() is False, nothing here is used
    WebSocketsSansIOProtocol = object  # type: ignore[assignment,misc]

from ..exceptions import MessageTooLargeError, ServerBusyError
from ..limits import BUDGET_EXEMPT_BYTES, ConnectionTable, InFlightBudget, ServerLimits, address_of
from ..resume import STOPPING_CLOSE_CODE, STOPPING_REASON
from ..serialization import error_frame_of
from ..settings import library_internals_enabled
from ..ws_frames import client_text, frame_header, text_frame

logger = logging.getLogger("openenv.server")

TESTED_UVICORN = ((0, 30), (1, 0))
"""uvicorn releases CI tests this module against: from the first to before the second."""

TESTED_WEBSOCKETS = ((15, 0), (18, 0))
"""websockets releases CI tests the WebSocket protocol against (it reads ``ServerProtocol``)."""


def _within(module: Any, releases: Tuple[Tuple[int, int], Tuple[int, int]]) -> bool:
    version = tuple(int(part) for part in re.findall(r"\d+", str(module.__version__))[:2])
    low, high = releases
    return low <= version < high


def guard_tested() -> bool:
    """Whether the connection guard may be used: a tested uvicorn, ``OPENENV_LIBRARY_INTERNALS`` not 0."""
    return _within(uvicorn, TESTED_UVICORN) and library_internals_enabled()


def tested() -> bool:
    """Whether the protocol subclass may be used: guard_tested(), uvicorn's sans-I/O protocol, a tested websockets."""
    return guard_tested() and WebSocketsSansIOProtocol is not object and _within(websockets, TESTED_WEBSOCKETS)


# --- the WebSocket protocol ---------------------------------------------------------------------

PLAIN_MAX_BYTES = 64 * 1024
"""The largest frame read without websockets' parser."""

_DATA_OPCODES = (0, 1, 2)  # continuation, text, binary


class OpenEnvWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol with the fast path and the limits of the module docstring."""

    # The server's limits (None: not enforced here), set by bound():
    frame_limit: Optional[int] = None  # largest frame payload accepted, in bytes (the message limit)
    budget: Optional[InFlightBudget] = None  # the server's budget of bytes in flight
    max_unsent: Optional[int] = None  # bytes written, not yet read by the client, past which it is dropped

    _plain: Optional[bool] = None  # no WebSocket extension, a websockets we know: set once accepted
    _screening: Optional[bool] = None  # frames are followed by their headers (None: handshake pending)
    _tracked = False  # every frame byte since the handshake went through _screen: its state is the parser's
    _head = b""  # a frame header received in part, not yet passed on
    _left = 0  # bytes of the current frame's payload still to pass on
    _skip = 0  # bytes of a refused frame's payload still to drop
    _in_message = False  # a fragmented message is under way
    _held = 0  # bytes this connection holds of the budget

    @classmethod
    def bound(cls, limits: ServerLimits, budget: Optional[InFlightBudget]) -> type:
        """This protocol with the server's ``limits`` and ``budget`` (what to pass as uvicorn's ``ws``)."""
        bounds = {"frame_limit": limits.max_message_bytes, "budget": budget, "max_unsent": limits.max_unsent_bytes}
        return type(cls.__name__, (cls,), bounds)

    def _screen(self, data: bytes) -> Optional[bytes]:
        """What of ``data`` to parse: ``data`` less the frames refused here (None: nothing, the
        connection is being refused)."""
        limit, budget = self.frame_limit, self.budget
        pieces = []
        size = len(data)
        pos = 0
        while pos < size:
            if self._skip:
                taken = min(self._skip, size - pos)
                self._skip -= taken
                pos += taken
                continue
            if self._left:
                taken = min(self._left, size - pos)
                pieces.append(data[pos : pos + taken] if pos or taken < size else data)
                self._left -= taken
                pos += taken
                continue
            head = self._head + data[pos : pos + 14] if self._head else data[pos : pos + 14]
            parsed = frame_header(head)
            if parsed is None:  # hold the partial header back until its length is known
                self._head = head
                break
            fin, opcode, header, length = parsed
            pos += header - len(self._head)
            self._head = b""
            if opcode in _DATA_OPCODES:
                if limit is not None and length > limit:
                    self.transport.write(text_frame(error_frame_of(MessageTooLargeError(length, limit), "")))
                    if fin and opcode != 0 and not self._in_message and not self.conn.extensions:
                        self._skip = length  # dropped as it arrives: the connection goes on
                        continue
                    # Refused by websockets (1009) from its header on: pass it, and stop following.
                    self._screening = self._tracked = False
                    pieces.append(head[:header])
                    pieces.append(data[pos:])
                    return b"".join(pieces)
                if budget is not None and length >= BUDGET_EXEMPT_BYTES:
                    if not budget.reserve(length):
                        self._refuse_busy(budget)
                        return None
                    self._held += length
                self._in_message = not fin
            pieces.append(head[:header])
            self._left = length
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _refuse_busy(self, budget: InFlightBudget) -> None:
        """Close the connection at once (the app sees it disconnect): the budget is spent."""
        self.transport.write(text_frame(error_frame_of(ServerBusyError(budget.refusal()), "")))
        self._screening = self._tracked = False
        self._release_held()
        if not self.close_sent and not self.transport.is_closing():
            self.conn.fail(1013, "server busy: bytes in flight at their limit")
            self.handle_parser_exception()

    def _release_held(self) -> None:
        held, self._held = self._held, 0
        if held and self.budget is not None:
            self.budget.release(held)

    async def receive(self) -> Any:
        message = await super().receive()
        if self._held and self.queue.empty() and not self._left:  # the app has all the budget held
            self._release_held()
        return message

    def handle_ping(self) -> None:
        if self.transport.is_closing():  # dropped already: the rest of this read goes unanswered
            return
        super().handle_ping()
        bound = self.max_unsent
        if bound is not None and self.transport.get_write_buffer_size() > bound:
            # The client sends and does not read what it is sent: drop it, and what waits for it.
            logger.warning(
                "dropping a WebSocket client that left more than %d bytes unread (OPENENV_MAX_UNSENT_MB)", bound
            )
            self.close_sent = True
            self._release_held()
            self.transport.abort()

    def handle_parser_exception(self) -> None:
        close = self.conn.close_sent
        if (
            close is not None
            and close.code == 1009
            and not self.close_sent
            and self.frame_limit is not None
            and getattr(self.conn, "max_message_size", None) == self.frame_limit
        ):
            # websockets refused a message past the app's limit (an inflated one, or fragments):
            # say so (not when uvicorn's ws_max_size was set apart from it: that limit closes bare)
            self.transport.write(text_frame(error_frame_of(MessageTooLargeError(None, self.frame_limit), "")))
        super().handle_parser_exception()
        exc = self.conn.parser_exc
        if exc is not None:
            # Its traceback holds the parser's frames, and with them what it had inflated (up to
            # the limit): let that go now rather than at the next full garbage collection.
            exc.__traceback__ = None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._release_held()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        # uvicorn's own closes an open WebSocket of a server it shuts down with 1012 ("service
        # restart") and no reason; say that the server stops, so that a client does not try to
        # resume a session that ends with it (see resume.STOPPING_CLOSE_CODE).
        if (
            self.close_sent
            or self.disconnected
            or not self.handshake_complete
            or self.initial_response is not None
            or self.conn.state is not State.OPEN
        ):
            super().shutdown()
            return
        self.stop_keepalive()
        self.queue.put_nowait({"type": "websocket.disconnect", "code": STOPPING_CLOSE_CODE, "reason": STOPPING_REASON})
        self.conn.send_close(STOPPING_CLOSE_CODE, STOPPING_REASON)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()

    # --- the common case without websockets' frame machinery ----------------------------------

    def _is_plain(self) -> bool:
        """Whether messages may skip websockets' framing: handshake done, no extension (compression)."""
        plain = self._plain
        if plain is None:
            if not self.handshake_complete or self.initial_response is not None:
                return False
            plain = self._plain = not self.conn.extensions
        return plain

    def _between_frames(self) -> bool:
        """Whether websockets' parser waits for the first byte of a frame. It parses all it is given
        at once (sans-I/O), so it does when every frame byte it got went through :meth:`_screen`
        (:attr:`_tracked`), which passes on only whole frames, and no fragmented message is under way."""
        return self._tracked and not self._head and not self._left and not self._skip and not self._in_message

    def data_received(self, data: bytes) -> None:
        # A read holding exactly one small, whole text frame (a request/response client's every
        # message) is queued as it is; anything else goes through websockets' parser.
        conn = self.conn
        if not self.close_sent and self._between_frames() and self._is_plain() and conn.state is State.OPEN:
            text = client_text(data, PLAIN_MAX_BYTES, self.frame_limit)
            if text is not None:
                self.queue.put_nowait({"type": "websocket.receive", "text": text})
                self.read_paused = True  # until the app takes it, as uvicorn's own queueing does
                self.transport.pause_reading()
                return
        if self._screening is None:
            if not self.handshake_initiated:
                super().data_received(data)
                if self.handshake_initiated:
                    # A client sends no frame before the answer to its handshake (RFC 6455, 4.1). If
                    # this read held more than the request head (or the head came in pieces), frame
                    # bytes may have reached websockets unscreened: then every message goes its way.
                    self._tracked = data.find(b"\r\n\r\n") == len(data) - 4
                    self._screening = True
                return
            self._screening = True  # (a handshake initiated before this protocol saw it)
        if self._screening:
            screened = self._screen(data)
            if not screened:
                return
            data = screened
        super().data_received(data)

    def send_text_now(self, text: str) -> bool:
        """Write ``text`` as a text message now, as the ASGI ``send`` would, and return True;
        False when something stands in the way (flow control, a close, an extension): the
        caller then awaits ``send`` as usual."""
        transport = self.transport
        if (
            not self.close_sent
            and not self.disconnected
            and self._is_plain()
            and self.writable.is_set()
            and self.conn.state is State.OPEN
            and not transport.is_closing()
        ):
            transport.write(text_frame(text))
            return True
        return False

    # --- the budget for inflated messages ---------------------------------------------------

    def send_receive_event_to_app(self) -> None:
        if not self.read_paused and not self.close_sent:
            size = sum(map(len, self.frames))
            budget = self.budget
            if budget is not None and size >= BUDGET_EXEMPT_BYTES and self.conn.extensions:
                # an inflated message: its size on the wire said little about this one
                if not budget.reserve(size):
                    self.frames = []
                    self._refuse_busy(budget)
                    return
                self._held += size
        super().send_receive_event_to_app()


def end_refused_handshake(send: object) -> None:
    """A handshake answered with an HTTP response (a refused token's 401) has ended, but uvicorn's
    sans-I/O protocol (ours, and uvicorn's own under ``ws=auto``) does not count it so and logs
    "ASGI callable returned without completing handshake" at ERROR for every refusal: tell it."""
    protocol = getattr(send, "__self__", None)
    if tested() and isinstance(protocol, WebSocketsSansIOProtocol):
        protocol.handshake_complete = True


# --- the connection guard -----------------------------------------------------------------------

_CURRENT: contextvars.ContextVar[Optional[GuardedConnection]] = contextvars.ContextVar(
    "openenv_connection", default=None
)


def client_address(transport: Any) -> str:
    """The address a connection counts against: its peer's IP, or :data:`~..limits.LOCAL`."""
    return address_of(transport.get_extra_info("peername"))


class GuardedConnection(asyncio.Protocol):
    """Stands in front of uvicorn's protocol for one connection (see the module docstring)."""

    def __init__(self, inner: asyncio.Protocol, table: ConnectionTable) -> None:
        self.inner: Any = inner
        self.table = table
        self.transport: Any = None
        self.address: Optional[str] = None
        self.requests = 0  # requests under way (reaching the app)
        self._timer: Optional[asyncio.TimerHandle] = None
        self._upgradable = True  # still the HTTP protocol: watch for the swap to WebSocket

    # --- what the app side tells (GuardedApp) --------------------------------------------------

    def begin(self) -> None:
        self.requests += 1
        self._disarm()

    def end(self) -> None:
        self.requests -= 1
        if self.requests == 0:
            self._arm()

    def _arm(self) -> None:
        timeout = self.table.header_timeout_s
        if timeout and self._timer is None and self.transport is not None and not self.transport.is_closing():
            self._timer = asyncio.get_running_loop().call_later(timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.requests == 0 and not self.transport.is_closing():
            self.table.timed_out += 1
            logger.debug(
                "closing a connection from %s: no request under way within %g s (OPENENV_HEADER_TIMEOUT_S)",
                self.address,
                self.table.header_timeout_s,
            )
            self.transport.close()

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        address = client_address(transport)
        if not self.table.admit(address):
            self.inner = asyncio.Protocol()  # one that does nothing, for the refused connection
            transport.write(self.table.refusal(address))
            transport.close()
            return
        self.address = address
        self._arm()
        token = _CURRENT.set(self)
        try:
            self.inner.connection_made(transport)
        finally:
            _CURRENT.reset(token)

    def data_received(self, data: bytes) -> None:
        token = _CURRENT.set(self)
        try:
            self.inner.data_received(data)
        finally:
            _CURRENT.reset(token)
        if self._upgradable:
            current = self.transport.get_protocol()
            if current is not self:  # upgraded to WebSocket: stay in front of the new protocol
                self._upgradable = False
                self.inner = current
                self.transport.set_protocol(self)

    def eof_received(self) -> Optional[bool]:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        if self.address is not None:
            self.table.leave(self.address)
            self.address = None
        self.inner.connection_lost(exc)


def guard_http(protocol_class: Callable[..., asyncio.Protocol], table: ConnectionTable) -> Callable[..., Any]:
    """What to pass as uvicorn's ``http``: builds ``protocol_class`` for each connection, guarded."""

    def create(**kwargs: Any) -> GuardedConnection:
        return GuardedConnection(protocol_class(**kwargs), table)

    return create


class GuardedApp:
    """The ASGI app in front of the served one: tells the connection's guard when a request (or a
    WebSocket) is under way. Attributes are the served app's (``app.state``, say)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        guard = _CURRENT.get()
        if guard is None or scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        guard.begin()
        try:
            await self.app(scope, receive, send)
        finally:
            guard.end()


# --- putting the limits on a uvicorn server, however it was started ------------------------------

RUNNER_COMMAND = "python -m openenv.core.env_server server.app:app --host 0.0.0.0 --port 8000"
"""The command that serves an app with every limit (in words for warnings)."""

_KEPT_OPTIONS = ("ws", "ws_max_size", "ws_ping_interval", "ws_ping_timeout")


def protect(config: Any, limits: ServerLimits, budget: Optional[InFlightBudget], keep: Any = ()) -> list:
    """Put ``limits`` on a loaded ``uvicorn.Config`` before its server listens: its frame limit
    (``ws_max_size``) is the message limit, its pings are the limits' own, WebSockets are served by
    :class:`OpenEnvWebSocketProtocol` (where :func:`tested`) and every connection is guarded
    (:func:`guard_http`, :class:`GuardedApp`; where :func:`guard_tested` and the limits ask for it).
    Options named in ``keep`` (a caller's own choice of ``ws``, ``ws_max_size``, ...) stay as they
    are. Sets ``config.openenv_connections`` (the :class:`ConnectionTable`, None when connections are
    not guarded), which also marks the config as done. Returns what could not be put on, in words
    (empty: everything)."""
    missing = []
    if config.ws_protocol_class is not None:  # None: WebSockets off (ws="none", or a WSGI app)
        if "ws_max_size" not in keep:
            config.ws_max_size = limits.max_message_bytes
        if "ws_ping_interval" not in keep:
            config.ws_ping_interval = limits.ws_ping_interval_s or None
        if "ws_ping_timeout" not in keep:
            config.ws_ping_timeout = limits.ws_ping_timeout_s or None
        if "ws" not in keep:
            if tested():
                config.ws_protocol_class = OpenEnvWebSocketProtocol.bound(limits, budget)
            else:
                missing.append(
                    "OpenEnv's WebSocket protocol (OPENENV_LIBRARY_INTERNALS=0, or an untested uvicorn/websockets "
                    "release): an oversize frame closes the connection (1009), and the budget of bytes in flight and "
                    "the bound on unread bytes do not apply to WebSocket frames"
                )
    table = None
    wanted = limits.header_timeout_s or limits.max_connections_per_client or limits.max_local_connections
    if wanted:
        if guard_tested() and not getattr(config, "reset_contextvars", False) and not getattr(config, "http2", False):
            table = ConnectionTable.of(limits)
            config.http_protocol_class = guard_http(config.http_protocol_class, table)
            config.loaded_app = GuardedApp(config.loaded_app)
        else:
            missing.append(
                "the connection guard (OPENENV_LIBRARY_INTERNALS=0, an untested uvicorn, or uvicorn options it "
                "cannot work with): no header timeout, no per-client connection cap"
            )
    config.openenv_connections = table
    return missing


_SERVERS = ("uvicorn", "hypercorn", "granian", "daphne")
"""ASGI servers recognised; OpenEnv puts its transport limits on uvicorn only (it knows its internals)."""


def serving() -> Tuple[Optional[str], Any]:
    """The ASGI server running the caller (the package's name, or None for another caller, a test
    client say) and, for uvicorn, its ``Config``: read off the call stack, once per app at the start
    of its lifespan (or of its first request), where the server's own object (uvicorn's
    ``LifespanOn``, a protocol's request cycle) is a caller. Frameworks between the server and the
    app may wrap ``receive`` and ``send`` (FastAPI does, for telemetry), so those cannot say it."""
    found = None
    frame = sys._getframe(1)
    for _ in range(64):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        name = type(owner).__module__.split(".")[0] if owner is not None else None
        if name in _SERVERS:
            found = name
            config = getattr(owner, "config", None)  # uvicorn's middlewares have none; its lifespan has
            if config is not None or name != "uvicorn":
                return name, config
    return found, None


def adopt(limits: ServerLimits, budget: Optional[InFlightBudget]) -> None:
    """At the start of an app's lifespan: when uvicorn serves it but OpenEnv's runner did not set
    it up (uvicorn's command line, ``uvicorn.run``, a gunicorn worker), :func:`protect` its config,
    which its server reads for each connection it accepts once the lifespan has started; when that
    cannot be done, or another server serves the app, a warning naming what is missing and the
    command that has it. Anything else (a test client) is left alone."""
    server, config = serving()
    if server == "uvicorn" and config is not None and getattr(config, "loaded", False):
        if hasattr(config, "openenv_connections"):  # set up by OpenEnv's runner
            return
        missing = protect(config, limits, budget)
        if missing:
            logger.warning(
                "uvicorn serves this app without %s. Serve it with `%s` (or `openenv serve`)",
                "; without ".join(missing),
                RUNNER_COMMAND,
            )
        else:
            logger.info("uvicorn started without OpenEnv's runner: OpenEnv's limits are put on its connections")
    elif server is not None:
        warn_unguarded(server)


def warn_unguarded(server: str) -> None:
    """The warning for a server OpenEnv could not put its transport limits on."""
    logger.warning(
        "%s serves this app without OpenEnv's transport limits: no header timeout, no per-client connection "
        "cap, WebSocket frames buffered up to the server's own limit before the app's message limit applies. "
        "Serve it with `%s` (or `openenv serve`), which has them",
        server,
        RUNNER_COMMAND,
    )


def guarded_connection() -> bool:
    """Whether the request being served arrived on a connection :func:`guard_http` guards."""
    return _CURRENT.get() is not None
