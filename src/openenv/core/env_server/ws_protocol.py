"""uvicorn's sans-I/O WebSocket protocol with a small read-ahead window.

uvicorn stops reading a connection's socket after every message it queues for the app and starts
again once the app has taken it. For a request/response client (send a step, wait for its
observation) that is two changes of the socket's interest in the event loop per message, each a
system call, although nothing is ever waiting in the queue. This protocol lets a few small messages
wait before it stops reading (``READ_AHEAD_MESSAGES``); a large message (``READ_AHEAD_MAX_BYTES``
or more) stops reading at once, as uvicorn does. Either way the messages of the
read that was already under way are still queued (uvicorn does the same), so what waits unread by
the app is at most the window plus one read, and TCP backpressure applies beyond it.

The runners in :mod:`openenv.core.env_server.runner` use it unless told otherwise
(``ws="websockets-sansio"`` restores uvicorn's behaviour), on uvicorn releases whose sans-I/O
protocol works as described (:func:`compatible`); others keep their own default.
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

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
    """:class:`WebSocketsSansIOProtocol` that pauses reading only when messages pile up."""

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
