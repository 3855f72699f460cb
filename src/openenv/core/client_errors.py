"""Exceptions a client raises. All are ``RuntimeError``s, as OpenEnv 0.10's client raises, but
:class:`AuthenticationError`, a ``ConnectionError`` like every other failure to connect.

An error frame from the server becomes a :class:`ServerError` subclass chosen by its ``code``;
the exception keeps the code and the frame's other fields (``details``).
"""

from __future__ import annotations

import errno
import json
import socket
import ssl
from typing import Any, Dict, Optional, Type
from urllib.parse import urlsplit


class EnvClientError(RuntimeError):
    """Base of the client's exceptions."""


class ServerError(EnvClientError):
    """The server answered with an error frame. ``code`` is its ``WSErrorCode`` value."""

    code: str = ""

    def __init__(self, message: str, code: Optional[str] = None, details: Optional[Dict[str, Any]] = None) -> None:
        self.message = message
        if code is not None:
            self.code = code
        self.details = details or {}
        super().__init__(self._describe())

    def _describe(self) -> str:
        return f"Server error: {self.message} (code: {self.code})"

    def __reduce__(self) -> Any:  # pickles (e.g. across a process pool) with its fields
        return (type(self), (self.message, self.code, self.details))


class InvalidMessageError(ServerError):
    """The server could not read the frame (INVALID_JSON, UNKNOWN_TYPE, UNSUPPORTED_FRAME)."""


class MessageTooLargeError(ServerError):
    code = "MESSAGE_TOO_LARGE"


class ActionValidationError(ServerError):
    """The action (or the frame around it) did not validate; ``errors`` lists pydantic's errors."""

    code = "VALIDATION_ERROR"

    @property
    def errors(self) -> list:
        return list(self.details.get("errors", []))

    def _describe(self) -> str:
        """The message with the failing fields: ``...: message: Field required; count: Input should be a valid integer``."""
        problems = []
        for error in self.errors[:_SHOWN_ERRORS]:
            if not isinstance(error, dict):
                continue
            where = ".".join(str(part) for part in error.get("loc") or () if part not in ("body", "action"))
            problems.append(f"{where or 'action'}: {error.get('msg', error.get('type', 'invalid'))}")
        if len(self.errors) > _SHOWN_ERRORS:
            problems.append(f"{len(self.errors) - _SHOWN_ERRORS} more in .errors")
        text = super()._describe()
        return f"{text}: {'; '.join(problems)}" if problems else text


_SHOWN_ERRORS = 5


class EnvironmentExecutionError(ServerError):
    """The environment's own code raised while handling the request."""

    code = "EXECUTION_ERROR"


class CapacityReachedError(ServerError):
    """The server holds as many sessions as it may; try later or raise its ``max_concurrent_envs``."""

    code = "CAPACITY_REACHED"


class ServerBusyError(ServerError):
    """The server's budget of bytes in flight (``OPENENV_MAX_INFLIGHT_MB``) was spent when a large
    message arrived: nothing of it ran; send it again later (the WebSocket was closed, 1013)."""

    code = "SERVER_BUSY"


class EnvironmentFactoryFailedError(ServerError):
    code = "FACTORY_ERROR"


class SessionError(ServerError):
    code = "SESSION_ERROR"


class StepTimeoutError(ServerError, TimeoutError):
    """The server gave up on a call that ran past its step timeout; the episode must be reset."""

    code = "TIMEOUT"


class SnapshotRefusedError(ServerError):
    """The server would not load the snapshot given to ``restore``: changed, made with another
    key, of another environment or version, or too large (``details["reason"]`` says which).
    Nothing was loaded; the session is as it was."""

    code = "SNAPSHOT_REFUSED"


class NotSupportedError(ServerError):
    """The environment cannot do what was asked (save a snapshot, say); the message says why."""

    code = "NOT_SUPPORTED"


class ForbiddenError(ServerError):
    """The server knows the caller's credential, and its role may not do this (``details``:
    ``role``, and the roles that may, ``needed``); see docs/roles.md."""

    code = "FORBIDDEN"


_BY_CODE: Dict[str, Type[ServerError]] = {
    "INVALID_JSON": InvalidMessageError,
    "UNKNOWN_TYPE": InvalidMessageError,
    "UNSUPPORTED_FRAME": InvalidMessageError,
    "MESSAGE_TOO_LARGE": MessageTooLargeError,
    "VALIDATION_ERROR": ActionValidationError,
    "EXECUTION_ERROR": EnvironmentExecutionError,
    "CAPACITY_REACHED": CapacityReachedError,
    "SERVER_BUSY": ServerBusyError,
    "FACTORY_ERROR": EnvironmentFactoryFailedError,
    "SESSION_ERROR": SessionError,
    "TIMEOUT": StepTimeoutError,
    "SNAPSHOT_REFUSED": SnapshotRefusedError,
    "NOT_SUPPORTED": NotSupportedError,
    "FORBIDDEN": ForbiddenError,
}


def error_from_frame(data: Any) -> ServerError:
    """The exception for the ``data`` of an error frame."""
    if not isinstance(data, dict):
        return ServerError(str(data), "UNKNOWN")
    code = str(data.get("code", "UNKNOWN"))
    details = {k: v for k, v in data.items() if k not in ("message", "code")}
    return _BY_CODE.get(code, ServerError)(str(data.get("message", "")), code, details)


class SessionLostError(EnvClientError):
    """The connection carrying the episode was lost (timeout, server restart, network).

    The server's session is gone with it: call ``reset()`` to start a new episode on a new
    connection.
    """


class ServerStoppedError(SessionLostError):
    """The server closed the connection because it stopped on purpose (Ctrl-C on ``openenv
    serve``, its ASGI server shutting down): its sessions ended with it, so the client does not
    try to resume. ``reset()`` starts a new episode once a server runs there again."""


class AuthenticationError(ConnectionError):
    """The server refused the connection for want of a valid token (HTTP 401 or 403 during the
    WebSocket handshake). A ``ConnectionError``, as every failure to connect is; send the token
    with ``headers={"Authorization": "Bearer <token>"}``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.status))


def refused_credentials(exc: BaseException, where: str) -> Optional[AuthenticationError]:
    """An :class:`AuthenticationError` when ``exc`` (a WebSocket handshake's ``InvalidStatus`` or
    an httpx ``HTTPStatusError``) is a 401, or a 403 whose body says ``UNAUTHORIZED``; else None
    (a 403 is also what a WebSocket on a path with no route gets, token or not)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status not in (401, 403):
        return None
    body: Any = {}
    try:
        raw = getattr(response, "body", None)
        body = json.loads(raw if raw is not None else response.content)
    except Exception:
        pass
    if not isinstance(body, dict):
        body = {}
    if status == 403 and body.get("code") != "UNAUTHORIZED":
        return None
    detail = str(body.get("detail") or "")
    return AuthenticationError(
        f"{where} refused the connection (HTTP {status}{': ' + detail if detail else ''}); "
        "send the server's token with headers={'Authorization': 'Bearer <token>'}",
        status,
    )


def connect_failure(exc: BaseException, url: str, uds: Optional[str] = None, doing: str = "") -> ConnectionError:
    """The exception for a failed connection to ``url`` (through the Unix socket ``uds``) while
    ``doing`` something (a phrase for the message's start): an :class:`AuthenticationError` for a
    refused token, else a ``ConnectionError`` that says what happened in words a user can act on
    (nothing listening, a missing socket, a wrong path, a timeout)."""
    where = f"{url} (Unix socket {uds})" if uds else url
    refused = refused_credentials(exc, where)
    if refused is not None:
        return refused
    status = getattr(getattr(exc, "response", None), "status_code", None)
    cause = _errno_of(exc)
    unresolved = _cause_of(exc, socket.gaierror)
    tls = _cause_of(exc, ssl.SSLError)
    if unresolved is not None:
        host = urlsplit(url).hostname or url
        text = f"cannot resolve the host name {host!r} of {where} ({unresolved.strerror or unresolved}): check the URL"
    elif isinstance(tls, ssl.SSLCertVerificationError):
        text = f"the TLS certificate of {where} could not be verified ({tls.verify_message or tls.reason or tls})"
    elif tls is not None:
        why = str(tls.reason).lower().replace("_", " ") if tls.reason else str(tls)
        text = (
            f"the TLS handshake with {where} failed ({why}): if the server there speaks plain HTTP, "
            "use http:// (not https://)"
        )
    elif cause in (errno.ENOENT, errno.ENOTDIR) and uds:
        text = f"no server socket at {uds} (is the server running? is that its socket?)"
    elif cause in (errno.ECONNREFUSED, errno.ECONNRESET) or (cause is None and _says_refused(exc)):
        text = f"no server answers at {where} (is it running?)"
    elif status in (403, 404):
        text = (
            f"{where} answered HTTP {status}: the server has no such route; check the URL's path "
            "(give the server's base URL, without /ws or /mcp)"
        )
    elif isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower():
        text = f"{where} did not complete the connection in time (a busy or stalled server, or a firewall)"
    else:
        text = f"failed to connect to {where}: {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
    text = f"{doing}: {text}" if doing else text
    if not text.startswith(where):  # (a sentence, not a URL, starts with a capital)
        text = text[:1].upper() + text[1:]
    return ConnectionError(text)


def permanent_connect_failure(exc: BaseException) -> bool:
    """Whether a failed connection attempt would fail again at once if retried: no server
    listening (refused, no socket file), a host name that does not resolve, a TLS mismatch or
    certificate failure. Waiting changes none of these; a name server that does not answer
    (``EAI_AGAIN``), a connection reset or cut short, a timeout may pass."""
    if _cause_of(exc, (ConnectionRefusedError, FileNotFoundError, ssl.SSLError)) is not None:
        return True
    unresolved = _cause_of(exc, socket.gaierror)
    return unresolved is not None and unresolved.errno != socket.EAI_AGAIN


def _cause_of(exc: BaseException, kinds: Any) -> Any:
    """``exc`` or the first exception it was raised from (or during) that is one of ``kinds``."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, kinds):
            return exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return None


def _errno_of(exc: BaseException) -> Optional[int]:
    """The errno of ``exc`` or of the OSError it was raised from (httpx wraps them)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc.errno
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return None


def _says_refused(exc: BaseException) -> bool:
    # httpx's ConnectError over anyio: "All connection attempts failed", the OSError not chained
    return type(exc).__name__ == "ConnectError" and "All connection attempts failed" in str(exc)


class ToolCallError(EnvClientError):
    """An MCP tool call failed; ``code`` is the JSON-RPC error code."""

    def __init__(self, tool_name: str, message: str, code: Optional[int] = None, data: Any = None) -> None:
        self.tool_name = tool_name
        self.message = message
        self.code = code
        self.data = data
        super().__init__(f"Tool '{tool_name}' failed: {message}")

    def __reduce__(self) -> Any:
        return (type(self), (self.tool_name, self.message, self.code, self.data))
