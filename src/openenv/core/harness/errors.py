"""Errors of an external agent harness (upstream's names: ``openenv.core.harness``).

One family, so that a caller driving a harness catches :class:`HarnessError` and tells the cases
apart by type: the harness never came up, it is gone, or one turn took too long.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Something went wrong with an agent harness (its process, its protocol, its bridge)."""


class HarnessStartupError(HarnessError):
    """The harness could not be started: spawn failure, early exit, or no ready line in time.

    The process is stopped before this is raised; the message carries the reason and, where there
    is one, the tail of its stderr."""


class HarnessNotRunningError(HarnessError):
    """The harness is not running (never started, stopped, or exited) when it was needed."""


class HarnessTurnTimeoutError(HarnessError):
    """One turn of the harness did not complete within its time limit."""


__all__ = ["HarnessError", "HarnessNotRunningError", "HarnessStartupError", "HarnessTurnTimeoutError"]
