"""What bounds a server's resources, kept in one place: its limits (:class:`~.settings.ServerLimits`:
the table of :mod:`.settings` says what each bounds), the budget of bytes in flight, and the one
table of open connections per client address that every listener of OpenEnv's keeps (the
server's transport guard, :mod:`._compat.uvicorn`, and the TCP fronts of
:mod:`openenv.core.containers.runtime.forward`), with the one refusal they answer."""

from __future__ import annotations

import collections
import json
import logging
import time
from typing import Any, Counter, Optional

from ..utils import is_loopback_ip
from .settings import ServerLimits as ServerLimits  # re-exported: the transport, the forwarder and users import it here

BUDGET_EXEMPT_BYTES = 64 * 1024
"""Frames and bodies smaller than this never draw on the budget of bytes in flight: a server
whose budget is taken by large messages keeps answering ordinary small ones."""


class InFlightBudget:
    """The server-wide count of bytes in flight against ``limit`` (None: unbounded).

    Only touched on the event loop. :meth:`reserve` says whether ``size`` more bytes fit; a
    reservation is given back with :meth:`release`. Reservations below
    :data:`BUDGET_EXEMPT_BYTES` always succeed and are not counted."""

    __slots__ = ("limit", "refused", "used")

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        self.used = 0
        self.refused = 0  # reservations refused so far

    def reserve(self, size: int) -> bool:
        if size < BUDGET_EXEMPT_BYTES:
            return True
        if self.limit is not None and self.used + size > self.limit:
            self.refused += 1
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        if size >= BUDGET_EXEMPT_BYTES:
            self.used = max(0, self.used - size)

    def refusal(self) -> str:
        """The error message for a refused reservation."""
        return (
            f"The server is receiving as many large messages as it may hold at once ({self.limit} bytes in flight, "
            "OPENENV_MAX_INFLIGHT_MB); retry shortly"
        )


logger = logging.getLogger("openenv.server")

LOCAL = "local"
"""The address that loopback and Unix-socket peers share for the per-client caps (they are this
machine's: the trainer's own processes, a front relaying to its servers)."""

LOG_EVERY_S = 10.0
"""Refusals are logged at most this often."""


def address_of(peer: Any, cap_local: bool = False) -> str:
    """The address a connection from ``peer`` (a socket's peer name) counts against: its IP, or
    :data:`LOCAL` for a loopback or Unix-socket peer (``cap_local``: a loopback IP counts as its
    own, as tests of the per-client cap want)."""
    if not isinstance(peer, tuple) or not peer or not peer[0]:
        return LOCAL  # a Unix socket
    host = str(peer[0])
    return LOCAL if is_loopback_ip(host) and not cap_local else host


def unavailable(detail: str, code: str, retry_after_s: Optional[int] = None) -> bytes:
    """A whole HTTP 503 answer, ``{"detail", "code"}``, after which the connection is closed."""
    body = json.dumps({"detail": detail, "code": code}, separators=(",", ":")).encode()
    head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    if retry_after_s is not None:
        head += b"retry-after: %d\r\n" % retry_after_s
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


class ConnectionTable:
    """The open connections of one listener, per client address, and what its caps refused.

    ``max_per_client`` caps each remote address, ``max_local`` this machine's clients together
    (0: no cap). ``header_timeout_s`` is the server guard's (a connection that gets no request
    under way within it is closed; ``timed_out`` counts them)."""

    def __init__(self, max_per_client: int, max_local: int = 0, header_timeout_s: float = 0.0) -> None:
        self.max_per_client = max_per_client
        self.max_local = max_local
        self.header_timeout_s = header_timeout_s
        self.open: Counter[str] = collections.Counter()
        self.refused = 0  # connections refused for the per-client caps
        self.timed_out = 0
        self._logged_at = 0.0
        self._logged_count = 0

    @classmethod
    def of(cls, limits: ServerLimits) -> ConnectionTable:
        """The table for a listener with ``limits``."""
        return cls(limits.max_connections_per_client, limits.max_local_connections, limits.header_timeout_s)

    def cap(self, address: str) -> int:
        """The cap on ``address``'s open connections (0: none)."""
        return self.max_local if address == LOCAL else self.max_per_client

    def admit(self, address: str) -> bool:
        """Count a new connection from ``address`` in, or refuse it (and log that, at most once
        every :data:`LOG_EVERY_S`: an attacker must not flood the log)."""
        cap = self.cap(address)
        if not cap or self.open[address] < cap:
            self.open[address] += 1
            return True
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            logger.warning(
                "refused %d connection(s) since the last report: the cap of %d per client address "
                "(OPENENV_MAX_CONNECTIONS_PER_CLIENT, OPENENV_MAX_LOCAL_CONNECTIONS for this machine) "
                "was reached, last by %s",
                self.refused - self._logged_count,
                cap,
                address,
            )
            self._logged_at, self._logged_count = now, self.refused
        return False

    def leave(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]

    def refusal(self, address: str) -> bytes:
        """The HTTP answer to a connection from ``address`` that :meth:`admit` refused."""
        cap = self.cap(address)
        if address == LOCAL:
            allows = (
                f"{cap} from this machine, OPENENV_MAX_LOCAL_CONNECTIONS, and OPENENV_MAX_CONNECTIONS_PER_CLIENT "
                "from each other address"
            )
        else:
            allows = f"{cap} per client address, OPENENV_MAX_CONNECTIONS_PER_CLIENT"
        detail = f"too many connections from {address} (the server allows {allows}); close some and retry"
        return unavailable(detail, "TOO_MANY_CONNECTIONS")
