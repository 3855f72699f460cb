"""uvicorn's sans-I/O WebSocket protocol with a small read-ahead window.

uvicorn stops reading a connection's socket after every message it queues for the app and starts
again once the app has taken it. For a request/response client (send a step, wait for its
observation) that is two changes of the socket's interest in the event loop per message, each a
system call, although nothing is ever waiting in the queue. This protocol lets a few small messages
wait before it stops reading (``READ_AHEAD_MESSAGES``); a large message (``READ_AHEAD_MAX_BYTES``
or more) stops reading at once, as uvicorn does. Either way the messages of the
read that was already under way are still queued (uvicorn does the same), so what waits unread by
the app is at most the window plus one read, and TCP backpressure applies beyond it.

It also lends its connection to a worker thread that serves a client stepping back to back, and
takes it back (see :mod:`openenv.core.env_server.ws_hot`): everything uvicorn writes on its own
(keepalive pings, shutdown) recalls the connection first.

The runners in :mod:`openenv.core.env_server.runner` use it unless told otherwise
(``ws="websockets-sansio"`` restores uvicorn's behaviour), on uvicorn releases whose sans-I/O
protocol works as described (:func:`compatible`); others keep their own default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

from .ws_frames import between_frames, client_text, text_frame

if TYPE_CHECKING:  # pragma: no cover
    from .ws_hot import HandBack, Lending

READ_AHEAD_MESSAGES = 4
"""Messages that may wait for the app before the socket is no longer read."""

READ_AHEAD_MAX_BYTES = 64 * 1024
"""A message at least this large stops reading as soon as it is queued."""


def _names(function: object) -> frozenset:
    code = getattr(function, "__code__", None)
    return frozenset(code.co_names) if code is not None else frozenset()


def compatible() -> bool:
    """Whether this uvicorn's protocol keeps the state the subclass below relies on: it queues a
    message and pauses reading in ``send_receive_event_to_app`` (unless ``read_paused``, and not
    past ``close_sent``), and ``receive`` resumes reading once the queue is empty."""
    queueing = _names(getattr(WebSocketsSansIOProtocol, "send_receive_event_to_app", None))
    receiving = _names(getattr(WebSocketsSansIOProtocol, "receive", None))
    return {"frames", "read_paused", "close_sent", "pause_reading"} <= queueing and {
        "read_paused",
        "resume_reading",
    } <= receiving


class OpenEnvWebSocketProtocol(WebSocketsSansIOProtocol):
    """:class:`WebSocketsSansIOProtocol` that pauses reading only when messages pile up, and
    lends its connection to a worker (see :mod:`.ws_hot`)."""

    lent: Optional[Lending] = None
    """The lending of this connection to a worker, while there is one."""

    _plain: Optional[bool] = None  # no WebSocket extension, a websockets we know: set once accepted

    # --- the common case without websockets' frame machinery ----------------------------------

    def _is_plain(self) -> bool:
        """Whether messages may skip websockets' own framing: the handshake is done and no
        extension (compression) is in use."""
        plain = self._plain
        if plain is None:
            if not self.handshake_complete or self.initial_response is not None:
                return False
            conn = self.conn
            plain = self._plain = (
                not conn.extensions
                and hasattr(conn.reader, "buffer")
                and hasattr(conn, "current_size")
                and hasattr(conn, "expect_continuation_frame")
                and hasattr(conn, "max_message_size")
                and hasattr(conn.parser, "gi_yieldfrom")
            )
        return plain

    def data_received(self, data: bytes) -> None:
        # A read holding exactly one small, whole text frame (a request/response client's every
        # message) is queued as it is; anything else goes through websockets' parser.
        conn = self.conn
        if (
            self.lent is None
            and not self.close_sent
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
        super().data_received(data)

    def send_text_now(self, text: str) -> bool:
        """Write ``text`` as a text message now, as the ASGI ``send`` would, and return True;
        False when something stands in the way (flow control, a close, an extension): the
        caller then awaits ``send`` as usual."""
        transport = self.transport
        if (
            self.lent is None
            and not self.close_sent
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

    # --- lending ----------------------------------------------------------------------------

    def lendable_fd(self) -> int:
        """The socket's file descriptor when this connection can ever be lent (plain TCP or a
        Unix socket, no WebSocket extension such as compression), else -1."""
        transport = self.transport
        if transport is None or self.scheme != "ws" or transport.get_extra_info("sslcontext"):
            return -1
        if not self._is_plain():  # an extension, or a websockets whose parser we cannot read
            return -1
        sock = transport.get_extra_info("socket")
        try:
            return sock.fileno() if sock is not None else -1
        except (AttributeError, OSError):
            return -1

    def can_lend(self) -> bool:
        """Whether the connection may be lent now: open, everything read has been handed to the
        app, no message half read, nothing waiting to be written."""
        conn, transport = self.conn, self.transport
        return (
            not self.read_paused
            and not self.close_sent
            and self.queue.empty()
            and conn.state is State.OPEN
            and between_frames(conn)
            and transport.get_write_buffer_size() == 0
            and not transport.is_closing()
        )

    def lend(self, link: Lending) -> None:
        """Stop reading the socket: ``link``'s worker reads and writes it now."""
        self.lent = link
        self.transport.pause_reading()

    def resume_after_lending(self) -> None:
        if not self.read_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def take_back(self, link: Lending, handback: Optional[HandBack]) -> None:
        """Serve the connection again after ``link`` ended: write the rest of an answer the
        worker left half written, parse what it read, read the socket again."""
        if self.lent is link:
            self.lent = None
        transport = self.transport
        unsent = link.take_unsent()
        if not transport.is_closing():
            if unsent:
                transport.write(unsent)
            if handback is not None and handback.raw:
                self.data_received(handback.raw)
        if not link.reading:
            link.reading = True
            self.resume_after_lending()

    def _recall(self) -> None:
        """Take the connection back before writing on it: the worker writes no more, and the rest
        of an answer it left half written goes out first."""
        link = self.lent
        if link is not None:
            link.recall()
            unsent = link.take_unsent()
            if unsent and not self.transport.is_closing():
                self.transport.write(unsent)

    def send_keepalive_ping(self) -> None:
        self._recall()
        super().send_keepalive_ping()

    def keepalive_timeout(self) -> None:
        self._recall()
        super().keepalive_timeout()

    def shutdown(self) -> None:
        self._recall()
        super().shutdown()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._recall()
        super().connection_lost(exc)

    # --- read-ahead --------------------------------------------------------------------------

    def send_receive_event_to_app(self) -> None:
        if self.read_paused or self.close_sent:
            # Already paused, or past the app's close: the message is then discarded and reading
            # must go on until the peer's close reply. The base class does right by both.
            super().send_receive_event_to_app()
            return
        size = sum(map(len, self.frames))
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
