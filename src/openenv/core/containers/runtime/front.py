"""One TCP address in front of several server processes of one environment, on Unix sockets.

Each server process (a *worker*) makes session ids that start with its own prefix
(``OPENENV_SESSION_ID_PREFIX``: ``w3-<uuid>``), so the id says where a session lives. :class:`Front`
reads each request's head (parsed with ``h11``) and sends the request on to:

* the worker whose prefix the request's session id carries, when it names one: ``?session_id=``
  (``/ws`` attaches, ``/state``), an ``Mcp-Session-Id``, ``X-OpenEnv-Resume-Session`` (a ``/ws``
  resume) or ``X-OpenEnv-Session`` (the web page's; a resume's, under its deprecated name) header,
  or ``session_id`` (top level or in ``params``) in the JSON body of an HTTP call. An id no worker
  owns is answered 404;
* for an HTTP ``openenv/session/create`` carrying ``X-OpenEnv-Create-Key`` sent again (resumable
  clients send one, and send it again when the answer was lost), the worker the first one went to;
* the least-loaded worker otherwise (new ``/ws`` and ``/mcp`` sockets, ``openenv/session/create``,
  stateless calls): the one with the fewest sessions, as the front counts its open sockets and the
  workers report (``GET /openenv/capacity``).

A WebSocket, once its handshake is sent on, is relayed both ways until either side closes. Plain
HTTP requests are routed one by one (a kept-alive connection may name sessions of several
workers); the front answers ``GET /health`` itself, for the whole: every worker's status, the
sessions they hold and their capacity summed. It answers the observer's metrics for the whole too
(``GET /openenv/metrics``, and MCP's ``openenv/metrics`` over ``POST /mcp``): it asks every running
worker with the caller's credential, which each worker checks, and sums their counts and lists
their sessions together (a refusal is the answer; a worker that does not answer within
:data:`METRICS_WAIT_S` is named in ``unreported_workers``). HTTP/1.0 requests are relayed and
answered as HTTP/1.1 ones are.

**What a worker receives** is the request as the front parsed it: the head written again from its
parsed fields and the body in the framing ``h11`` read, so that the worker reads what the front
routed by. Every worker sees every client as one peer on its Unix socket, so the front says who
the client is: it adds ``X-Forwarded-For: <the client's address>`` to every request and handshake.
A remote client's own ``X-Forwarded-For``, ``Forwarded`` and ``X-Real-IP`` are dropped first (only
the front may say who a remote client is); those of a client on this machine (a reverse proxy,
speaking for its own clients) are kept. A worker's choice of error details (``auto``:
:mod:`~openenv.core.env_server.error_details`) thus tells remote clients from local ones.

**Bounds.** Bad requests get a JSON error and the connection is closed:

* a request head larger than :data:`MAX_HEAD_BYTES` 431; a malformed one 400; a head must arrive
  within ``OPENENV_HEADER_TIMEOUT_S`` (10 s) of the connection's going quiet (408; a connection
  that sent nothing is closed without a word);
* a body larger than ``OPENENV_MAX_MESSAGE_MB`` (32 MiB) 413; each piece of a body within the header
  timeout, and the whole request, head and body, within ``OPENENV_REQUEST_TIMEOUT_S`` (60 s) of its
  first byte: 408, and the worker, which never got the whole request, runs nothing;
* memory: the front reads a body ahead only when it is at most :data:`_PARSED_BODY_BYTES` (1 MiB:
  a call naming its session in its body is small); those reads draw on one budget for all the
  front's connections (``OPENENV_MAX_INFLIGHT_MB``, by default 4 x the message limit: 128 MiB; 503
  ``SERVER_BUSY`` past it). A larger body streams through as it comes (to the worker its URL or
  headers name, else the least-loaded), each connection holding about 1 MiB of it at most (its
  socket reader stops reading past 512 KiB) whatever its size;
* create keys: at most :data:`CREATE_KEY_MAX_CHARS` characters (400 beyond), remembered as a 16-byte
  digest, only for a create its worker answered with success, the :data:`CREATE_KEYS_KEPT` latest;
* connections: per client and in all, as :class:`~.forward.TCPRelay` says (the descriptors'
  soft limit raised to the hard one; two per connection: each client connection holds at most one
  connection to a worker at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import parse_qs, urlsplit

import h11

from ...env_server.edges import auth
from ...env_server.limits import BUDGET_EXEMPT_BYTES, InFlightBudget
from ...env_server.roles import AGENT_PREFIX
from ...env_server.serving.access_log import POLL_TARGET
from ...env_server.settings import ServerLimits
from ...utils import is_loopback_ip, within
from .forward import _CHUNK, TCPRelay, _strip_unix, linger, splice

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""The largest request head accepted (uvicorn's own bound is about the same)."""
CAPACITY_PATH = "/openenv/capacity"
METRICS_PATH = "/openenv/metrics"
METRICS_WAIT_S = 5.0
"""How long the front waits for each worker's metrics."""
METRICS_REPLY_MAX_BYTES = 16 << 20
"""The largest metrics answer taken from a worker (a worker runs untrusted code)."""
_ASKED_ON = (b"authorization", b"mcp-protocol-version")
"""The caller's headers the front sends on when it asks every worker for their metrics."""
_CREATING = frozenset({"openenv/session/create", "initialize"})  # JSON-RPC calls that make a session
CREATE_KEYS_KEPT = 65536
"""Create keys the front remembers (key digest → worker), the oldest forgotten first: about 6 MiB."""
CREATE_KEY_MAX_CHARS = 128
"""The longest ``X-OpenEnv-Create-Key`` taken (OpenEnv's clients send 32 random characters)."""
_PARSED_BODY_BYTES = 1 << 20
"""Bodies the front reads for a session id or a JSON-RPC method: larger ones are relayed unread
(a call naming a session is small; parsing a big body on the front's one loop would stall every
worker's traffic)."""
FORWARDING_HEADERS = frozenset({b"x-forwarded-for", b"forwarded", b"x-real-ip"})
"""Headers that say whom a proxy forwards for: dropped from a remote client's request."""


@dataclass
class Worker:
    """One server process behind the front, as the front sees it."""

    prefix: str
    socket_path: str = ""
    up: bool = False
    max_sessions: Optional[int] = None
    """As it last reported (None: not yet)."""
    reported: int = 0
    """Sessions it held at its last report."""
    sockets: int = 0
    """Sessions of WebSockets relayed to it now (the front sees each open and end)."""
    placed: int = 0
    """Sessions created over HTTP placed on it since its last report."""
    restarts: int = 0

    @property
    def load(self) -> int:
        return max(self.sockets, self.reported) + self.placed

    def status(self) -> Dict[str, Any]:
        return {
            "prefix": self.prefix,
            "status": "healthy" if self.up else "unhealthy",
            "active_sessions": max(self.sockets, self.reported),
            "max_sessions": self.max_sessions,
            "restarts": self.restarts,
        }


class BadRequest(Exception):
    """A request the front answers itself, with ``status`` and a JSON ``detail``."""

    def __init__(self, status: int, detail: str, code: str = "BAD_REQUEST") -> None:
        super().__init__(detail)
        self.status, self.detail, self.code = status, detail, code


@dataclass
class _Request:
    head: h11.Request
    body: bytes = b""
    """What the front has read of the body: all of it once ``ended`` is set."""
    ended: Optional[h11.EndOfMessage] = None
    reserved: int = 0
    """Bytes of the front's budget held for ``body``."""
    create_key: Optional[bytes] = None
    """The digest of the ``X-OpenEnv-Create-Key`` of an HTTP create, remembered once it succeeds."""
    headers: List[Tuple[bytes, bytes]] = field(init=False)
    """The head's headers, names in lower case (h11's own sequence is slow to walk)."""
    path: str = field(init=False)
    query: Dict[str, Any] = field(init=False)
    chunked: bool = field(init=False)

    def __post_init__(self) -> None:
        self.headers = list(self.head.headers)
        parts = urlsplit(self.head.target.decode("latin-1"))
        self.path, self.query = parts.path, parse_qs(parts.query)
        self.chunked = any(name == b"transfer-encoding" for name, _ in self.headers)

    @functools.cached_property
    def message(self) -> Any:
        """The body read whole, parsed; None when it is empty, not read whole, or not JSON."""
        if self.ended is None or not self.body or len(self.body) > _PARSED_BODY_BYTES:
            return None
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            return None

    def header(self, name: bytes) -> Optional[str]:
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None

    @property
    def content_length(self) -> Optional[int]:
        """The declared length of the body (None: chunked)."""
        if self.chunked:
            return None
        return int(self.header(b"content-length") or 0)  # h11 checked it is a number

    def framed(self, data: bytes) -> bytes:
        """A piece of the body, as the worker is to receive it."""
        return b"%x\r\n%s\r\n" % (len(data), data) if self.chunked and data else data

    def framed_end(self, end: h11.EndOfMessage) -> bytes:
        if not self.chunked:
            return b""
        return b"0\r\n" + b"".join(name + b": " + value + b"\r\n" for name, value in end.headers.raw_items()) + b"\r\n"


class _Incoming:
    """The requests of one client connection, one at a time, as ``h11`` parses them (what arrives
    after a request's end is kept for the next), within the limits of the module docstring."""

    def __init__(self, reader: asyncio.StreamReader, limits: ServerLimits) -> None:
        self.reader = reader
        self.limits = limits
        self.leftover = b""
        self.parser = h11.Connection(h11.SERVER)
        self.deadline = math.inf  # the current request's, from its first byte
        self.received = 0  # bytes of the current request's body

    async def head(self) -> Optional[h11.Request]:
        """The next request's head; None when the client closed, or stayed quiet past the header
        timeout, between requests."""
        self.parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.received = 0
        self.deadline = math.inf  # (set at this request's first byte)
        header_timeout = self.limits.header_timeout_s
        quiet_until = time.monotonic() + header_timeout if header_timeout else math.inf
        data, self.leftover = self.leftover, b""
        began = False
        while True:
            if data:
                if not began:
                    began = True
                    timeout = self.limits.request_timeout_s
                    self.deadline = time.monotonic() + timeout if timeout else math.inf
                self.parser.receive_data(data)
            event = self._next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await self._read(min(quiet_until, self.deadline))
                except _Late:
                    if not began:
                        return None
                    raise self._late() from None
                if not data:
                    if not began:
                        return None
                    self.parser.receive_data(b"")  # the client closed halfway, as h11 says next
                continue
            if isinstance(event, h11.Request):
                # h11 bounds a head that comes in pieces; one that came whole is measured here
                if len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers) > MAX_HEAD_BYTES:
                    raise BadRequest(431, f"the request head is larger than {MAX_HEAD_BYTES} bytes", "HEAD_TOO_LARGE")
                declared = dict(event.headers).get(b"content-length", b"0")
                if int(declared) > self.limits.max_message_bytes:
                    raise self._too_large()
                return event
            return None  # h11.ConnectionClosed

    async def body(self) -> Union[bytes, h11.EndOfMessage]:
        """The next piece of the current request's body, or its end."""
        while True:
            event = self._next_event()
            if event is h11.NEED_DATA:
                header_timeout = self.limits.header_timeout_s
                until = min(time.monotonic() + header_timeout if header_timeout else math.inf, self.deadline)
                try:
                    data = await self._read(until)
                except _Late:
                    raise self._late() from None
                self.parser.receive_data(data)  # b"": the client closed halfway, as h11 says next
            elif isinstance(event, h11.Data):
                self.received += len(event.data)
                if self.received > self.limits.max_message_bytes:  # chunked: counted as it comes
                    raise self._too_large()
                return bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.leftover = self.parser.trailing_data[0]
                return event
            else:
                raise BadRequest(400, "the client ended the request halfway")

    async def _read(self, until: float) -> bytes:
        wait = until - time.monotonic()
        if wait <= 0:
            raise _Late
        try:
            return await within(self.reader.read(_CHUNK), None if wait == math.inf else wait)
        except (TimeoutError, asyncio.TimeoutError):
            raise _Late from None

    def _next_event(self) -> Any:
        try:
            return self.parser.next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:
                raise BadRequest(
                    431, f"the request head is larger than {MAX_HEAD_BYTES} bytes", "HEAD_TOO_LARGE"
                ) from None
            raise BadRequest(400, f"malformed HTTP request ({exc}); send HTTP/1.1") from None

    def _late(self) -> BadRequest:
        limits = self.limits
        return BadRequest(
            408,
            f"the request did not arrive in time: its head within {limits.header_timeout_s:g} s "
            f"(OPENENV_HEADER_TIMEOUT_S), each piece of its body within that too, all of it within "
            f"{limits.request_timeout_s:g} s of its first byte (OPENENV_REQUEST_TIMEOUT_S)",
            "TIMEOUT",
        )

    def _too_large(self) -> BadRequest:
        mb = self.limits.max_message_mb
        return BadRequest(
            413, f"the request body is larger than {mb:g} MiB (OPENENV_MAX_MESSAGE_MB)", "MESSAGE_TOO_LARGE"
        )


class _Late(Exception):
    """A read that did not come by its deadline."""


class _Client:
    """One client connection of the front: its requests, its address, and the one connection to a
    worker it holds at a time (the front's descriptors are counted two per client connection)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: ServerLimits) -> None:
        self.incoming = _Incoming(reader, limits)
        self.reader, self.writer = reader, writer
        peer = writer.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer and peer[0] else "unknown"
        self.remote = not is_loopback_ip(self.address)
        self.upstream: Optional[Tuple[str, asyncio.StreamReader, asyncio.StreamWriter]] = None

    async def connect(self, worker: Worker, reuse: bool) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """A connection to ``worker``: the one held, when ``reuse`` allows and it is to that worker
        and still open, else a new one (a 503 :class:`BadRequest` when it cannot be opened).
        The third value says whether the connection was held already."""
        held = self.upstream
        if (
            held is not None
            and reuse
            and held[0] == worker.prefix
            and not held[2].is_closing()
            and not held[1].at_eof()
        ):
            return held[1], held[2], True
        self.release()
        try:
            reader, writer = await asyncio.open_unix_connection(worker.socket_path, limit=_CHUNK)
        except OSError:
            raise BadRequest(503, f"worker {worker.prefix} is not available right now; retry", "SERVER_BUSY") from None
        self.upstream = (worker.prefix, reader, writer)
        return reader, writer, False

    def release(self) -> None:
        """Close the connection to a worker held, if any."""
        if self.upstream is not None:
            self.upstream[2].close()
            self.upstream = None

    def head_bytes(self, request: _Request) -> bytes:
        """``request``'s head as the worker is to receive it (see the module docstring)."""
        head = request.head
        lines = [b"%s %s HTTP/%s" % (head.method, head.target, head.http_version)]
        for name, value in head.headers.raw_items():
            lower = name.lower()
            if (self.remote and lower in FORWARDING_HEADERS) or (request.chunked and lower == b"content-length"):
                continue  # (h11 reads a chunked body by its chunks: a length beside them would mislead)
            lines.append(name + b": " + value)
        lines.append(b"x-forwarded-for: " + self.address.encode("latin-1"))
        return b"\r\n".join(lines) + b"\r\n\r\n"


@dataclass
class _Reply:
    """How far a worker's answer has got."""

    sent: bool = False
    """Some of it reached the client (the request cannot be sent again)."""
    complete: bool = False
    close: bool = False
    """The worker said it closes its connection after it (``Connection: close``)."""


def _agent_session(authorization: Optional[str]) -> Optional[str]:
    """The session an agent credential (``Bearer oe-agent.<session>.<expiry>.<nonce>.<mac>``, see
    ``roles``) was minted for: its requests go to the worker holding it, which checks the rest."""
    if not authorization:
        return None
    scheme, _, credential = authorization.partition(" ")
    if scheme.lower() != "bearer" or not credential.strip().startswith(AGENT_PREFIX):
        return None
    body = credential.strip()[len(AGENT_PREFIX) :]
    session = body.rsplit(".", 3)[0] if body.count(".") >= 3 else ""
    return session or None


class Front(TCPRelay):
    """Listen on ``host:port`` and spread connections over ``workers`` (see the module docstring).

    ``token`` is the bearer token the workers require, if any: the front sends it with its own
    capacity queries, and tells session counts only to callers who send it too.
    """

    def __init__(
        self,
        workers: Sequence[Worker],
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        token: Optional[str] = None,
        limits: Optional[ServerLimits] = None,
        max_per_client: Optional[int] = None,
        cap_local: bool = False,
        report_interval_s: float = 1.0,
    ) -> None:
        self.limits = limits or ServerLimits.from_env()
        if max_per_client is None:
            max_per_client = self.limits.max_connections_per_client
        super().__init__(host, port, max_per_client, cap_local, self.limits.max_local_connections)
        self.workers: Dict[str, Worker] = {w.prefix: w for w in workers}
        self.token = token.encode() if token else None
        self.report_interval_s = report_interval_s
        self.budget = InFlightBudget(self.limits.max_inflight_bytes)
        """Bytes of request bodies the front holds (read ahead), all its connections together."""
        self._turn = itertools.count()
        self._create_keys: Dict[bytes, str] = {}  # in the order used, the oldest first
        self._reporter: Optional[asyncio.Task] = None

    # --- the workers ----------------------------------------------------------------------------

    def set_up(self, prefix: str, socket_path: str) -> None:
        """Worker ``prefix`` serves on ``socket_path`` (a path or ``unix://``) from now on."""
        worker = self.workers[prefix]
        worker.socket_path, worker.up = _strip_unix(socket_path), True
        worker.reported = worker.placed = 0

    def set_down(self, prefix: str) -> None:
        """Worker ``prefix`` is gone: nothing more is sent to it until :meth:`set_up`."""
        self.workers[prefix].up = False

    def least_loaded(self) -> Worker:
        """The worker to place a new session on: the fewest sessions, in turn among equals."""
        up = [w for w in self.workers.values() if w.up]
        if not up:
            raise BadRequest(503, "no worker of this server is running right now; retry shortly", "SERVER_BUSY")
        turn = next(self._turn)
        return min(up, key=lambda w: (w.load, (up.index(w) - turn) % len(up)))

    def owner(self, session_id: str) -> Worker:
        """The worker holding ``session_id`` (a 404 :class:`BadRequest` when none could)."""
        prefix, sep, _rest = session_id.partition("-")
        worker = self.workers.get(prefix) if sep else None
        if worker is None:
            known = ", ".join(f"{p}-" for p in self.workers)
            raise BadRequest(
                404,
                f"Unknown session_id: {session_id[:80]!r} (no worker here made it: their ids start with {known}); "
                "start a new session",
                "SESSION_ERROR",
            )
        if not worker.up:
            raise BadRequest(
                404,
                f"Unknown session_id: {session_id[:80]!r} (the worker that held it, {worker.prefix}, stopped; "
                "its sessions ended); start a new session",
                "SESSION_ERROR",
            )
        return worker

    async def start(self) -> Tuple[str, int]:
        address = await super().start()
        self._reporter = asyncio.ensure_future(self._report_forever())
        return address

    async def close(self) -> None:
        if self._reporter is not None:
            self._reporter.cancel()
            with contextlib.suppress(BaseException):
                await self._reporter
        await super().close()

    async def _report_forever(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.report_interval_s)

    async def refresh(self) -> None:
        """Ask every running worker how many sessions it holds."""
        await asyncio.gather(*(self._ask(w) for w in self.workers.values() if w.up))

    async def _ask(self, worker: Worker) -> None:
        # POLL_TARGET: the workers keep these polls, once a second each, out of their access logs
        headers = [(b"authorization", b"Bearer " + self.token)] if self.token is not None else []
        try:
            _status, report = await _ask_worker(worker, b"GET", POLL_TARGET.encode(), headers, 65536, 2.0)
            worker.max_sessions, worker.reported = int(report["max_sessions"]), int(report["active_sessions"])
            worker.placed = 0
        except Exception as exc:  # a worker that is stopping, or not ready: the supervisor decides
            logger.debug("worker %s did not report its capacity: %s", worker.prefix, exc)

    # --- connections ----------------------------------------------------------------------------

    async def relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        client = _Client(client_reader, client_writer, self.limits)
        try:
            while True:
                request: Optional[_Request] = None
                try:
                    head = await client.incoming.head()
                    if head is None:
                        return  # the client is done (or quiet past the header timeout)
                    request = _Request(head)
                    if request.path == "/health" and head.method == b"GET":
                        await _answer(client_writer, *await self._health(request))
                        return
                    if _proposes_switch(request):
                        await self._relay_socket(request, client)
                        return
                    await self._read_ahead(request, client.incoming)
                    if _asks_metrics(request):
                        await _answer(client_writer, *await self._metrics(request, client))
                        return
                    keep = await self._exchange(self._route(request), request, client)
                except BadRequest as exc:
                    client.release()  # (a worker that got part of a request must not wait for the rest)
                    await _answer(client_writer, exc.status, {"detail": exc.detail, "code": exc.code})
                    await linger(client_reader)
                    return
                finally:
                    if request is not None:
                        self.budget.release(request.reserved)
                if not keep:
                    return
        finally:
            client.release()

    def _session_in_head(self, request: _Request) -> Optional[str]:
        named = request.query.get("session_id") or [
            request.header(b"mcp-session-id")
            or request.header(b"x-openenv-resume-session")
            or request.header(b"x-openenv-session")
            or ""
        ]
        return named[-1] or _agent_session(request.header(b"authorization"))

    def _session_named(self, request: _Request) -> Optional[str]:
        named = self._session_in_head(request)
        if named is not None:
            return named
        if request.head.method == b"POST":
            message = request.message  # (None: the worker answers an invalid body)
            if isinstance(message, dict):
                params = message.get("params")
                found = message.get("session_id") or (params.get("session_id") if isinstance(params, dict) else None)
                if isinstance(found, str) and found:
                    return found
        return None

    async def _read_ahead(self, request: _Request, incoming: _Incoming) -> None:
        """Read the body of ``request`` before sending it on when it is at most
        :data:`_PARSED_BODY_BYTES`: for the session it names or the call it makes, and to send it
        again should the kept-alive connection to its worker turn out closed. The bytes held draw on
        the front's budget (503 past it). A larger body is left to stream to its worker unread."""
        declared = request.content_length
        if declared is not None and declared > _PARSED_BODY_BYTES:
            return
        if declared and not self.budget.reserve(declared):
            raise BadRequest(503, self.budget.refusal(), "SERVER_BUSY")
        request.reserved = declared or 0
        body = bytearray()
        while len(body) <= _PARSED_BODY_BYTES:
            piece = await incoming.body()
            if isinstance(piece, h11.EndOfMessage):
                request.ended = piece
                break
            body += piece
            if len(body) - request.reserved >= BUDGET_EXEMPT_BYTES:  # chunked: drawn as it comes
                if not self.budget.reserve(len(body) - request.reserved):
                    raise BadRequest(503, self.budget.refusal(), "SERVER_BUSY")
                request.reserved = len(body)
        request.body = bytes(body)

    def _route(self, request: _Request) -> Worker:
        session_id = self._session_named(request)
        if session_id is not None:
            return self.owner(session_id)
        key = request.header(b"x-openenv-create-key")
        if key is not None and len(key) > CREATE_KEY_MAX_CHARS:
            raise BadRequest(
                400,
                f"X-OpenEnv-Create-Key is {len(key)} characters long; send a random key of at most "
                f"{CREATE_KEY_MAX_CHARS} (OpenEnv's clients send 32)",
            )
        method = _rpc_method(request)
        worker: Optional[Worker] = None
        if key and request.path == "/mcp" and method == "openenv/session/create" and request.head.method == b"POST":
            request.create_key = hashlib.blake2b(key.encode("latin-1"), digest_size=16).digest()
            prefix = self._create_keys.get(request.create_key)
            worker = self.workers.get(prefix) if prefix is not None else None
        if worker is None or not worker.up:
            worker = self.least_loaded()
        creating = request.path == "/web/session" or (request.path == "/mcp" and method in _CREATING)
        if creating and request.head.method == b"POST":
            worker.placed += 1
        return worker

    def _remember(self, key: bytes, worker: Worker) -> None:
        """A create with ``key`` made its session on ``worker``: a retry of it goes there too."""
        self._create_keys.pop(key, None)
        self._create_keys[key] = worker.prefix
        while len(self._create_keys) > CREATE_KEYS_KEPT:
            del self._create_keys[next(iter(self._create_keys))]

    async def _health(self, request: _Request) -> Tuple[int, Dict[str, Any]]:
        await self.refresh()
        up = [w for w in self.workers.values() if w.up]
        status = "healthy" if len(up) == len(self.workers) else "degraded" if up else "unhealthy"
        answer: Dict[str, Any] = {"status": status}
        if self.token is None or auth.authorized({"headers": request.headers}, self.token):
            answer["active_sessions"] = sum(max(w.sockets, w.reported) for w in up)
            answer["max_sessions"] = sum(w.max_sessions or 0 for w in self.workers.values())
            answer["workers"] = [w.status() for w in self.workers.values()]
        return 200 if up else 503, answer

    async def _metrics(self, request: _Request, client: _Client) -> Tuple[int, Any]:
        """The metrics of every running worker, asked as ``request`` asks (the caller's credential
        goes with it: each worker decides), merged: :func:`merge_metrics`. The first refusal (an
        HTTP error, or a JSON-RPC one) is the answer as its worker gave it."""
        up = [w for w in self.workers.values() if w.up]
        if not up:
            raise BadRequest(503, "no worker of this server is running right now; retry shortly", "SERVER_BUSY")
        rpc = request.message if request.path == "/mcp" else None
        answers = await asyncio.gather(*(self._ask_metrics(w, request, client) for w in up))
        parts: List[Tuple[str, Dict[str, Any]]] = []
        unreported = [w.prefix for w in self.workers.values() if not w.up]
        for worker, answer in zip(up, answers, strict=True):
            if answer is None:
                unreported.append(worker.prefix)
                continue
            status, content = answer
            result = content.get("result") if rpc is not None and isinstance(content, dict) else content
            if status != 200 or not isinstance(result, dict):
                return status, content  # refused (or a worker's own error): as it said
            parts.append((worker.prefix, result))
        if not parts:
            raise BadRequest(503, "no worker of this server answered for its metrics; retry shortly", "SERVER_BUSY")
        merged = merge_metrics(parts)
        if unreported:
            merged["unreported_workers"] = sorted(unreported)
        if rpc is not None:
            return 200, {"jsonrpc": "2.0", "id": rpc.get("id"), "result": merged}
        return 200, merged

    async def _ask_metrics(self, worker: Worker, request: _Request, client: _Client) -> Optional[Tuple[int, Any]]:
        """``worker``'s answer to ``request`` (its status and JSON), or None when it gave none
        within :data:`METRICS_WAIT_S`."""
        headers = [(b"x-forwarded-for", client.address.encode())]
        headers += [(name, value) for name, value in request.headers if name in _ASKED_ON]
        try:
            return await _ask_worker(
                worker,
                request.head.method,
                request.path.encode(),
                headers,
                METRICS_REPLY_MAX_BYTES,
                METRICS_WAIT_S,
                request.body,
            )
        except Exception as exc:  # stopping, stuck, or no JSON: left out, and named
            logger.warning("worker %s did not report its metrics: %s", worker.prefix, exc)
            return None

    async def _relay_socket(self, request: _Request, client: _Client) -> None:
        """A WebSocket handshake: on to its worker, then both ways until either side ends."""
        upgrade = (request.header(b"upgrade") or "").lower()
        if request.head.method != b"GET" or upgrade != "websocket":
            raise BadRequest(400, "the front relays only WebSocket upgrades (GET, Upgrade: websocket)")
        if not isinstance(await client.incoming.body(), h11.EndOfMessage):
            raise BadRequest(400, "a WebSocket handshake carries no body")
        session_id = self._session_named(request)
        worker = self.owner(session_id) if session_id is not None else self.least_loaded()
        new_session = session_id is None
        if new_session:
            worker.sockets += 1  # counted before the first await: sockets opened at once spread out
        try:
            server_reader, server_writer, _held = await client.connect(worker, reuse=False)
            server_writer.write(client.head_bytes(request) + client.incoming.leftover)
            client.upstream = None  # splice closes it
            await splice(client.reader, client.writer, server_reader, server_writer)
        finally:
            if new_session:
                worker.sockets -= 1

    async def _exchange(self, worker: Worker, request: _Request, client: _Client) -> bool:
        """One HTTP request to ``worker`` and its whole response back; whether to keep the
        client's connection for another request. Whatever could refuse the request is done before
        a byte of it reaches the worker: a call the front could not answer is never run."""
        try:
            tracker_head = _as_http11(request)
            tracker = h11.Connection(h11.CLIENT)
            tracker.send(tracker_head)  # what h11 needs to read the response (HEAD, close, ...)
        except h11.LocalProtocolError as exc:
            raise BadRequest(400, f"the front cannot relay this request ({exc}); send HTTP/1.1") from None
        head = client.head_bytes(request)
        read = request.framed(request.body) + (request.framed_end(request.ended) if request.ended else b"")
        for attempt in (1, 2):
            # Only a request held whole may be sent again, and only on a new connection.
            reader, writer, held = await client.connect(worker, reuse=attempt == 1 and request.ended is not None)
            if attempt == 2:
                tracker = h11.Connection(h11.CLIENT)
                tracker.send(tracker_head)
            writer.write(head + read)
            reply = _Reply()
            answering = self._reply(worker, request, reader, tracker, client, reply)
            if request.ended is not None:  # (no task of its own: the usual case, kept cheap)
                await answering
                body_sent = True
            else:
                body_sent = await self._stream(request, client, writer, answering, reply)
            if not reply.sent:
                client.release()
                if held:
                    continue  # a kept-alive connection the worker had closed: once more on a new one
                return False  # the worker went away without a word: the client sees the connection end
            await client.writer.drain()
            if reply.complete and body_sent and not reply.close:
                return _keeps_alive(request)
            client.release()
            if reply.complete and not body_sent:
                await linger(client.reader)  # answered before the body ended: read the rest out, then close
            return False
        return False

    async def _stream(
        self, request: _Request, client: _Client, writer: asyncio.StreamWriter, answering: Any, reply: _Reply
    ) -> bool:
        """Send the rest of the body to the worker while ``answering`` relays its response; whether
        the whole body was sent."""
        pump = asyncio.ensure_future(self._pump(request, client, writer))
        relay = asyncio.ensure_future(answering)
        try:
            await asyncio.wait((pump, relay), return_when=asyncio.FIRST_COMPLETED)
            if pump.done() and pump.exception() is not None and not relay.done():
                # The body failed (too large, too late, the client left): the worker never got the
                # whole request, so it runs nothing; the client hears why (if it has heard nothing).
                client.release()
                if reply.sent:
                    return False
                raise pump.exception()  # type: ignore[misc]
            await relay
            return pump.done() and pump.exception() is None and pump.result()
        finally:
            for task in (pump, relay):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task

    async def _pump(self, request: _Request, client: _Client, writer: asyncio.StreamWriter) -> bool:
        """The rest of ``request``'s body, from the client to the worker as it comes; False when
        the worker stopped taking it (it answers why, or closed without a word)."""
        while True:
            piece = await client.incoming.body()
            try:
                if isinstance(piece, h11.EndOfMessage):
                    writer.write(request.framed_end(piece))
                    await writer.drain()
                    return True
                writer.write(request.framed(piece))
                await writer.drain()  # (also how a connection the worker closed shows)
            except ConnectionError:
                return False

    async def _reply(
        self,
        worker: Worker,
        request: _Request,
        reader: asyncio.StreamReader,
        tracker: h11.Connection,
        client: _Client,
        reply: _Reply,
    ) -> None:
        """Relay the worker's response to the client until it is complete (or the worker goes away)."""
        while True:
            data = await reader.read(_CHUNK)
            if not data and not reply.sent:
                return
            tracker.receive_data(data)
            done = self._follow(tracker, worker, request, reply)
            if data:
                client.writer.write(data)
                reply.sent = True
                if client.writer.transport.get_write_buffer_size() > _CHUNK:
                    await client.writer.drain()
            if done or not data:
                return

    def _follow(self, tracker: h11.Connection, worker: Worker, request: _Request, reply: _Reply) -> bool:
        """Read the response fed to ``tracker`` so far into ``reply``; whether it is over."""
        while True:
            try:
                event = tracker.next_event()
            except h11.RemoteProtocolError:
                return True  # not HTTP the front understands: relayed as it was, then the connection ends
            if event is h11.NEED_DATA:
                return False
            if isinstance(event, h11.Response):
                reply.close = b"close" in b",".join(v for k, v in event.headers if k == b"connection").lower()
                if request.create_key is not None and 200 <= event.status_code < 300:
                    self._remember(request.create_key, worker)
            elif isinstance(event, h11.EndOfMessage):
                reply.complete = True
                return True
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return True


async def _ask_worker(
    worker: Worker,
    method: bytes,
    target: bytes,
    headers: List[Tuple[bytes, bytes]],
    limit: int,
    wait_s: float,
    body: bytes = b"",
) -> Tuple[int, Any]:
    """The front's own request to ``worker`` (on a connection of its own, closed after it): its
    answer's status and JSON, read within ``wait_s`` and at most ``limit`` bytes (a worker runs
    untrusted code); an exception when there is none."""
    headers = [(b"host", b"worker"), (b"connection", b"close"), *headers]
    if body:
        headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    tracker = h11.Connection(h11.CLIENT)
    outgoing = tracker.send(h11.Request(method=method, target=target, headers=headers))
    outgoing += (tracker.send(h11.Data(data=body)) or b"") if body else b""
    outgoing += tracker.send(h11.EndOfMessage()) or b""
    reader, writer = await within(asyncio.open_unix_connection(worker.socket_path), wait_s)
    try:
        writer.write(outgoing)
        reply = await within(_read_bounded(reader, limit), wait_s)
    finally:
        writer.close()
    tracker.receive_data(reply)
    tracker.receive_data(b"")
    status, answer = 0, bytearray()
    while True:
        event = tracker.next_event()
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            answer += event.data
        elif isinstance(event, h11.EndOfMessage):
            return status, json.loads(answer)
        elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
            raise ValueError(f"the answer ended early ({len(reply)} bytes)")


async def _read_bounded(reader: asyncio.StreamReader, limit: int) -> bytes:
    """What ``reader`` sends until it ends, at most ``limit`` bytes (a worker runs untrusted code)."""
    data = b""
    while len(data) < limit:
        chunk = await reader.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _proposes_switch(request: _Request) -> bool:
    """Whether the request asks to leave HTTP (a protocol upgrade, CONNECT), as h11 reads it."""
    return request.head.method == b"CONNECT" or request.header(b"upgrade") is not None


def _as_http11(request: _Request) -> h11.Request:
    """The head as h11's client side takes it (it sends only HTTP/1.1, which needs a ``Host``), to
    read the worker's response by; the worker itself receives the client's version."""
    head = request.head
    if head.http_version == b"1.1":
        return head  # (h11 made sure it names its Host)
    headers = request.headers if request.header(b"host") is not None else [*request.headers, (b"host", b"worker")]
    return h11.Request(method=head.method, target=head.target, headers=headers)


def _keeps_alive(request: _Request) -> bool:
    connection = b",".join(v for k, v in request.headers if k == b"connection").lower()
    if request.head.http_version == b"1.0":
        return b"keep-alive" in connection
    return b"close" not in connection


def _asks_metrics(request: _Request) -> bool:
    """Whether ``request`` asks for the server's metrics (:meth:`Front._metrics` answers it)."""
    if request.path == METRICS_PATH:
        return request.head.method == b"GET"
    return request.path == "/mcp" and request.head.method == b"POST" and _rpc_method(request) == "openenv/metrics"


def merge_metrics(parts: Sequence[Tuple[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """The metrics of several workers (``(prefix, metrics)``) as one server's: numbers summed
    (sessions open, the limit, resets, steps, ...), lists put together (each session's progress:
    its id names its worker), anything else as the first worker has it; ``workers`` lists the
    workers that answered."""
    merged: Dict[str, Any] = {}
    for _prefix, part in parts:
        for key, value in part.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                merged[key] = merged.get(key, 0) + value
            else:
                merged.setdefault(key, value)
    merged["workers"] = [prefix for prefix, _ in parts]
    return merged


def _rpc_method(request: _Request) -> Optional[str]:
    message = request.message
    method = message.get("method") if isinstance(message, dict) else None
    return method if isinstance(method, str) else None


async def _answer(writer: asyncio.StreamWriter, status: int, content: Any) -> None:
    """A JSON answer of the front's own; the connection closes after it."""
    body = json.dumps(content).encode()
    reason = _REASONS.get(status, "Error").encode()
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (
        status,
        reason,
        len(body),
    )
    with contextlib.suppress(OSError):
        writer.write(head + body)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
