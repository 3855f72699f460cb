"""A session's trajectory: what happened in it since its last reset, for the grader.

The session manager keeps one :class:`Trajectory` per session (where recording is on, see
``OPENENV_MAX_TRAJECTORY_STEPS`` in :mod:`.settings`) and adds an entry for each reset, step and
tool call that ran on the session's environment (a failing one with its error), whichever
transport it came through and whoever made it: the orchestrator, the session's agent, a grader
calling the environment's grader-only tools. A call the roles refuse never reaches the environment
and is not recorded (the audit log has it). A reset empties the record and becomes its first
entry; a restore likewise (the restored session's record starts there).

Recording costs next to nothing per step: an entry holds references to the objects the call
already had (the validated action, the observation the environment returned, the tool's result)
and a timestamp, appended to a bounded deque; nothing is copied or serialised until someone asks
(:meth:`Trajectory.rows`, then :func:`render` in a worker thread). The price of that: an
environment that changes an observation object after returning it (none of ours does; the
transports serialise it at once) changes its recorded entry too; and the objects stay in memory
until the session's next reset (or until they are the oldest past the bound).

The bound (``max_entries``) keeps the **latest** entries and counts the ones dropped
(``truncated``): a long episode is never refused a step for recording's sake, and the steps a
grader checks are the ones that led to the outcome, at its end. Indexes keep counting from the
reset, so a partial record says where it starts.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

from .serialization import serialize_observation, to_jsonable
from .types import Observation

RESET, STEP, TOOL, RESTORE = "reset", "step", "tools/call", "restore"
"""The kinds of entry (the session manager's names of the operations)."""

_KIND_NAMES = {RESET: "reset", STEP: "step", TOOL: "tool", RESTORE: "restore"}

Row = Tuple[int, str, float, Any, Any, Optional[BaseException]]
"""One entry as kept: index, kind, time, what was asked, what came back, what was raised."""


class Trajectory:
    """The entries of one session since its last reset, the latest ``max_entries`` of them."""

    __slots__ = ("_entries", "count")

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("a trajectory keeps at least one entry")
        self._entries: Deque[Row] = collections.deque(maxlen=max_entries)
        self.count = 0
        """Entries added since the last reset, kept or dropped."""

    def add(self, kind: str, asked: Any, answer: Any, raised: Optional[BaseException] = None) -> None:
        """Record one call: ``kind`` (:data:`STEP`...), what it asked (the action, the reset's
        keywords, a tool's name and arguments), its answer, or the exception it raised. A
        reset or restore that succeeded starts the record afresh (a failed one is added to it:
        no new episode began)."""
        if (kind == RESET or kind == RESTORE) and raised is None:
            self._entries.clear()
            self.count = 0
        self._entries.append((self.count, kind, time.time(), asked, answer, raised))
        self.count += 1

    @property
    def truncated(self) -> int:
        """How many of the oldest entries since the reset were dropped for the bound."""
        return self.count - len(self._entries)

    def rows(self) -> Tuple[List[Row], int]:
        """The entries kept, and how many were dropped (cheap: a list of references, to render
        elsewhere with :func:`render`)."""
        return list(self._entries), self.truncated


def render(rows: List[Row], truncated: int) -> Dict[str, Any]:
    """The trajectory as JSON-ready data: ``{"entries": [...], "truncated": n}``. Each entry has
    ``index``, ``kind`` (``reset``, ``step``, ``tool``, ``restore``) and ``time`` (seconds since
    the epoch); a reset has ``action`` (its keywords), a step its ``action``, and both
    ``observation``, ``reward`` and ``done``; a tool call has ``tool``, ``arguments`` and
    ``result``; a call that failed has ``error`` instead of its answer. An entry that cannot be
    rendered says so in ``error`` rather than fail the whole answer."""
    return {"entries": [_entry(row) for row in rows], "truncated": truncated}


def _entry(row: Row) -> Dict[str, Any]:
    index, kind, at, asked, answer, raised = row
    entry: Dict[str, Any] = {"index": index, "kind": _KIND_NAMES.get(kind, kind), "time": at}
    try:
        if kind == TOOL:
            name, arguments = asked
            entry["tool"] = name
            entry["arguments"] = to_jsonable(arguments)
        elif kind != RESTORE:
            entry["action"] = to_jsonable(asked.model_dump() if hasattr(asked, "model_dump") else asked)
        if raised is not None:
            entry["error"] = _error_text(raised)
        elif kind == TOOL:
            entry["result"] = to_jsonable(answer)
        elif isinstance(answer, Observation):
            payload = serialize_observation(answer)
            entry["observation"] = to_jsonable(payload["observation"])
            entry["reward"] = to_jsonable(payload["reward"])
            entry["done"] = bool(payload["done"])
        elif kind != RESTORE:
            entry["observation"] = to_jsonable(answer)
    except Exception as exc:  # one odd value must not cost the grader the rest
        entry["error"] = f"this entry could not be rendered as JSON ({type(exc).__name__}: {exc})"
    return entry


def _error_text(exc: BaseException) -> str:
    error = getattr(exc, "error", None)  # a ToolCallFailed: its ToolError
    message = getattr(error, "message", None)
    if message is not None:
        return f"{getattr(getattr(error, 'error_type', None), 'value', 'error')}: {message}"
    text = getattr(exc, "text", None) or str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
