"""The server's limits on what clients may hold: one settings object, and the budget of bytes in flight.

:class:`ServerLimits` is read once from ``OPENENV_*`` environment variables (``from_env``) or built
in code, validated on construction, and handed to the app (``create_app(..., limits=...)``), which
hands it to the runner (:mod:`.runner`) and the transport. Every limit has a setting that turns it
off (``0``). The defaults suit a trainer that waits minutes for its model between two steps:

=================================  =========  ======================================================
setting                            default    what it bounds
=================================  =========  ======================================================
``OPENENV_MAX_MESSAGE_MB``         32         a frame or request body; the transport refuses a larger
                                              frame before it is buffered (``MESSAGE_TOO_LARGE``)
``OPENENV_MAX_INFLIGHT_MB``        4 x above  large frames being received, large request bodies and
                                              inflated compressed frames, all clients together
                                              (``SERVER_BUSY`` / HTTP 503)
``OPENENV_HEADER_TIMEOUT_S``       10         a connection without a request under way (before its
                                              first request head or WebSocket handshake is complete,
                                              and between requests) is closed after this
``OPENENV_MAX_CONNECTIONS_PER_CLIENT`` 256    open connections from one remote client address
``OPENENV_MAX_LOCAL_CONNECTIONS``  0          open connections from this machine (loopback and
                                              Unix-socket peers together: a trainer's own
                                              rollouts); 0: no cap
``OPENENV_SESSION_IDLE_TIMEOUT_S`` 600        a session with a socket attached that no call has used
                                              for this long is closed; its next call is told why
``OPENENV_MAX_UNSENT_MB``          64         what the server holds unsent for a client that does not
                                              read (pongs, answers); beyond it the client is dropped
=================================  =========  ======================================================

A forwarder in front of the server (``openenv serve`` relays TCP to the server's Unix socket, a
reverse proxy on this machine) makes every client it relays look local: the front must bound its
own clients. ``openenv serve``'s forwarder applies ``OPENENV_MAX_CONNECTIONS_PER_CLIENT`` to the
remote addresses it accepts.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping, Optional

_MIB = 1024 * 1024

BUDGET_EXEMPT_BYTES = 64 * 1024
"""Frames and bodies smaller than this never draw on the budget of bytes in flight: a server
whose budget is taken by large messages keeps answering ordinary small ones."""


def _number(environ: Mapping[str, str], name: str, default: Optional[float], unit: str, integer: bool = False) -> Any:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise ValueError(f"{name} must be {kind} of {unit} (0 turns the limit off), got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of {unit}, at least 0 (0 turns the limit off), got {raw!r}")
    return value


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """Limits on what clients may make the server hold; see the module docstring for each.

    Sizes are in MiB and times in seconds; 0 (or None for ``max_inflight_mb``: 4 x
    ``max_message_mb``) has the meaning the table gives. Invalid values raise ``ValueError``
    naming the setting.
    """

    max_message_mb: float = 32.0
    max_inflight_mb: Optional[float] = None
    header_timeout_s: float = 10.0
    max_connections_per_client: int = 256
    max_local_connections: int = 0
    session_idle_timeout_s: float = 600.0
    max_unsent_mb: float = 64.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.name == "max_inflight_mb":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"ServerLimits.{field.name} must be a finite number >= 0, got {value!r}")
        if self.max_message_mb <= 0:
            raise ValueError("ServerLimits.max_message_mb must be more than 0 (it is the largest frame accepted)")
        for name in ("max_connections_per_client", "max_local_connections"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"ServerLimits.{name} must be a whole number")

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **fields: Any) -> ServerLimits:
        """The limits ``OPENENV_*`` sets (``environ``: ``os.environ``) over ``fields`` (keyword
        arguments that are not None) over the defaults: a variable that is set wins, as for every
        setting (see :mod:`.settings`)."""
        base = cls(**{k: v for k, v in fields.items() if v is not None})
        return limits_from_env(os.environ if environ is None else environ, base)

    def replace(self, **changes: Any) -> ServerLimits:
        return dataclasses.replace(self, **changes)

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mb * _MIB)

    @property
    def max_inflight_bytes(self) -> Optional[int]:
        """None: no budget."""
        mb = 4 * self.max_message_mb if self.max_inflight_mb is None else self.max_inflight_mb
        return int(mb * _MIB) or None

    @property
    def max_unsent_bytes(self) -> Optional[int]:
        return int(self.max_unsent_mb * _MIB) or None


_VARIABLES = (
    ("max_message_mb", "OPENENV_MAX_MESSAGE_MB", "MiB", False),
    ("max_inflight_mb", "OPENENV_MAX_INFLIGHT_MB", "MiB", False),
    ("header_timeout_s", "OPENENV_HEADER_TIMEOUT_S", "seconds", False),
    ("max_connections_per_client", "OPENENV_MAX_CONNECTIONS_PER_CLIENT", "connections", True),
    ("max_local_connections", "OPENENV_MAX_LOCAL_CONNECTIONS", "connections", True),
    ("session_idle_timeout_s", "OPENENV_SESSION_IDLE_TIMEOUT_S", "seconds", False),
    ("max_unsent_mb", "OPENENV_MAX_UNSENT_MB", "MiB", False),
)


def limits_from_env(environ: Mapping[str, str], base: ServerLimits) -> ServerLimits:
    """``base`` with each field whose ``OPENENV_*`` variable is set in ``environ`` replaced."""
    changes = {}
    for field, name, unit, integer in _VARIABLES:
        value = _number(environ, name, None, unit, integer)
        if value is not None:
            changes[field] = value
    if changes.get("max_message_mb", 1) == 0:
        raise ValueError("OPENENV_MAX_MESSAGE_MB must be more than 0 (it is the largest frame accepted)")
    return base.replace(**changes) if changes else base


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
