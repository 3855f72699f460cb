"""Hot connections: a worker that has just answered a step goes on serving its ``/ws`` socket.

A sync environment steps in the worker pool (DESIGN, principle 1), and a step handed from the
event loop to a worker and back costs two more thread wake-ups than the same step run on the
loop. On a small VM those wake-ups cost more than everything else a step does: with them the
server spent twice the CPU per step of a bare ``websockets`` server doing the same JSON round
trip.

A client that steps back to back does not need them. When a step frame arrives within
:data:`LINGER_S` of the previous answer on that socket, and the server has nothing else to do
(the loop's previous message was this connection's too, no other call is in the pool, the
session is idle with its environment in place), the loop *lends* the connection to the worker
with the step: it stops reading the socket, and the worker runs the step, writes the answer frame
to the socket itself, then waits up to :data:`LINGER_S` for the next frame and, if that is a
plain step frame, runs it at once. The event loop takes no part until the worker hands the
connection back, so each step costs one wake-up, as on the bare floor. With other clients busy
the loop is awake anyway, and a lending worker would only contend with it for the GIL: the
worker hands back as soon as another connection's message comes in.

The worker keeps only what is plainly a step: a read holding exactly one unfragmented, masked
text frame whose JSON is ``{"type": "step", "data": {...}}`` with an action that validates and
runs in a worker. Anything else (another message type, an invalid action, a ping, a close, two
frames in one read, half a frame, a large frame, the peer gone) goes back to the event loop
as the bytes that were read, and the loop handles it exactly as it would have. So do a step's
exception, an answer the worker could not write in full, and every lull longer than
:data:`LINGER_S`.

The loop *recalls* a lent connection when it must act on it itself: a step that has run for
``WATCH_AFTER_S`` (from then on the step timeout, counted from the step's start, and the
disconnect watch apply as to any step), a keepalive ping, a server shutdown. Another call waiting
for the session, or for a worker, asks the worker to hand the connection back after its current
step, at once if it is waiting for the next frame.

Thread safety: the worker touches the socket (a duplicate of its file descriptor) only while
holding the lending's lock and after checking that the lending has not ended; the loop ends the
lending under the same lock before it reads from, writes to or closes the socket itself, and then
writes the rest of an answer the worker left half written before any frame of its own. Bytes the
worker read are fed to the loop's WebSocket parser before the loop reads the socket again, and
the loop lends a connection only while that parser is between frames.

``$OPENENV_WS_LINGER_MS`` sets :data:`LINGER_S` for the servers a process creates; ``0`` turns
lending off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import threading
import time
from typing import Any, Optional, Tuple

from ..utils import number_from_env
from .serialization import WS_ENVELOPE_KEYS, deserialize_action, observation_message_json, parse_json
from .sessions import EnvTraits, steps_on_loop
from .workers import Waker, WorkerPool, deliverable
from .ws_frames import client_text, text_frame

LINGER_S = 0.002
"""How long a worker waits for a client's next step frame, and how soon after an answer a step
frame must arrive for its connection to be lent."""

logger = logging.getLogger("openenv.server")

READ_SIZE = 64 * 1024
"""The most a worker reads at once: a step frame must arrive whole in one read to stay with it."""

MAX_LINGER_MS = 60_000


def linger_from_env() -> float:
    """:data:`LINGER_S`, or ``$OPENENV_WS_LINGER_MS`` when set (``0``: never lend; at most
    :data:`MAX_LINGER_MS`)."""
    value = number_from_env("OPENENV_WS_LINGER_MS", "milliseconds")
    if value is None:
        return LINGER_S
    if not 0 <= value <= MAX_LINGER_MS:  # NaN and infinities included
        raise ValueError(f"OPENENV_WS_LINGER_MS must be between 0 and {MAX_LINGER_MS} milliseconds, got {value}")
    return value / 1000.0


def supported() -> bool:
    """Whether this platform lends connections (POSIX sockets and ``poll``)."""
    return os.name == "posix" and hasattr(select, "poll")


class HandBack:
    """What a worker hands back with a lent connection."""

    __slots__ = ("outcome", "raw", "sent_at")

    def __init__(self, sent_at: float, outcome: Optional[Tuple[bool, Any]] = None, raw: bytes = b"") -> None:
        self.sent_at = sent_at
        """``time.monotonic()`` when the worker last wrote an answer (0.0: it wrote none)."""
        self.outcome = outcome
        """The last step's ``(ok, observation or exception)`` when its answer is the loop's to send."""
        self.raw = raw
        """Bytes read from the socket that the loop's WebSocket parser must read first."""


class Lending:
    """One lending of a connection to a worker: its state is shared by the loop and the worker.

    The loop creates it with the first step's action and lends the connection (``protocol.lend``);
    the session runs :meth:`serve` in the pool (``SessionManager.call_lent``); the loop ends it
    with :meth:`recall` or takes the connection back when :meth:`serve` returns
    (``OpenEnvWebSocketProtocol.take_back``). An answer the socket took only in part leaves its
    rest in :meth:`take_unsent`, which the loop writes before anything else.
    """

    __slots__ = (
        "_fd",
        "_lock",
        "_owner",
        "_pool",
        "_unsent",
        "_watch",
        "action",
        "action_cls",
        "answered",
        "ended",
        "in_step",
        "linger_ms",
        "max_bytes",
        "max_chars",
        "protocol",
        "reading",
        "session",
        "step_started",
        "taken_back",
        "traits",
        "waker",
        "yield_asked",
    )

    def __init__(
        self,
        protocol: Any,
        fd: int,
        action: Any,
        action_cls: type,
        max_chars: int,
        linger_s: float,
        traits: EnvTraits,
        pool: WorkerPool,
        watch: Any,
        owner: Any,
    ) -> None:
        self.protocol = protocol
        self._fd = fd  # our own duplicate: closed by whoever ends the lending
        self._lock = threading.Lock()
        self._pool = pool
        self._watch = watch  # its ``last_active``: the connection whose message the loop handled last
        self._owner = owner  # the connection lent
        self._unsent = b""  # the rest of an answer the socket took only in part
        self.session: Any = None  # set by SessionManager.call_lent; the worker counts its steps there
        self.waker: Optional[Waker] = None  # the serving worker's, once it serves
        self.action = action
        self.answered = 0  # answers the worker wrote
        self.action_cls = action_cls
        self.max_chars = max_chars
        self.max_bytes: Optional[int] = getattr(getattr(protocol, "conn", None), "max_message_size", None)
        """uvicorn's own limit on a message's bytes (``ws_max_size``), which websockets' parser
        applies to every frame the loop reads."""
        self.linger_ms = max(1, round(linger_s * 1000))
        self.traits = traits
        self.ended = False
        self.in_step = True  # the first step is under way as soon as the call is in the pool
        self.step_started = 0.0
        """``time.monotonic()`` when the running step began (the first: when it went to the pool),
        0.0 between steps."""
        self.yield_asked = False
        self.reading = False  # the loop reads the socket again (recalled during a step)
        self.taken_back: asyncio.Future = asyncio.get_running_loop().create_future()
        """Resolved when the loop recalls the connection while a step runs."""

    # --- on the event loop -------------------------------------------------------------------

    def recall(self) -> bool:
        """End the lending now (idempotent). Returns whether a step was running: the loop then
        reads the socket again at once, and the step's answer is the loop's to send."""
        with self._lock:
            if self.ended:
                return False
            self.ended = True
            in_step = self.in_step
            fd, self._fd = self._fd, -1
        os.close(fd)  # the worker uses it only under the lock, after checking `ended`
        waker = self.waker
        if waker is not None:  # a worker waiting for the next frame: let it go at once
            waker.wake()
        if in_step:
            self.reading = True
            self.protocol.resume_after_lending()
            if not self.taken_back.done():
                self.taken_back.set_result(None)
        return in_step

    def take_unsent(self) -> bytes:
        """The rest of a half-written answer, once: the loop writes it before anything else."""
        with self._lock:
            unsent, self._unsent = self._unsent, b""
        return unsent

    def ask_to_yield(self) -> None:
        """Ask the worker to hand the connection back after its current step (at once if it
        waits for the next frame)."""
        self.yield_asked = True
        waker = self.waker
        if waker is not None:
            waker.wake()

    # --- on the worker -------------------------------------------------------------------------

    def serve(self, env: Any) -> HandBack:
        """Step ``env`` with the lent action, answer on the socket, and go on while the client
        keeps sending step frames within the linger time."""
        action, self.action = self.action, None
        lock = self._lock
        pool = self._pool
        waker = self.waker = pool.thread_waker()
        session = self.session
        sent_at = 0.0
        try:
            while True:
                try:
                    observation = env.step(action)
                except BaseException as exc:  # the loop answers it as for any step
                    self._step_over()
                    return HandBack(sent_at, outcome=(False, deliverable(exc)))
                try:
                    frame = text_frame(observation_message_json(observation))
                except Exception:  # the loop encodes it again and answers the failure as it does
                    self._step_over()
                    return HandBack(sent_at, outcome=(True, observation))
                waker.reset()  # wake-ups from here on are for this wait
                with lock:
                    self.in_step = False
                    self.step_started = 0.0
                    if self.ended:  # recalled during the step: the answer is the loop's to send
                        return HandBack(sent_at, outcome=(True, observation))
                    # Counted first: the client may look as soon as it has the answer. Not ended,
                    # so the loop still waits for this call and holds the session's lock.
                    self.answered += 1
                    if session is not None:
                        session.touch(True)
                    try:
                        written = os.write(self._fd, frame)
                    except OSError:  # full, or the peer is gone: the loop's transport finds out
                        written = 0
                    if written < len(frame):
                        self._unsent = frame[written:]  # under the lock: a recall sees it
                        if not written:  # the loop writes it all
                            self.answered -= 1
                if written:
                    sent_at = time.monotonic()
                if written < len(frame):
                    return HandBack(sent_at)
                try:
                    data = self._next_frame()
                except Exception:  # a fault of ours: the answer is out, so hand back and say so
                    logger.exception("a worker serving a lent connection failed; the loop serves it again")
                    return HandBack(sent_at)
                if not data:  # nothing came, or EOF (which stays readable: the loop's read meets it)
                    return HandBack(sent_at)
                action = self._step_action(data)
                if action is None:
                    return HandBack(sent_at, raw=data)
                with lock:
                    if self.ended:
                        return HandBack(sent_at, raw=data)
                    self.in_step = True
                    self.step_started = time.monotonic()
        finally:
            with lock:
                if not self.ended:
                    self.ended = True
                    os.close(self._fd)
                    self._fd = -1

    def _next_frame(self) -> bytes:
        """Wait up to the linger time for the client's next bytes and read them (b"": none, or
        the worker should give the connection back)."""
        if self.yield_asked or self._watch.last_active is not self._owner:  # others keep the loop awake
            return b""
        with self._lock:
            if self.ended:
                return b""
            fd = self._fd
        # The descriptor may be closed by a recall while this waits; the read below sees that.
        if not self._pool.linger(fd, self.linger_ms):
            return b""
        with self._lock:
            if self.ended:
                return b""
            try:
                return os.read(self._fd, READ_SIZE)
            except OSError:  # nothing after all, or an error the loop's own read meets too
                return b""

    def _step_over(self) -> None:
        with self._lock:
            self.in_step = False
            self.step_started = 0.0

    def _step_action(self, data: bytes) -> Any:
        """The action of ``data`` when it is plainly a step frame this worker may run, else None."""
        text = client_text(data, self.max_chars, self.max_bytes)
        if text is None:
            return None
        try:
            message = parse_json(text)
            if type(message) is not dict or message.keys() != WS_ENVELOPE_KEYS or message["type"] != "step":
                return None
            payload = message["data"]
            if type(payload) is not dict:
                return None
            action = deserialize_action(payload, self.action_cls)
        except Exception:  # invalid JSON or action: the loop reads it again and answers the error
            return None
        if steps_on_loop(self.traits, action):  # an MCP environment's MCP action
            return None
        return action
