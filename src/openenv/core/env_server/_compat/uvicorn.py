"""Everything that relies on uvicorn's internals: its sans-I/O WebSocket protocol, subclassed
(:class:`OpenEnvWebSocketProtocol`), and a guard in front of its HTTP protocol
(:func:`guard_http`). Both are used only where :func:`tested` holds: a uvicorn release in
:data:`TESTED_UVICORN` and a websockets major in :data:`._compat.websockets.TESTED_MAJORS`, with
``OPENENV_LIBRARY_INTERNALS`` not ``0``. Elsewhere the runner serves with uvicorn's own protocols
and public options only: the frame limit is then websockets' ``max_size`` (a larger message closes
the connection with 1009 instead of an error frame), and the per-client connection cap, the header
timeout, the budget of bytes in flight for WebSocket frames and the bound on unread bytes do not
apply.

What it relies on, besides uvicorn's public options:

* of ``WebSocketsSansIOProtocol``: ``data_received`` passing bytes to ``conn.receive_data`` and
  then handling events; ``send_receive_event_to_app`` queueing a message on ``queue`` (from
  ``frames``) and pausing reading (``read_paused``, ``transport.pause_reading``), and ``receive``
  resuming it once the queue is empty;
  ``handshake_initiated``, ``handshake_complete``, ``initial_response``, ``close_sent``,
  ``disconnected``, ``writable``, ``frames``, ``handle_ping``, ``handle_parser_exception``,
  ``connection_lost``;
* of websockets' sans-I/O ``ServerProtocol`` (``conn``): ``extensions``, ``state``, ``fail``,
  ``close_sent``, ``parser_exc``, ``max_message_size``, and that ``receive_data`` parses all it
  is given before it returns;
* of uvicorn's server, for the guard: the three points of its section below.

**The WebSocket protocol.** uvicorn's sans-I/O WebSocket protocol with a small read-ahead window.

For plain (uncompressed) connections it reads a read that holds exactly one whole small text
frame (under :data:`PLAIN_MAX_BYTES`) itself, and writes an answer with its own frame header
(:meth:`OpenEnvWebSocketProtocol.send_text_now`), sparing websockets' frame machinery and the ASGI
send's coroutine: ``make bench`` measured that as 1.4-2x the server CPU per step without it.
Reading pauses after each message until the app takes it, as uvicorn's own protocol does (a
read-ahead window of four messages measured no better than the noise, and was dropped).

It enforces the server's limits on what a client may make it hold (see :mod:`.limits`; the
runner binds them with :meth:`OpenEnvWebSocketProtocol.bound`): following the client's frames by
their headers (:func:`.ws_frames.frame_header`), it refuses a frame declared larger than the
message limit before any of it is buffered (an uncompressed, unfragmented one is answered with a
``MESSAGE_TOO_LARGE`` error frame and skipped, the connection staying open; any other, once the
error frame is out, is refused by websockets with close code 1009, since skipping it would break
the compression context or the message under way), draws each large frame's declared size, and
each large inflated message's size, from the server's budget of bytes in flight until the app
has taken the message (a client that finds the budget spent gets a ``SERVER_BUSY`` error frame
and close code 1013), and drops a client that keeps the server from writing more than
``max_unsent`` bytes it has not read (a ping flood whose pongs it never reads).

The runners in :mod:`openenv.core.env_server.runner` use it unless told otherwise
(``ws="websockets-sansio"`` restores uvicorn's behaviour).

**The connection guard.** Bounds on connections that uvicorn's public options do not give: a time limit on getting a
request under way, and a cap on connections per client address.

uvicorn has a keep-alive timeout between requests, but none while a request head (or a WebSocket
handshake) is still arriving, so a client that sends a byte now and then holds its connection
(and a file descriptor) for ever; and its ``limit_concurrency`` is server-wide and only answers
once a request head is complete. :func:`guard_http` wraps uvicorn's HTTP protocol in
:class:`GuardedConnection`, which

* refuses a connection, with a ``503`` and ``connection: close``, when its client address has
  ``max_connections_per_client`` open already; loopback and Unix-socket peers count as one
  address, ``local``, with a cap of its own (``max_local``, none by default: they are the
  trainer's own rollouts, and whatever a forwarder in front relays, which it must bound itself);
* closes a connection that spends ``header_timeout_s`` without a request under way: from being
  accepted to its first request reaching the app, and from the end of each HTTP request to the
  next (a WebSocket's request lasts as long as the socket).

It relies on three things uvicorn does today, checked by the tests of
``tests/security/test_hostile_clients.py`` against the installed release:

1. ``Config(http=...)`` accepts a callable that is called with ``config``, ``server_state``,
   ``app_state`` and ``_loop`` for each connection, and returns its ``asyncio.Protocol``;
2. an upgrade to WebSocket replaces the protocol with ``transport.set_protocol(...)`` inside
   ``data_received`` (the guard then puts itself back in front, delegating to the new protocol);
3. the task running the app for a request is created inside ``data_received`` with
   ``loop.create_task`` and thus inherits the context variables set around that call (which is
   how :class:`GuardedApp` tells the guard that a request is under way). uvicorn's opt-in
   ``reset_contextvars`` breaks this: the runner does not guard then.


"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from typing import Any, Callable, Dict, Optional

from websockets.protocol import State

try:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
except ImportError:  # a uvicorn without the sans-I/O protocol: tested() is False, nothing here is used
    WebSocketsSansIOProtocol = object  # type: ignore[assignment,misc]

from ...utils import is_loopback_ip
from ..exceptions import MessageTooLargeError, OpenEnvError, ServerBusyError
from ..limits import BUDGET_EXEMPT_BYTES, InFlightBudget, ServerLimits
from ..settings import library_internals_enabled
from ..ws_frames import client_text, frame_header, text_frame
from . import websockets as websockets_compat

logger = logging.getLogger("openenv.server")

TESTED_UVICORN = ((0, 30), (1, 0))
"""uvicorn releases CI tests this module against: from the first to before the second."""


def _uvicorn_tested() -> bool:
    import uvicorn

    try:
        version = tuple(int(part) for part in uvicorn.__version__.split(".")[:2])
    except ValueError:
        return False
    low, high = TESTED_UVICORN
    return low <= version < high


def guard_tested() -> bool:
    """Whether the connection guard may be used: a tested uvicorn, and
    ``OPENENV_LIBRARY_INTERNALS`` not ``0``."""
    return _uvicorn_tested() and library_internals_enabled()


def tested() -> bool:
    """Whether the WebSocket protocol subclass may be used: a tested uvicorn with its sans-I/O
    protocol, a tested websockets, and ``OPENENV_LIBRARY_INTERNALS`` not ``0``."""
    return guard_tested() and WebSocketsSansIOProtocol is not object and websockets_compat.tested()


# --- the WebSocket protocol ---------------------------------------------------------------------

PLAIN_MAX_BYTES = 64 * 1024
"""The largest frame read without websockets' parser."""

_DATA_OPCODES = (0, 1, 2)  # continuation, text, binary


def _error_frame(error: OpenEnvError) -> bytes:
    """The ``/ws`` error frame of ``error`` (by the table of :mod:`..exceptions`), framed."""
    data = {"message": error.text, "code": error.kind.ws_code, **error.details()}
    return text_frame(json.dumps({"type": "error", "data": data}))


class OpenEnvWebSocketProtocol(WebSocketsSansIOProtocol):
    """:class:`WebSocketsSansIOProtocol` that pauses reading only when messages pile up."""

    _plain: Optional[bool] = None  # no WebSocket extension, a websockets we know: set once accepted

    # --- limits (see the module docstring); None: not enforced here --------------------------

    frame_limit: Optional[int] = None
    """Largest frame payload accepted, in bytes (the app's message limit)."""
    budget: Optional[InFlightBudget] = None
    """The server's budget of bytes in flight."""
    max_unsent: Optional[int] = None
    """Bytes written and not yet read by the client beyond which it is dropped."""

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
        return type(
            cls.__name__,
            (cls,),
            {
                "frame_limit": limits.max_message_bytes,
                "budget": budget,
                "max_unsent": limits.max_unsent_bytes,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
            },
        )

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
                    self.transport.write(_error_frame(MessageTooLargeError(length, limit)))
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
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    def _refuse_busy(self, budget: InFlightBudget) -> None:
        self.transport.write(_error_frame(ServerBusyError(budget.refusal())))
        self._fail(1013, "server busy: bytes in flight at their limit")

    def _fail(self, code: int, reason: str) -> None:
        """Close the connection with ``code`` at once (the app sees it disconnect)."""
        self._screening = self._tracked = False
        self._release_held()
        if self.close_sent or self.transport.is_closing():
            return
        self.conn.fail(code, reason)
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
            self.transport.write(_error_frame(MessageTooLargeError(None, self.frame_limit)))
        super().handle_parser_exception()
        exc = self.conn.parser_exc
        if exc is not None:
            # Its traceback holds the parser's frames, and with them what it had inflated (up to
            # the limit): let that go now rather than at the next full garbage collection.
            exc.__traceback__ = None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._release_held()
        super().connection_lost(exc)

    # --- the common case without websockets' frame machinery ----------------------------------

    def _is_plain(self) -> bool:
        """Whether messages may skip websockets' own framing: the handshake is done and no
        extension (compression) is in use."""
        plain = self._plain
        if plain is None:
            if not self.handshake_complete or self.initial_response is not None:
                return False
            plain = self._plain = not self.conn.extensions
        return plain

    def _between_frames(self) -> bool:
        """Whether websockets' parser waits for the first byte of a frame. It parses whatever it
        is given at once (sans-I/O), so it does when every frame byte it was given went through
        :meth:`_screen` (:attr:`_tracked`), which passed on only whole frames and no fragmented
        message is under way."""
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
                    # A client sends no frame before the server's answer to its handshake (RFC
                    # 6455, 4.1). If this read held more than the request head (or the head came
                    # in pieces), frame bytes may have reached websockets unscreened: the frames
                    # are not tracked then, and every message goes through websockets' parser.
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

LOG_EVERY_S = 10.0
"""Refusals are logged at most this often."""

LOCAL = "local"
"""The address that loopback and Unix-socket peers share."""


def client_address(transport: Any) -> str:
    """The address a connection counts against: its peer's IP, or :data:`LOCAL`."""
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer or not peer[0]:
        return LOCAL  # a Unix socket
    host = str(peer[0])
    return LOCAL if is_loopback_ip(host) else host


def _refusal(address: str, cap: int) -> bytes:
    body = json.dumps(
        {
            "detail": f"too many connections from {address} (the server allows {cap} per client address, "
            "OPENENV_MAX_CONNECTIONS_PER_CLIENT); close some and retry",
            "code": "TOO_MANY_CONNECTIONS",
        }
    ).encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body


class ConnectionTable:
    """The open connections of one server, per client address, and what the guards refused."""

    def __init__(self, max_per_client: int, header_timeout_s: float, max_local: int = 0) -> None:
        self.max_per_client = max_per_client
        self.max_local = max_local
        self.header_timeout_s = header_timeout_s
        self.open: Dict[str, int] = {}
        self.refused = 0
        """Connections refused for the per-client cap."""
        self.timed_out = 0
        """Connections closed for getting no request under way within the header timeout."""
        self._logged_at = 0.0
        self._logged_count = 0

    def log_refusal(self, address: str) -> None:
        """Log refusals at most once every :data:`LOG_EVERY_S` (an attacker must not flood the log)."""
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            logger.warning(
                "refused %d connection(s) since the last report: the cap of %d per client address "
                "(OPENENV_MAX_CONNECTIONS_PER_CLIENT, OPENENV_MAX_LOCAL_CONNECTIONS for this machine) "
                "was reached, last by %s",
                self.refused - self._logged_count,
                self.cap(address),
                address,
            )
            self._logged_at, self._logged_count = now, self.refused

    def cap(self, address: str) -> int:
        """The cap on ``address``'s open connections (0: none)."""
        return self.max_local if address == LOCAL else self.max_per_client

    def admit(self, address: str) -> bool:
        count = self.open.get(address, 0)
        cap = self.cap(address)
        if cap and count >= cap:
            self.refused += 1
            return False
        self.open[address] = count + 1
        return True

    def leave(self, address: str) -> None:
        count = self.open.get(address, 0) - 1
        if count > 0:
            self.open[address] = count
        else:
            self.open.pop(address, None)


class GuardedConnection(asyncio.Protocol):
    """Stands in front of uvicorn's protocol for one connection (see the module docstring)."""

    def __init__(self, inner: asyncio.Protocol, table: ConnectionTable, loop: asyncio.AbstractEventLoop) -> None:
        self.inner: Any = inner
        self.table = table
        self.loop = loop
        self.transport: Any = None
        self.address: Optional[str] = None
        self.requests = 0  # requests under way (reaching the app)
        self._timer: Optional[asyncio.TimerHandle] = None
        self._upgradable = True  # still the HTTP protocol: watch for the swap to WebSocket

    # --- what the app side tells (GuardedApp) --------------------------------------------------

    def begin(self) -> None:
        self.requests += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def end(self) -> None:
        self.requests -= 1
        if self.requests == 0:
            self._arm()

    def _arm(self) -> None:
        timeout = self.table.header_timeout_s
        if timeout and self._timer is None and self.transport is not None and not self.transport.is_closing():
            self._timer = self.loop.call_later(timeout, self._expire)

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
            self.inner = None
            self.table.log_refusal(address)
            transport.write(_refusal(address, self.table.cap(address)))
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
        inner = self.inner
        if inner is None:
            return
        token = _CURRENT.set(self)
        try:
            inner.data_received(data)
        finally:
            _CURRENT.reset(token)
        if self._upgradable:
            current = self.transport.get_protocol()
            if current is not self:  # upgraded to WebSocket: stay in front of the new protocol
                self._upgradable = False
                self.inner = current
                self.transport.set_protocol(self)

    def eof_received(self) -> Optional[bool]:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.address is not None:
            self.table.leave(self.address)
            self.address = None
        if self.inner is not None:
            self.inner.connection_lost(exc)


def guard_http(protocol_class: Callable[..., asyncio.Protocol], table: ConnectionTable) -> Callable[..., Any]:
    """What to pass as uvicorn's ``http``: builds ``protocol_class`` for each connection, guarded."""

    def create(**kwargs: Any) -> GuardedConnection:
        loop = kwargs.get("_loop") or asyncio.get_running_loop()
        return GuardedConnection(protocol_class(**kwargs), table, loop)

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
            await self.app(scope, receive, send)
            return
        guard.begin()
        try:
            await self.app(scope, receive, send)
        finally:
            guard.end()
