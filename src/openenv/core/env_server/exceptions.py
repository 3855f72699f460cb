"""Server-side exceptions, and the one table of how each is answered.

Every OpenEnv error type carries an :class:`ErrorKind` (the table below): its ``/ws`` error code,
its HTTP status, its JSON-RPC code, and the close code of a WebSocket it ends before the socket's
session exists. :func:`kind_of` gives any exception's kind. What reads it:

* ``/ws`` error frames: :func:`.serialization.error_frame_of` (the handler's, and those the
  transport guard of :mod:`._compat.uvicorn` writes itself);
* HTTP errors, ``{"detail", "code"}``: :func:`.edges.middleware.http_error` (the routes' and the
  playground's), and :func:`.edges.middleware.refuse` for a request the edges refuse before any
  route sees it (too large, the server busy, invalid JSON: a JSON-RPC error on ``/mcp``). The
  Task API's refusals (:class:`TaskRefusedError`) answer ``{"detail"}`` alone, as upstream's do;
* JSON-RPC errors: :func:`.transports.mcp.rpc_error` (``POST /mcp`` and ``WS /mcp``);
* a WebSocket: a resume refused is answered on the handshake with the kind's HTTP status; a
  session that cannot be opened gets its error (a frame, or a JSON-RPC error on ``WS /mcp``) and
  the kind's close code.

``details()`` are the extra fields an answer carries (``timeout_s``, ``max_sessions``, ...): in the
``/ws`` frame's ``data`` and the JSON-RPC error's ``data``; an HTTP error carries ``detail`` and
``code`` only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, Optional


@dataclasses.dataclass(frozen=True)
class ErrorKind:
    """How one kind of error is answered on each transport."""

    ws_code: str
    http_status: int
    rpc_code: int
    close_code: int = 1011


# The table: each kind, and the errors answered by it.
EXECUTION = ErrorKind("EXECUTION_ERROR", 500, -32603)  # an environment's own exception; EnvironmentResultError
VALIDATION = ErrorKind("VALIDATION_ERROR", 422, -32602, 1008)  # pydantic's ValidationError
CAPACITY = ErrorKind("CAPACITY_REACHED", 503, -32000, 1013)  # SessionCapacityError
FACTORY = ErrorKind("FACTORY_ERROR", 500, -32000)  # EnvironmentFactoryError
TIMEOUT = ErrorKind("TIMEOUT", 504, -32603)  # StepTimeoutError, WorkersStuckError
SESSION_UNKNOWN = ErrorKind("SESSION_ERROR", 404, -32602, 1008)  # SessionNotFoundError
SESSION_CONFLICT = ErrorKind("SESSION_ERROR", 409, -32600, 1008)  # SessionCreationError, StaleCallError
RESUME_REFUSED = ErrorKind("SESSION_ERROR", 403, -32600, 1008)  # ResumeRefusedError
BAD_SEQUENCE = ErrorKind("VALIDATION_ERROR", 400, -32602)  # InvalidSequenceError
TOO_LARGE = ErrorKind("MESSAGE_TOO_LARGE", 413, -32600, 1009)  # MessageTooLargeError
BUSY = ErrorKind("SERVER_BUSY", 503, -32000, 1013)  # ServerBusyError
INVALID_JSON = ErrorKind("INVALID_JSON", 400, -32700, 1007)  # InvalidJsonError
MISCONFIGURED = ErrorKind("EXECUTION_ERROR", 500, -32000)  # ConcurrencyConfigurationError
UNSUPPORTED = ErrorKind("EXECUTION_ERROR", 500, -32603)  # NoMCPError: in its own words, unlike EXECUTION
SNAPSHOT_REFUSED = ErrorKind("SNAPSHOT_REFUSED", 400, -32602, 1008)  # SnapshotRefusedError
SNAPSHOT_TOO_LARGE = ErrorKind("SNAPSHOT_REFUSED", 413, -32600, 1009)  # SnapshotRefusedError (size)
NOT_SUPPORTED = ErrorKind("NOT_SUPPORTED", 501, -32601)  # SnapshotUnsupportedError
TASK_REFUSED = {  # TaskRefusedError, by its HTTP status (the Task API answers only over HTTP)
    status: ErrorKind(code, status, rpc)
    for status, code, rpc in (
        (400, "VALIDATION_ERROR", -32602),
        (404, "NOT_FOUND", -32601),
        (501, "NOT_SUPPORTED", -32601),
    )
}


class OpenEnvError(Exception):
    """Base of OpenEnv's server-side exceptions; ``kind`` says how each transport answers it."""

    kind: ClassVar[ErrorKind] = EXECUTION

    def __init__(self, message: str = "", *args: Any) -> None:
        self.message = message
        super().__init__(message, *args)

    @property
    def text(self) -> str:
        """The answer's message."""
        return getattr(self, "message", None) or str(self)

    def details(self) -> Dict[str, Any]:
        """Extra fields of the answer."""
        return {}


def kind_of(exc: BaseException) -> ErrorKind:
    """The :class:`ErrorKind` of any exception: an OpenEnv error's own, a pydantic validation
    error's, else an execution error's."""
    if isinstance(exc, OpenEnvError):
        return exc.kind
    import pydantic

    if isinstance(exc, pydantic.ValidationError):
        return VALIDATION
    return EXECUTION


class MessageTooLargeError(OpenEnvError):
    """A frame or request body over the server's message limit."""

    kind = TOO_LARGE

    def __init__(self, size: Optional[int], limit: int, unit: str = "bytes") -> None:
        self.limit = limit
        shown = "Message" if size is None else f"Message of {size} {unit}"
        super().__init__(f"{shown} exceeds the server's limit of {limit} {unit} (OPENENV_MAX_MESSAGE_MB)")

    def details(self) -> Dict[str, Any]:
        return {"limit": self.limit}


class ServerBusyError(OpenEnvError):
    """The server's budget of bytes in flight is spent (see :mod:`.limits`): retry shortly."""

    kind = BUSY


class InvalidJsonError(OpenEnvError):
    """A message that is not JSON (or nested too deeply)."""

    kind = INVALID_JSON

    def __init__(self, reason: str) -> None:
        super().__init__(f"Invalid JSON: {reason}")


class ConcurrencyConfigurationError(OpenEnvError):
    """More than one session was asked of an environment that does not support it."""

    kind = MISCONFIGURED

    def __init__(self, environment_name: str, max_concurrent_envs: int, message: Optional[str] = None) -> None:
        self.environment_name = environment_name
        self.max_concurrent_envs = max_concurrent_envs
        if message is None:
            message = (
                f"Environment '{environment_name}' is not marked as safe for concurrent sessions "
                f"(SUPPORTS_CONCURRENT_SESSIONS = False), but max_concurrent_envs={max_concurrent_envs}. "
                "Set SUPPORTS_CONCURRENT_SESSIONS = True on the class if its instances share no "
                "state, or use max_concurrent_envs=1."
            )
        super().__init__(message)


class SessionCapacityError(OpenEnvError):
    """The server already holds as many sessions as it may."""

    kind = CAPACITY

    def __init__(self, active_sessions: int, max_sessions: int, message: Optional[str] = None) -> None:
        self.active_sessions = active_sessions
        self.max_sessions = max_sessions
        if message is None:
            message = (
                f"Server at capacity: {active_sessions}/{max_sessions} sessions active. Cannot accept new connections."
            )
        super().__init__(message)

    def details(self) -> Dict[str, Any]:
        return {"active_sessions": self.active_sessions, "max_sessions": self.max_sessions}


class SessionNotFoundError(OpenEnvError):
    kind = SESSION_UNKNOWN

    def __init__(self, session_id: str, message: Optional[str] = None) -> None:
        self.session_id = session_id
        super().__init__(message or f"Unknown session_id: {session_id}")


class SessionCreationError(OpenEnvError):
    kind = SESSION_CONFLICT

    def __init__(self, reason: str, message: Optional[str] = None) -> None:
        self.reason = reason
        super().__init__(message or f"Failed to create session: {reason}")


class ResumeRefusedError(OpenEnvError):
    """A resume of a ``/ws`` session with a token that is not the session's (see :mod:`.resume`):
    refused, and the session is left as it was."""

    kind = RESUME_REFUSED

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"Session {session_id} cannot be resumed with this resume token (only the client it was "
            "given to can resume it); open a new connection to start a new session"
        )


class InvalidSequenceError(OpenEnvError):
    """A call number (``"seq"``, ``X-OpenEnv-Seq``) that is not a whole number of at least 1."""

    kind = BAD_SEQUENCE

    def __init__(self, seq: Any) -> None:
        super().__init__(f"A call's sequence number must be a whole number of at least 1, got {seq!r}")


class StaleCallError(OpenEnvError):
    """A call whose sequence number is below the session's last one (see :mod:`.resume`)."""

    kind = SESSION_CONFLICT

    def __init__(self, seq: int, last: int) -> None:
        self.seq = seq
        self.last = last
        super().__init__(
            f"Call number {seq} is older than this session's last call ({last}); its answer is no longer kept"
        )

    def details(self) -> Dict[str, Any]:
        return {"seq": self.seq, "last_seq": self.last}


class EnvironmentFactoryError(OpenEnvError):
    """The environment factory raised while building a session's environment."""

    kind = FACTORY

    def __init__(self, factory_name: str, message: Optional[str] = None) -> None:
        self.factory_name = factory_name
        super().__init__(message or f"Environment factory '{factory_name}' failed to create instance.")

    def details(self) -> Dict[str, Any]:
        return {"factory_name": self.factory_name}


class StepTimeoutError(OpenEnvError, TimeoutError):
    """An environment call ran past the server's step timeout."""

    kind = TIMEOUT

    def __init__(self, operation: str, timeout_s: float) -> None:
        self.operation = operation
        self.timeout_s = timeout_s
        super().__init__(
            f"{operation} did not finish within the server's step timeout of {timeout_s:g} s; "
            "the environment instance was discarded: call reset() to start a new episode"
        )

    def details(self) -> Dict[str, Any]:
        return {"timeout_s": self.timeout_s}


class WorkersStuckError(StepTimeoutError):
    """A call was not started: no worker thread came free for it. Either it waited past the step
    timeout (``waited``), or every thread the pool may use is stuck in an earlier call that was
    given up on (past the step timeout, or its client left) and too many calls already wait, so it
    is refused at once rather than queued. Answered like a timeout; the environment is untouched.
    With no step timeout, a call waits for a worker as long as it takes (up to that queue bound)."""

    def __init__(self, operation: str, timeout_s: Optional[float], stuck: int, waited: bool = False) -> None:
        self.operation = operation
        self.timeout_s = timeout_s  # type: ignore[assignment]
        self.stuck = stuck
        if waited:
            detail = f"no worker thread came free within the step timeout of {timeout_s:g} s"
        else:
            detail = "every worker thread is stuck in an earlier call that was given up on, and others already wait"
        OpenEnvError.__init__(  # not StepTimeoutError's, which words a timeout
            self,
            f"{operation} was not started: {detail} ({stuck} stuck; does the environment hang?); "
            "the environment was not touched: try again later",
        )


class TaskRefusedError(OpenEnvError):
    """A Task API call this server cannot answer: an environment it does not serve (404), a
    method the environment lacks (501), a task index out of range (400). Answered
    ``{"detail": ...}`` as upstream answers them."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.kind = TASK_REFUSED[status]  # type: ignore[misc]


class NoMCPError(OpenEnvError):
    """A tools call to an environment that takes no MCP calls."""

    kind = UNSUPPORTED


class SnapshotRefusedError(OpenEnvError):
    """A snapshot given to restore that this server will not load: not one a server with this
    server's key made, or made of another environment or version, or over the size limit.
    Nothing of it was loaded; the session is as it was. ``reason`` is one of ``"forged"``,
    ``"environment"``, ``"version"``, ``"too_large"``, ``"malformed"``."""

    kind = SNAPSHOT_REFUSED

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        if reason == "too_large":
            self.kind = SNAPSHOT_TOO_LARGE  # type: ignore[misc]
        super().__init__(message)

    def details(self) -> Dict[str, Any]:
        return {"reason": self.reason}


class SnapshotUnsupportedError(OpenEnvError):
    """The environment cannot save its session (its class does not say ``SUPPORTS_SNAPSHOT``, or
    its state holds what a snapshot cannot carry: the message names the attribute). An
    environment's ``snapshot_state`` raises it, with the reason, for a session it cannot save
    exactly."""

    kind = NOT_SUPPORTED


class EnvironmentResultError(OpenEnvError, TypeError):
    """An environment method returned a value of the wrong kind for its route (a Task API
    method's list or count, say): answered as an execution error, in OpenEnv's own words."""


class EnvironmentCallError(RuntimeError):
    """A call in the pool raised what an awaiting coroutine cannot be handed as it is:
    ``StopIteration`` (a future refuses it) or a ``BaseException`` that is not an ``Exception``
    (``SystemExit`` from a library calling ``sys.exit()``, say, which would stop the event loop);
    also a pydantic ``ValidationError`` raised inside the environment (a bad observation, say),
    which would otherwise be reported as the client's invalid input. ``name`` is the original
    exception's type name; it is also ``__cause__``."""

    def __init__(self, original: BaseException) -> None:
        self.name = type(original).__name__
        detail = str(original)
        super().__init__(f"{self.name} raised by the call" + (f": {detail}" if detail else ""))
        self.__cause__ = original
