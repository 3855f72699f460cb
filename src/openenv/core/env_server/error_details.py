"""How much an error answer tells the client about an exception the environment raised.

An unexpected exception in the environment's code (``reset``, ``step``, ``state``, a Task API
method, an MCP request that is not a tool call, opening a session) is answered with
``EXECUTION_ERROR`` / ``SESSION_ERROR`` frames, an HTTP 500 or a JSON-RPC error. Upstream puts
the exception's text in every such answer, to anyone who can reach the server (spec §14.19):
paths, hostnames, pieces of configuration. Here the answer depends on who asked:

* a client on this machine gets the text: a trainer debugging its own environment needs it.
  That is a loopback peer, no peer at all (a Unix socket, where uvicorn names none) or
  Starlette's in-process ``TestClient``, and every address a proxy says it forwards for
  (``X-Forwarded-For``, ``Forwarded``, ``X-Real-IP``) loopback too;
* any other client gets the exception's type and an incident id. The text (and, for what is not
  a client's mistake, the traceback: see :func:`describe`) is in the server's log, under that id,
  for every client.

``$OPENENV_ERROR_DETAILS`` (``1``/``0``, or ``auto`` for the rule above) or, when it is not set,
``create_app(..., error_details=True|False)`` fixes the choice for every client (see :mod:`.settings`). A reverse proxy
on this machine must send ``X-Forwarded-For`` (or ``Forwarded``), or every client looks local.
Trusting every proxy (uvicorn's ``--forwarded-allow-ips='*'``) lets any client name itself
127.0.0.1.

Not covered, on purpose: a tool's failure is the tool's answer to the agent and is worded by
FastMCP, whose own ``mask_error_details`` hides the text; messages OpenEnv writes itself
(timeouts, capacity, invalid input, unknown sessions) carry no environment internals.
"""

from __future__ import annotations

import contextvars
import logging
import secrets
import traceback
from typing import Any, Dict, Iterator, Optional

from ..utils import is_loopback_ip  # a name ("unknown", an obfuscated one) is not known to be here
from .exceptions import EnvironmentCallError, OpenEnvError

# Set for each HTTP request and WebSocket connection by the app's outermost middleware. Unset (a
# worker thread, which does not inherit the request's context; an environment used directly),
# nothing tells who will read the answer: the text stays in the log.
_shown: contextvars.ContextVar[bool] = contextvars.ContextVar("openenv_error_details", default=False)


def peer_is_local(scope: Dict[str, Any]) -> bool:
    """Whether the ASGI ``scope``'s client is on this machine: its address (uvicorn names no peer
    on a Unix socket) and every address a proxy says it forwards for (``X-Forwarded-For``,
    ``Forwarded``, ``X-Real-IP``; uvicorn rewrites the peer only for proxies it trusts, but a
    proxy in front of a Unix socket or on another loopback address still sends them)."""
    client = scope.get("client")
    if client and client[0] != "testclient" and not is_loopback_ip(client[0]):  # TestClient: in-process
        return False
    for name, value in scope.get("headers", ()):
        if name in _FORWARDING:
            for host in _forwarded_hosts(name, value.decode("latin-1")):
                if not is_loopback_ip(host):
                    return False
    return True


_FORWARDING = frozenset({b"x-forwarded-for", b"forwarded", b"x-real-ip"})


def _forwarded_hosts(name: bytes, value: str) -> Iterator[str]:
    for element in value.split(","):
        if name != b"forwarded":
            yield element.strip()
            continue
        for pair in element.split(";"):  # RFC 7239: for="[2001:db8::1]:4711";proto=https
            key, _, host = pair.partition("=")
            if key.strip().lower() == "for":
                host = host.strip().strip('"')
                if host.startswith("["):
                    host = host[1:].partition("]")[0]
                elif host.count(":") == 1:
                    host = host.partition(":")[0]
                yield host


def enter(scope: Dict[str, Any], choice: Optional[bool]) -> contextvars.Token:
    """Decide for the request or connection of ``scope``; undo with :func:`leave`."""
    return _shown.set(peer_is_local(scope) if choice is None else choice)


def leave(token: contextvars.Token) -> None:
    _shown.reset(token)


def exception_name(exc: BaseException) -> str:
    """The type name an answer gives for ``exc`` (the original's, for an EnvironmentCallError)."""
    return exc.name if isinstance(exc, EnvironmentCallError) else type(exc).__name__


def describe(exc: BaseException, log: logging.Logger, what: str) -> str:
    """Log ``exc`` as ``what`` under an incident id, and return the text the current client is to
    be sent: the exception's own text, or its type and the incident id.

    How it is logged depends on whose mistake it is. OpenEnv's own exceptions (capacity, sessions,
    timeouts, a result of the wrong kind: one of :mod:`.exceptions`' classes itself, not an
    environment's subclass) say nothing of the environment's internals: they are sent as they are
    and logged in one line. A ``ValueError`` the environment raised is the client's mistake (a value
    it sent: an unknown game id, an action outside the action space, an illegal move; the catalogue
    and Python itself use it so): one warning line with the text and where it was raised, the
    traceback too only while the logger is enabled for DEBUG. Anything else is a bug of the
    environment (or of the server): an error with its traceback."""
    if isinstance(exc, OpenEnvError) and type(exc).__module__ == OpenEnvError.__module__:
        log.warning("%s: %s", what, exc)
        return str(exc)
    name = exception_name(exc)
    incident = secrets.token_hex(4)
    if isinstance(exc, ValueError):
        # The server is fine and the client is told why: a traceback per bad call would bury the
        # server's real problems.
        text = " ".join(str(exc).split())  # one line, whatever the message holds
        log.warning(
            "%s (incident %s): %s: %s (raised at %s; the client's mistake: no traceback)",
            what,
            incident,
            name,
            text,
            _raised_at(exc),
            exc_info=exc if log.isEnabledFor(logging.DEBUG) else None,
        )
    else:
        log.error("%s (incident %s)", what, incident, exc_info=exc)
    if _shown.get():
        return str(exc) or name
    return f"{name} raised in the environment; details are in the server's log (incident {incident})"


def _raised_at(exc: BaseException) -> str:
    """``file:line in function`` of the frame that raised ``exc`` (to find it without a traceback)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"
