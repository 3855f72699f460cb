"""Resumable sessions: the record that lets a client whose connection dropped carry on with the
same session, each of its calls applied once (an extension; see docs/resume.md).

Upstream peers never trigger it. The protocol, over ``/ws``:

* A client opts in on its WebSocket handshake with the request header ``X-OpenEnv-Resume: 1``. A
  server that resumes (``OPENENV_RESUME_GRACE_S`` not 0) answers the handshake with
  ``X-OpenEnv-Resume-Session`` (the new session's id) and ``X-OpenEnv-Resume-Token`` (a secret
  that only this client learns). An upstream server answers neither, and the client then behaves as OpenEnv
  0.10's does: no sequence numbers, no resume.
* Once a server has answered so, each frame of the client carries ``"seq"``, one more for each
  call (upstream's message models forbid extra keys: it is never sent to a server that did not
  answer the headers).
* To resume, the client opens a new ``/ws`` with ``X-OpenEnv-Resume-Session`` and
  ``X-OpenEnv-Resume-Token`` (headers, never the URL, which proxies log). A session that is gone is
  refused with 404 (the answer says why: closed, reaped, never on this server after a restart), a
  token that is not the session's with 403, and neither changes the session. An admitted resume
  takes the session over from a connection the server still thinks alive (a half-open one).
* ``X-OpenEnv-Session`` is the deprecated name of ``X-OpenEnv-Resume-Session``
  (:data:`LEGACY_SESSION_HEADER`): the server still answers it beside the new one and takes it
  in a resume, so that clients made before the rename resume too; OpenEnv's client resumes by
  the new name, or by the old one where a server from before the rename answered only that. The
  web playground's ``X-OpenEnv-Session`` (:mod:`.web`) is another header of that name: the
  visitor's session.

:class:`Resume` is everything the server keeps for it: the token, the connection serving the
session, and the number and answer of the session's last call. A call re-sent with that number is
answered from the record (once it has finished, if it still runs); a higher number runs. HTTP calls
on a named ``session_id`` take the same number in the ``X-OpenEnv-Seq`` header, and an
``openenv/session/create`` over HTTP with an ``X-OpenEnv-Create-Key`` (a client's random key) that
is sent again answers the session the first one created.

**How long a session waits.** A session whose connection dropped waits for its resume while its
*grace clock* (``OPENENV_RESUME_GRACE_S``) runs: the time it has spent without a connection since its
last call. A resume that makes no call and drops again does not restart that clock, so a client
cannot hold a slot by resuming only to drop again. Its total time without a connection, however
often it is resumed, is bounded too (``OPENENV_RESUME_MAX_SUSPENDED_S``, by default three grace
periods). :class:`Resume` keeps both clocks; the session manager's reaper reads
:meth:`Resume.expired`.

**Only the token gives a socket's session.** A session made by a WebSocket is reached through that
connection, or through a resume with its token: a call naming it by id on any other transport is
answered as for an id the server never made (see ``SessionManager.get``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import secrets
import time
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple

from .exceptions import InvalidSequenceError, StaleCallError

RESUME_HEADER = "x-openenv-resume"
RESUME_SESSION_HEADER = "x-openenv-resume-session"
"""The session a resumable ``/ws`` connection serves: the server names it in the handshake's
answer, the client sends it back (with the token) to resume it."""
LEGACY_SESSION_HEADER = "x-openenv-session"
"""Deprecated: :data:`RESUME_SESSION_HEADER`'s name before the rename, answered and taken still
(see the module docstring)."""
TOKEN_HEADER = "x-openenv-resume-token"
SEQ_HEADER = "x-openenv-seq"
CREATE_KEY_HEADER = "x-openenv-create-key"
SEQ_KEY = "seq"
"""The key of a ``/ws`` frame that carries its call's number."""

STOPPING_CLOSE_CODE = 1001
STOPPING_REASON = "the server is stopping"
"""The close code ("going away") and reason of a WebSocket the server closes because it stops on
purpose (its ASGI server shutting down, Ctrl-C on ``openenv serve``, the app's lifespan ending).
Its sessions end with it, so there is nothing to resume: a client told so fails at once. A
connection that drops without a close (a network fault) is still resumed."""

SERVER_CLOSE_CODES = frozenset({STOPPING_CLOSE_CODE, 1012})
"""Close codes that say the server's sessions are gone: the one above, and 1012 ("service
restart"), which uvicorn sends to the connections of a server it shuts down when the protocol of
:mod:`._compat.uvicorn` is not in use."""


@dataclasses.dataclass(eq=False, slots=True)
class Resume:
    """A session's resume token and its last call (fields are touched on the event loop only)."""

    session_id: str  # SessionManager.new_id(): it carries the server's prefix
    token: str = dataclasses.field(default_factory=lambda: secrets.token_urlsafe(32))
    owner: Any = None  # the connection serving the session (None: in its grace period)
    seq: int = 0
    answer: Optional[asyncio.Future] = None  # the answer to call ``seq``
    create_key: Optional[str] = None  # the X-OpenEnv-Create-Key of the HTTP create that made it
    # The clocks of its time without a connection (time.monotonic() seconds; see the module docstring).
    suspended_at: Optional[float] = None  # when its connection dropped (None: a connection serves it)
    suspended_s: float = 0.0  # time without a connection before suspended_at, over the session's life
    quiet_from: Optional[float] = None  # where the grace clock's current stretch began (a drop, or a call's end)
    quiet_s: float = 0.0  # the grace clock: time without a connection since the last call, before quiet_from

    def admits(self, token: str) -> bool:
        return hmac.compare_digest(self.token.encode(), token.encode())

    async def once(self, seq: Any, run: Callable[[], Awaitable[Any]]) -> Any:
        """The answer to call number ``seq``: ``run()``'s when it is new, the recorded one when
        it was run already (waiting for it if it still runs)."""
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise InvalidSequenceError(seq)
        if seq == self.seq and self.answer is not None:
            return await asyncio.shield(self.answer)
        if seq < self.seq:
            raise StaleCallError(seq, self.seq)
        self.seq = seq
        answer = self.answer = asyncio.get_running_loop().create_future()
        try:
            result = await run()
        except BaseException as exc:  # (cancelled: the server is shutting down)
            answer.set_exception(exc if isinstance(exc, Exception) else RuntimeError("the call was interrupted"))
            answer.exception()  # retrieved: no "never retrieved" warning when nobody re-sends it
            raise
        answer.set_result(result)
        return result

    def suspend(self) -> None:
        """Its connection dropped: both clocks run until :meth:`take`."""
        self.owner = None
        self.suspended_at = self.quiet_from = time.monotonic()

    def take(self, owner: Any) -> Any:
        """Hand the session to the connection ``owner`` (a resume); returns the connection that
        served it until now (None: none). The clocks stop; the grace clock is not set back (only a
        call does that)."""
        now = time.monotonic()
        if self.suspended_at is not None and self.quiet_from is not None:
            self.suspended_s += now - self.suspended_at
            self.quiet_s += now - self.quiet_from
        self.suspended_at = self.quiet_from = None
        previous, self.owner = self.owner, owner
        return previous

    def called(self) -> None:
        """A call ran on the session: its grace clock starts again (from now, if the call ended
        while its connection was away)."""
        self.quiet_s = 0.0
        if self.suspended_at is not None:
            self.quiet_from = time.monotonic()

    def expired(self, grace_s: float, cap_s: Optional[float]) -> Optional[str]:
        """Why a session waiting for its resume must be closed now, or None: its grace clock has
        passed ``grace_s``, or its time without a connection ``cap_s`` (None: no cap)."""
        if self.suspended_at is None or self.quiet_from is None:
            return None
        now = time.monotonic()
        if self.quiet_s + (now - self.quiet_from) > grace_s:
            return GRACE_SPENT.format(grace_s)
        if cap_s is not None and self.suspended_s + (now - self.suspended_at) > cap_s:
            return CAP_SPENT.format(cap_s)
        return None


GRACE_SPENT = (
    "no client resumed it within {:g} s of its connection dropping (OPENENV_RESUME_GRACE_S; a resume "
    "that makes no call does not restart this clock)"
)
CAP_SPENT = (
    "it spent {:g} s in all without a connection, the most one session may however often it is resumed "
    "(OPENENV_RESUME_MAX_SUSPENDED_S); start a new episode, or raise that limit where links drop this often"
)


def handshake_asks(headers: Any) -> Tuple[bool, Optional[Tuple[str, str]]]:
    """What a handshake's ASGI ``headers`` ask: ``(opt_in, (session_id, token) or None)``."""
    wanted: Dict[bytes, str] = {}
    for name, value in headers:
        name = name.lower()  # (not every server lowers them, as ASGI asks)
        if name in _NAMES:
            wanted[name] = value.decode("latin-1")
    session_id = wanted.get(RESUME_SESSION_HEADER.encode()) or wanted.get(LEGACY_SESSION_HEADER.encode())
    token = wanted.get(TOKEN_HEADER.encode())
    target = (session_id, token) if session_id and token else None
    return wanted.get(RESUME_HEADER.encode()) == "1" or target is not None, target


def handshake_grant(record: Resume) -> list:
    """The handshake answer's headers that make a connection resumable (the session's id under
    its deprecated name too)."""
    session_id = record.session_id.encode()
    return [
        (RESUME_SESSION_HEADER.encode(), session_id),
        (TOKEN_HEADER.encode(), record.token.encode()),
        (LEGACY_SESSION_HEADER.encode(), session_id),
    ]


_NAMES = frozenset(
    name.encode() for name in (RESUME_HEADER, RESUME_SESSION_HEADER, LEGACY_SESSION_HEADER, TOKEN_HEADER)
)
