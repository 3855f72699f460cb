"""uvicorn's sans-I/O WebSocket protocol with a small read-ahead window.

uvicorn stops reading a connection's socket after every message it queues for the app and starts
again once the app has taken it. For a request/response client (send a step, wait for its
observation) that is two changes of the socket's interest in the event loop per message, each a
system call, although nothing is ever waiting in the queue. This protocol lets a few small messages
wait before it stops reading (``READ_AHEAD_MESSAGES``); a large message (``READ_AHEAD_MAX_BYTES``
or more) stops reading at once, as uvicorn does. Either way the messages of the
read that was already under way are still queued (uvicorn does the same), so what waits unread by
the app is at most the window plus one read, and TCP backpressure applies beyond it.

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
(``ws="websockets-sansio"`` restores uvicorn's behaviour), on uvicorn releases whose sans-I/O
protocol works as described (:func:`compatible`); others keep their own default.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

from ._compat import uvicorn as uvicorn_compat
from ._compat.websockets import between_frames, parser_readable
from .limits import BUDGET_EXEMPT_BYTES, InFlightBudget, ServerLimits
from .ws_frames import client_text, frame_header, text_frame

READ_AHEAD_MESSAGES = 4
"""Messages that may wait for the app before the socket is no longer read."""

READ_AHEAD_MAX_BYTES = 64 * 1024
"""A message at least this large stops reading as soon as it is queued."""

logger = logging.getLogger("openenv.server")

_DATA_OPCODES = (0, 1, 2)  # continuation, text, binary


def _error_frame(code: str, message: str, **extra: Any) -> bytes:
    data = {"message": message, "code": code}
    data.update(extra)
    return text_frame(json.dumps({"type": "error", "data": data}))


def compatible() -> bool:
    """Whether this uvicorn is a release CI tests the subclass below against (it relies on
    ``send_receive_event_to_app`` queueing a message and pausing reading, and ``receive``
    resuming it: see :func:`._compat.uvicorn.sansio_protocol_tested`)."""
    return uvicorn_compat.sansio_protocol_tested()


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
                    message = (
                        f"Message of {length} bytes exceeds the server's limit of {limit} (OPENENV_MAX_MESSAGE_MB)"
                    )
                    self.transport.write(_error_frame("MESSAGE_TOO_LARGE", message, limit=limit))
                    if fin and opcode != 0 and not self._in_message and not self.conn.extensions:
                        self._skip = length  # dropped as it arrives: the connection goes on
                        continue
                    # Refused by websockets (1009) from its header on: pass it, and stop following.
                    self._screening = False
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
        self.transport.write(_error_frame("SERVER_BUSY", budget.refusal()))
        self._fail(1013, "server busy: bytes in flight at their limit")

    def _fail(self, code: int, reason: str) -> None:
        """Close the connection with ``code`` at once (the app sees it disconnect)."""
        self._screening = False
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
            message = f"Message exceeds the server's limit of {self.frame_limit} bytes (OPENENV_MAX_MESSAGE_MB)"
            self.transport.write(_error_frame("MESSAGE_TOO_LARGE", message, limit=self.frame_limit))
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
            conn = self.conn
            plain = self._plain = not conn.extensions and parser_readable(conn)
        return plain

    def data_received(self, data: bytes) -> None:
        # A read holding exactly one small, whole text frame (a request/response client's every
        # message) is queued as it is; anything else goes through websockets' parser.
        conn = self.conn
        if (
            not self.close_sent
            and not self._head
            and not self._left
            and not self._skip
            and self._is_plain()
            and conn.state is State.OPEN
            and between_frames(conn)
        ):
            text = client_text(data, READ_AHEAD_MAX_BYTES, conn.max_message_size)
            if text is not None:
                self.queue.put_nowait({"type": "websocket.receive", "text": text})
                if self.queue.qsize() >= READ_AHEAD_MESSAGES:
                    self.read_paused = True
                    self.transport.pause_reading()
                return
        if self._screening is None and self.handshake_initiated:
            # the handshake request came in an earlier read: the client's frames start here
            self._screening = self.frame_limit is not None or self.budget is not None
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
            and not self.conn.expect_continuation_frame
            and not transport.is_closing()
        ):
            transport.write(text_frame(text))
            return True
        return False

    # --- read-ahead --------------------------------------------------------------------------

    def send_receive_event_to_app(self) -> None:
        if self.read_paused or self.close_sent:
            # Already paused, or past the app's close: the message is then discarded and reading
            # must go on until the peer's close reply. The base class does right by both.
            super().send_receive_event_to_app()
            return
        size = sum(map(len, self.frames))
        budget = self.budget
        if budget is not None and size >= BUDGET_EXEMPT_BYTES and self.conn.extensions:
            # an inflated message: its size on the wire said little about this one
            if not budget.reserve(size):
                self.frames = []
                self._refuse_busy(budget)
                return
            self._held += size
        # The base class pauses reading after queueing unless it believes it already has:
        # tell it so, and decide here instead.
        self.read_paused = True
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = False
        if size >= READ_AHEAD_MAX_BYTES or self.queue.qsize() >= READ_AHEAD_MESSAGES:
            self.read_paused = True
            self.transport.pause_reading()


def end_refused_handshake(send: object) -> None:
    """A handshake answered with an HTTP response (a refused token's 401) has ended, but uvicorn's
    sans-I/O protocol (ours, and uvicorn's own under ``ws=auto``) does not count it so and logs
    "ASGI callable returned without completing handshake" at ERROR for every refusal: tell it."""
    protocol = getattr(send, "__self__", None)
    if isinstance(protocol, WebSocketsSansIOProtocol):
        protocol.handshake_complete = True
