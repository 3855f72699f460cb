"""How much an error answer tells the client about an exception the environment raised.

An unexpected exception in the environment's code (``reset``, ``step``, ``state``, a Task API
method, an MCP request that is not a tool call, opening a session) is answered with
``EXECUTION_ERROR`` / ``SESSION_ERROR`` frames, an HTTP 500 or a JSON-RPC error. Upstream puts
the exception's text in every such answer, to anyone who can reach the server (spec §14.19):
paths, hostnames, pieces of configuration. Here the answer depends on who asked:

* a client on this machine (a loopback address, a Unix socket, Starlette's in-process
  ``TestClient``) gets the text: a trainer debugging its own environment needs it;
* any other client gets the exception's type and an incident id. The text and the traceback
  are in the server's log, under that id, for every client.

``create_app(..., error_details=True|False)`` or ``$OPENENV_ERROR_DETAILS`` (``1``/``0``; ``auto``
is the default above) fixes the choice for every client. Behind a reverse proxy on the same
host every client would look local unless the proxy sends ``X-Forwarded-For`` (uvicorn reads it
from proxies in ``--forwarded-allow-ips``, 127.0.0.1 by default).

Not covered, on purpose: a tool's failure is the tool's answer to the agent and is worded by
FastMCP, whose own ``mask_error_details`` hides the text; messages OpenEnv writes itself
(timeouts, capacity, invalid input, unknown sessions) carry no environment internals.
"""

from __future__ import annotations

import contextvars
import ipaddress
import logging
import os
import secrets
from typing import Any, Dict, Optional

from .exceptions import EnvironmentCallError

ENV_VAR = "OPENENV_ERROR_DETAILS"

# Set for each HTTP request and WebSocket connection by the app's outermost middleware; nothing
# set (an answer built outside a request) says nothing.
_shown: contextvars.ContextVar[bool] = contextvars.ContextVar("openenv_error_details", default=False)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def configured(value: Optional[bool]) -> Optional[bool]:
    """The server's choice: ``value``, else ``$OPENENV_ERROR_DETAILS``; None leaves it to each client's address."""
    if value is not None:
        if not isinstance(value, bool):
            raise TypeError(f"error_details must be True, False or None, got {value!r}")
        return value
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{ENV_VAR} must be 1, 0 or auto, got {raw!r}")


def peer_is_local(scope: Dict[str, Any]) -> bool:
    """Whether the ASGI ``scope``'s client is on this machine."""
    client = scope.get("client")
    if not client:
        return True  # a Unix socket: uvicorn names no peer
    host = client[0]
    if host == "testclient":  # Starlette's TestClient calls the app in-process
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def enter(scope: Dict[str, Any], choice: Optional[bool]) -> contextvars.Token:
    """Decide for the request or connection of ``scope``; undo with :func:`leave`."""
    return _shown.set(peer_is_local(scope) if choice is None else choice)


def leave(token: contextvars.Token) -> None:
    _shown.reset(token)


def describe(exc: BaseException, log: logging.Logger, what: str) -> str:
    """Log ``exc`` (with its traceback and an incident id) as ``what``, and return the text the
    current client is to be sent: the exception's own text, or its type and the incident id."""
    name = exc.name if isinstance(exc, EnvironmentCallError) else type(exc).__name__
    incident = secrets.token_hex(4)
    log.error("%s (incident %s)", what, incident, exc_info=exc)
    if _shown.get():
        return str(exc) or name
    return f"{name} raised in the environment; details are in the server's log (incident {incident})"
