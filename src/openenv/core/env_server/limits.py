"""The server's budget of bytes in flight, and its limits (:class:`~.settings.ServerLimits`: the
table of :mod:`.settings` says what each bounds)."""

from __future__ import annotations

from typing import Optional

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
