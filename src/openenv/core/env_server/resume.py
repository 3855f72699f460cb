"""Resumable sessions: the record that lets a client whose connection dropped carry on with the
same session, each of its calls applied once (an extension; see docs/resume.md).

Upstream peers never trigger it. The protocol, over ``/ws``:

* A client opts in on its WebSocket handshake with the request header ``X-OpenEnv-Resume: 1``. A
  server that resumes (``OPENENV_RESUME_GRACE_S`` not 0) answers the handshake with
  ``X-OpenEnv-Session`` (the new session's id) and ``X-OpenEnv-Resume-Token`` (a secret that only
  this client learns). An upstream server answers neither, and the client then behaves as OpenEnv
  0.10's does: no sequence numbers, no resume.
* Once a server has answered so, each frame of the client carries ``"seq"``, one more for each
  call (upstream's message models forbid extra keys: it is never sent to a server that did not
  answer the headers).
* To resume, the client opens a new ``/ws`` with ``X-OpenEnv-Session`` and
  ``X-OpenEnv-Resume-Token`` (headers, never the URL, which proxies log). A session that is gone is
  refused with 404 (the answer says why: closed, reaped, never on this server after a restart), a
  token that is not the session's with 403, and neither changes the session. An admitted resume
  takes the session over from a connection the server still thinks alive (a half-open one).

:class:`Resume` is everything the server keeps for it: the token, the connection serving the
session, and the number and answer of the session's last call. A call re-sent with that number is
answered from the record (once it has finished, if it still runs); a higher number runs. HTTP calls
on a named ``session_id`` take the same number in the ``X-OpenEnv-Seq`` header, and an
``openenv/session/create`` over HTTP with an ``X-OpenEnv-Create-Key`` (a client's random key) that
is sent again answers the session the first one created.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import secrets
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple

from .exceptions import InvalidSequenceError, StaleCallError

RESUME_HEADER = "x-openenv-resume"
SESSION_HEADER = "x-openenv-session"
TOKEN_HEADER = "x-openenv-resume-token"
SEQ_HEADER = "x-openenv-seq"
CREATE_KEY_HEADER = "x-openenv-create-key"
SEQ_KEY = "seq"
"""The key of a ``/ws`` frame that carries its call's number."""


@dataclasses.dataclass(eq=False, slots=True)
class Resume:
    """A session's resume token and its last call (fields are touched on the event loop only)."""

    session_id: str  # SessionManager.new_id(): it carries the server's prefix
    token: str = dataclasses.field(default_factory=lambda: secrets.token_urlsafe(32))
    owner: Any = None  # the connection serving the session (None: in its grace period)
    seq: int = 0
    answer: Optional[asyncio.Future] = None  # the answer to call ``seq``
    create_key: Optional[str] = None  # the X-OpenEnv-Create-Key of the HTTP create that made it

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


def asked(headers: Any) -> Tuple[bool, Optional[Tuple[str, str]]]:
    """What a handshake's ASGI ``headers`` ask: ``(opt_in, (session_id, token) or None)``."""
    wanted: Dict[bytes, str] = {}
    for name, value in headers:
        name = name.lower()  # (not every server lowers them, as ASGI asks)
        if name in _NAMES:
            wanted[name] = value.decode("latin-1")
    session_id, token = wanted.get(b"x-openenv-session"), wanted.get(b"x-openenv-resume-token")
    target = (session_id, token) if session_id and token else None
    return wanted.get(b"x-openenv-resume") == "1" or target is not None, target


def granted(record: Resume) -> list:
    """The handshake answer's headers that make a connection resumable."""
    return [(SESSION_HEADER.encode(), record.session_id.encode()), (TOKEN_HEADER.encode(), record.token.encode())]


_NAMES = frozenset(name.encode() for name in (RESUME_HEADER, SESSION_HEADER, TOKEN_HEADER))
