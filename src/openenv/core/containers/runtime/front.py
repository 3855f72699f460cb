"""One TCP address in front of several server processes of one environment, on Unix sockets.

Each server process (a *worker*) makes session ids that start with its own prefix
(``OPENENV_SESSION_ID_PREFIX``: ``w3-<uuid>``), so the id says where a session lives. :class:`Front`
reads each request's head (parsed with ``h11``) and sends it on, byte for byte, to:

* the worker whose prefix the request's session id carries, when it names one: ``?session_id=``
  (``/ws`` attaches, ``/state``), an ``Mcp-Session-Id`` or ``X-OpenEnv-Session`` (the web page's) header, or ``session_id`` (top level or in
  ``params``) in the JSON body of an HTTP call. An id no worker owns is answered 404;
* for an HTTP create carrying ``X-OpenEnv-Create-Key`` sent again (resumable clients send one,
  and send it again when the answer was lost), the worker the first one went to;
* the least-loaded worker otherwise (new ``/ws`` and ``/mcp`` sockets, ``openenv/session/create``,
  stateless calls): the one with the fewest sessions, as the front counts its open sockets and the
  workers report (``GET /openenv/capacity``).

A WebSocket, once its handshake is sent on, is relayed both ways until either side closes. Plain
HTTP requests are routed one by one (a kept-alive connection may name sessions of several
workers); the front answers ``GET /health`` itself, for the whole: every worker's status, the
sessions they hold and their capacity summed. Bad requests get a JSON error and the connection is
closed: a malformed head 400, a head larger than :data:`MAX_HEAD_BYTES` 431, a body larger than
``OPENENV_MAX_MESSAGE_MB`` 413; a request head must arrive within ``OPENENV_HEADER_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import parse_qs, urlsplit

import h11

from ...env_server import auth
from ...env_server.settings import ServerLimits
from ...utils import within
from .forward import _CHUNK, TCPRelay, _strip_unix, linger, splice

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""The largest request head accepted (uvicorn's own bound is about the same)."""
CAPACITY_PATH = "/openenv/capacity"
_CREATING = frozenset({"openenv/session/create", "initialize"})  # JSON-RPC calls that make a session
CREATE_KEYS_KEPT = 65536
"""Create keys the front remembers (key → worker), the oldest forgotten first."""
_PARSED_BODY_BYTES = 1 << 20
"""Bodies the front reads for a session id or a JSON-RPC method: larger ones are relayed unread
(a call naming a session is small; parsing a big body on the front's one loop would stall every
worker's traffic)."""


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
    raw: bytes  # the request's bytes as they came: head and body
    body: bytes
    upgrade: bool

    @property
    def target(self) -> Tuple[str, Dict[str, List[str]]]:
        parts = urlsplit(self.head.target.decode("latin-1"))
        return parts.path, parse_qs(parts.query)

    def header(self, name: bytes) -> Optional[str]:
        for key, value in self.head.headers:
            if key == name:
                return value.decode("latin-1")
        return None


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
        super().__init__(host, port, max_per_client, cap_local)
        self.workers: Dict[str, Worker] = {w.prefix: w for w in workers}
        self.token = token.encode() if token else None
        self.report_interval_s = report_interval_s
        self._turn = itertools.count()
        self._create_keys: OrderedDict[str, str] = OrderedDict()
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
        request = b"GET %s HTTP/1.1\r\nhost: worker\r\nconnection: close\r\n" % CAPACITY_PATH.encode()
        if self.token is not None:
            request += b"authorization: Bearer " + self.token + b"\r\n"
        try:
            reader, writer = await within(asyncio.open_unix_connection(worker.socket_path), 2.0)
            try:
                writer.write(request + b"\r\n")
                reply = await within(_read_bounded(reader, 65536), 2.0)
            finally:
                writer.close()
            report = json.loads(reply.partition(b"\r\n\r\n")[2])
            worker.max_sessions, worker.reported = int(report["max_sessions"]), int(report["active_sessions"])
            worker.placed = 0
        except Exception as exc:  # a worker that is stopping, or not ready: the supervisor decides
            logger.debug("worker %s did not report its capacity: %s", worker.prefix, exc)

    # --- connections ----------------------------------------------------------------------------

    async def relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        leftover = b""
        upstreams: Dict[str, Tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        try:
            while True:
                try:
                    request, leftover = await self._read_request(client_reader, leftover)
                    if request is None:
                        return  # the client is done (or idle past the header timeout)
                    if request.target[0] == "/health" and request.head.method == b"GET":
                        await _answer(client_writer, *await self._health(request))
                        return
                    if request.upgrade:
                        if request.head.method != b"GET" or (request.header(b"upgrade") or "").lower() != "websocket":
                            raise BadRequest(400, "the front relays only WebSocket upgrades (GET, Upgrade: websocket)")
                        await self._relay_socket(request, client_reader, client_writer)
                        return
                    worker = self._route(request)
                except BadRequest as exc:
                    await _answer(client_writer, exc.status, {"detail": exc.detail, "code": exc.code})
                    await linger(client_reader)
                    return
                keep = await self._exchange(worker, request, upstreams, client_writer)
                if not keep:
                    return
        finally:
            for _reader, writer in upstreams.values():
                writer.close()

    async def _read_request(self, reader: asyncio.StreamReader, leftover: bytes) -> Tuple[Optional[_Request], bytes]:
        """The next request (head and body, bounded) and what came after it; None when the client
        closed, or stayed idle past the header timeout, between requests."""
        parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        raw = bytearray()
        head: Optional[h11.Request] = None
        body = bytearray()
        timeout = self.limits.header_timeout_s or None
        deadline = time.monotonic() + timeout if timeout else None
        data = leftover
        while True:
            if data:
                raw += data
                parser.receive_data(data)
                data = b""
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                if exc.error_status_hint == 431:
                    raise BadRequest(
                        431, f"the request head is larger than {MAX_HEAD_BYTES} bytes", "HEAD_TOO_LARGE"
                    ) from None
                raise BadRequest(400, f"malformed HTTP request ({exc}); send HTTP/1.1") from None
            if event is h11.NEED_DATA:
                # The head within the header timeout; each read of a body within it too.
                wait = timeout if head is not None or deadline is None else max(deadline - time.monotonic(), 0.0)
                try:
                    data = await within(reader.read(_CHUNK), wait) if wait is not None else await reader.read(_CHUNK)
                except (TimeoutError, asyncio.TimeoutError):
                    if not raw:
                        return None, b""
                    raise BadRequest(
                        408, "the request did not arrive in time (OPENENV_HEADER_TIMEOUT_S)", "TIMEOUT"
                    ) from None
                if not data:
                    if not raw:
                        return None, b""
                    parser.receive_data(b"")  # the client closed halfway: h11 says so next
                continue
            if isinstance(event, h11.Request):
                head = event  # h11 bounds a head that comes in pieces; this one came whole
                if len(head.target) + sum(len(k) + len(v) + 4 for k, v in head.headers) > MAX_HEAD_BYTES:
                    raise BadRequest(431, f"the request head is larger than {MAX_HEAD_BYTES} bytes", "HEAD_TOO_LARGE")
                declared = dict(head.headers).get(b"content-length", b"0")
                if int(declared) > self.limits.max_message_bytes:  # h11 checked it is a number
                    raise self._too_large()
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.limits.max_message_bytes:  # chunked: counted as it comes
                    raise self._too_large()
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                trailing = parser.trailing_data[0]
                kept = bytes(raw[: len(raw) - len(trailing)])
                upgrade = parser.their_state is h11.MIGHT_SWITCH_PROTOCOL
                return _Request(head, kept, bytes(body), upgrade), bytes(trailing)
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

    def _too_large(self) -> BadRequest:
        mb = self.limits.max_message_mb
        return BadRequest(
            413, f"the request body is larger than {mb:g} MiB (OPENENV_MAX_MESSAGE_MB)", "MESSAGE_TOO_LARGE"
        )

    def _session_named(self, request: _Request) -> Optional[str]:
        _path, query = request.target
        named = query.get("session_id") or [
            request.header(b"mcp-session-id") or request.header(b"x-openenv-session") or ""
        ]
        if named[-1]:
            return named[-1]
        if request.head.method == b"POST":
            message = _message(request.body)  # (None: the worker answers an invalid body)
            if isinstance(message, dict):
                params = message.get("params")
                found = message.get("session_id") or (params.get("session_id") if isinstance(params, dict) else None)
                if isinstance(found, str) and found:
                    return found
        return None

    def _route(self, request: _Request) -> Worker:
        path, _query = request.target
        session_id = self._session_named(request)
        if session_id is not None:
            return self.owner(session_id)
        key = request.header(b"x-openenv-create-key")
        worker = self._keyed(key) if key else self.least_loaded()
        creating = path == "/web/session" or (path == "/mcp" and _rpc_method(request.body) in _CREATING)
        if creating and request.head.method == b"POST":
            worker.placed += 1
        return worker

    def _keyed(self, key: str) -> Worker:
        """The worker for an HTTP create carrying ``X-OpenEnv-Create-Key``: the least-loaded one
        the first time, and the same one when the create comes again (its answer was lost), so
        the retry finds the session it made. The last :data:`CREATE_KEYS_KEPT` keys are kept."""
        prefix = self._create_keys.pop(key, None)
        worker = self.workers.get(prefix) if prefix is not None else None
        if worker is None or not worker.up:
            worker = self.least_loaded()
        self._create_keys[key] = worker.prefix
        while len(self._create_keys) > CREATE_KEYS_KEPT:
            self._create_keys.popitem(last=False)
        return worker

    async def _health(self, request: _Request) -> Tuple[int, Dict[str, Any]]:
        await self.refresh()
        up = [w for w in self.workers.values() if w.up]
        status = "healthy" if len(up) == len(self.workers) else "degraded" if up else "unhealthy"
        answer: Dict[str, Any] = {"status": status}
        if self.token is None or auth.authorized({"headers": list(request.head.headers)}, self.token):
            answer["active_sessions"] = sum(max(w.sockets, w.reported) for w in up)
            answer["max_sessions"] = sum(w.max_sessions or 0 for w in self.workers.values())
            answer["workers"] = [w.status() for w in self.workers.values()]
        return 200 if up else 503, answer

    async def _relay_socket(
        self, request: _Request, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        """A WebSocket handshake: on to its worker, then both ways until either side ends."""
        session_id = self._session_named(request)
        worker = self.owner(session_id) if session_id is not None else self.least_loaded()
        new_session = session_id is None
        if new_session:
            worker.sockets += 1  # counted before the first await: sockets opened at once spread out
        try:
            try:
                server_reader, server_writer = await asyncio.open_unix_connection(worker.socket_path, limit=_CHUNK)
            except OSError:
                raise BadRequest(
                    503, f"worker {worker.prefix} is not available right now; retry", "SERVER_BUSY"
                ) from None
            server_writer.write(request.raw)
            await splice(client_reader, client_writer, server_reader, server_writer)
        finally:
            if new_session:
                worker.sockets -= 1

    async def _exchange(
        self,
        worker: Worker,
        request: _Request,
        upstreams: Dict[str, Tuple[asyncio.StreamReader, asyncio.StreamWriter]],
        client_writer: asyncio.StreamWriter,
    ) -> bool:
        """One HTTP request to ``worker`` and its whole response back; whether to keep the
        client's connection for another request."""
        for attempt in (1, 2):
            upstream = upstreams.get(worker.prefix)
            if upstream is None or upstream[1].is_closing() or upstream[0].at_eof():
                try:
                    upstream = await asyncio.open_unix_connection(worker.socket_path, limit=_CHUNK)
                except OSError:
                    await _answer(
                        client_writer,
                        503,
                        {"detail": f"worker {worker.prefix} is not available right now; retry", "code": "SERVER_BUSY"},
                    )
                    return False
                upstreams[worker.prefix] = upstream
            reader, writer = upstream
            writer.write(request.raw)
            tracker = h11.Connection(h11.CLIENT)
            tracker.send(request.head)  # what h11 needs to read the response (HEAD, close, ...)
            sent_anything = False
            while True:
                data = await reader.read(_CHUNK)
                if not data and not sent_anything and attempt == 1:
                    break  # a kept-alive connection the worker had closed: once more on a new one
                tracker.receive_data(data)
                if data:
                    client_writer.write(data)
                    sent_anything = True
                    if client_writer.transport.get_write_buffer_size() > _CHUNK:
                        await client_writer.drain()
                if _response_done(tracker):
                    break
                if not data:
                    return False  # the worker went away mid-response: the client sees the connection end
            if not sent_anything:
                upstreams.pop(worker.prefix, None)[1].close()
                continue
            await client_writer.drain()
            if tracker.their_state is not h11.DONE:
                upstreams.pop(worker.prefix, None)[1].close()
                return False
            return _keeps_alive(request.head)
        return False


async def _read_bounded(reader: asyncio.StreamReader, limit: int) -> bytes:
    """What ``reader`` sends until it ends, at most ``limit`` bytes (a worker runs untrusted code)."""
    data = b""
    while len(data) < limit:
        chunk = await reader.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _response_done(tracker: h11.Connection) -> bool:
    """Whether the response fed to ``tracker`` so far is complete (informational ones skipped)."""
    while True:
        try:
            event = tracker.next_event()
        except h11.RemoteProtocolError:
            return True  # not HTTP the front understands: relayed as it was, then the connection ends
        if event is h11.NEED_DATA:
            return False
        if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)) or event is h11.PAUSED:
            return True


def _keeps_alive(head: h11.Request) -> bool:
    connection = b",".join(v for k, v in head.headers if k == b"connection").lower()
    if head.http_version == b"1.0":
        return b"keep-alive" in connection
    return b"close" not in connection


def _message(body: bytes) -> Any:
    """A small JSON body, parsed; None when it is empty, too big to read here or not JSON."""
    if not body or len(body) > _PARSED_BODY_BYTES:
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _rpc_method(body: bytes) -> Optional[str]:
    message = _message(body)
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
    404: "Not Found",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}
