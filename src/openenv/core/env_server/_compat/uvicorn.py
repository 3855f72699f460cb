"""Bounds on connections that uvicorn's public options do not give: a time limit on getting a
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

``OPENENV_CONNECTION_GUARD=0`` serves without it (neither limit applies then).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import time
from typing import Any, Callable, Dict, Optional

from ...utils import is_loopback_ip

logger = logging.getLogger("openenv.server")

_CURRENT: contextvars.ContextVar[Optional[GuardedConnection]] = contextvars.ContextVar(
    "openenv_connection", default=None
)

LOG_EVERY_S = 10.0
"""Refusals are logged at most this often."""

LOCAL = "local"
"""The address that loopback and Unix-socket peers share."""


TESTED_UVICORN = ((0, 30), (1, 0))
"""uvicorn releases CI tests OpenEnv's WebSocket protocol subclass and this guard against: from
the first to before the second (``OPENENV_CONNECTION_GUARD=0`` and ``ws="websockets-sansio"``
serve without either elsewhere)."""


def sansio_protocol_tested() -> bool:
    """Whether the installed uvicorn is in :data:`TESTED_UVICORN` and has the sans-I/O protocol."""
    import uvicorn

    try:
        version = tuple(int(part) for part in uvicorn.__version__.split(".")[:2])
    except ValueError:
        return False
    low, high = TESTED_UVICORN
    return low <= version < high


def enabled() -> bool:
    """Whether connections are guarded (``OPENENV_CONNECTION_GUARD`` is not ``0``)."""
    return os.environ.get("OPENENV_CONNECTION_GUARD", "1").strip() != "0"


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
