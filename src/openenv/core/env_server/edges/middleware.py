"""The edges around the server's core: small ASGI middlewares that ``create_app`` composes.

From the outside in (see :meth:`..http_server.HTTPEnvServer.register_routes`): :class:`TransportLimits`
(the runner's limits on a server started otherwise), :class:`ErrorDetailsScope`
(:mod:`..error_details`), :class:`SameOrigin` (other sites' pages), :class:`BearerAuth` (:mod:`.auth`), :class:`..transports.ws.WebSocketRoutes` (which
serves ``/ws`` itself) and :class:`BodyLimits`, which bounds HTTP request bodies before any route
reads them. Each answers what it refuses by the error table of :mod:`..exceptions` (JSON-RPC errors on
``/mcp``, ``{"detail", "code"}`` elsewhere) and passes everything else through untouched.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Any, Dict, Optional, Tuple

from starlette.responses import JSONResponse, Response

from .. import error_details, roles
from .._compat import uvicorn as uvicorn_compat
from ..exceptions import (
    EXECUTION,
    VALIDATION,
    InvalidJsonError,
    MessageTooLargeError,
    OpenEnvError,
    ServerBusyError,
    kind_of,
)
from ..limits import BUDGET_EXEMPT_BYTES, InFlightBudget
from ..mcp_types import JsonRpcResponse
from ..serialization import MAX_JSON_DEPTH, parse_json, to_json_bytes
from . import auth

logger = logging.getLogger("openenv.server")

RPC_ROUTES = frozenset({"/mcp"})
"""Routes that answer in JSON-RPC (and parse their body, depth-checked, themselves)."""

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_SAFE_METHODS = frozenset({"GET", "HEAD"})


def route_path(scope: Dict[str, Any]) -> str:
    """The request's path below the app's ``root_path``."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class ErrorDetailsScope:
    """Sets, for each request and connection, whether error answers carry exception text."""

    def __init__(self, app: Any, choice: Optional[bool]) -> None:
        self.app = app
        self.choice = choice

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        token = error_details.enter(scope, self.choice)
        try:
            await self.app(scope, receive, send)
        finally:
            error_details.leave(token)


class TransportLimits:
    """Puts the server's limits on its transport when the app was not served through OpenEnv's
    runner: at the start of its lifespan, :func:`.._compat.uvicorn.adopt` sets up the uvicorn that
    serves it (its command line, ``uvicorn.run``, a gunicorn worker) as the runner would, or warns
    naming what is missing and the command that has it. With the lifespan off, the first request
    that arrives on a connection without OpenEnv's guard gets the warning instead. The outermost
    middleware; after its first message, a flag's test per request."""

    def __init__(self, app: Any, limits: Any, budget: Optional[InFlightBudget]) -> None:
        self.app = app
        self.limits = limits
        self.budget = budget
        self.checked = False

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if not self.checked:
            self.checked = True
            if scope["type"] == "lifespan":
                uvicorn_compat.adopt(self.limits, self.budget)
            elif (
                (self.limits.header_timeout_s or self.limits.max_connections_per_client)
                and not uvicorn_compat.guarded_connection()
                and uvicorn_compat.serving()[0] == "uvicorn"
            ):
                uvicorn_compat.warn_unguarded("uvicorn (its lifespan off)")
        await self.app(scope, receive, send)


class SameOrigin:
    """Refuses (403) a WebSocket handshake, and an HTTP request other than a ``GET`` or ``HEAD``,
    that a browser sends for a page of another site, or for a page of a name this server is not
    known by.

    Browsers let any page open a WebSocket to any address (there is no CORS for WebSockets) and
    POST a ``text/plain`` body anywhere; a page a developer visits could otherwise drive a server
    on their ``127.0.0.1`` that has no token: step its environment, call its tools (some run
    code). A browser always says who asks (``Origin``); a page of the server's own origin (``Host``,
    or ``X-Forwarded-Host`` behind a proxy: a page cannot set either) and those of ``allowed``
    (``OPENENV_ALLOWED_ORIGINS``, ``*``: any) may.

    "The server's own origin" is only as good as the name in ``Host``: a page of a name whose DNS
    answer its owner changes to 127.0.0.1 after the page loaded (DNS rebinding) is, to the
    browser, of the same origin as the server it then reaches. So a browser's request must also
    name this server by a name it is known by (:func:`known_host`): ``localhost``, an IP address
    (rebinding needs a name), one of ``hosts`` (``OPENENV_ALLOWED_HOSTS``; a Space's
    ``SPACE_HOST``). Clients that are not browsers send no ``Origin`` and are not affected: a
    trainer may reach a server by any name (a container's service name, say)."""

    def __init__(self, app: Any, allowed: Tuple[str, ...], hosts: Tuple[str, ...] = ()) -> None:
        self.app = app
        self.allowed = frozenset(allowed)
        self.hosts = frozenset(hosts)

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan" or (kind == "http" and scope.get("method") in _SAFE_METHODS):
            await self.app(scope, receive, send)
            return
        origin, hosts = None, []
        for name, value in scope.get("headers", ()):
            if name == b"origin":
                origin = value.decode("latin-1").strip().lower()
            elif name in (b"host", b"x-forwarded-host"):
                hosts.append(value.decode("latin-1").split(",")[0].strip().lower())
        if origin is None:  # not a browser
            await self.app(scope, receive, send)
            return
        unknown = next((host for host in hosts if not known_host(host, self.hosts)), None)
        if unknown is not None:
            content = {
                "detail": f"a browser reached this server by the name {unknown!r}, which it is not known by "
                "(a page whose name was turned to this machine: DNS rebinding); name it in OPENENV_ALLOWED_HOSTS "
                "to serve browsers by that name",
                "code": "FORBIDDEN_HOST",
            }
        elif "*" in self.allowed or origin in self.allowed or origin.partition("://")[2] in hosts:
            await self.app(scope, receive, send)
            return
        else:
            content = {
                "detail": f"a page of another site ({origin}) may not use this server; "
                "allow its origin with OPENENV_ALLOWED_ORIGINS",
                "code": "FORBIDDEN_ORIGIN",
            }
        if kind == "http":
            await _respond(send, "http", 403, content, (b"connection", b"close"))
        else:
            await refuse_handshake(receive, send, scope, 403, content)


def known_host(host: str, allowed: frozenset = frozenset()) -> bool:
    """Whether a ``Host`` header's value (``name[:port]``, ``[v6]:port``) names this server by a
    name no one else can point at it: ``localhost``, an IP address, or one of ``allowed``
    (``OPENENV_ALLOWED_HOSTS``: exact names, ``.example.org`` for it and the names under it,
    ``*`` for any)."""
    if host.startswith("["):  # [::1]:8000
        name = host[1 : host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if not name:
        return False
    if name == "localhost" or "*" in allowed or name in allowed:
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return any(entry.startswith(".") and (name == entry[1:] or name.endswith(entry)) for entry in allowed)


class BearerAuth:
    """Refuses every request and handshake without a token this server takes (:class:`.auth.Credentials`),
    but a ``GET`` of one of ``open_paths`` (``/health``; the web page's own files where the page is
    served); leaves the caller's :class:`~..roles.Principal` in the scope for the dispatch."""

    def __init__(self, app: Any, credentials: auth.Credentials, open_paths: frozenset = auth.OPEN_PATHS) -> None:
        self.app = app
        self.credentials = credentials
        self.open_paths = open_paths

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            principal = self.credentials.principal(scope)
            if principal is None:
                if not auth.is_open(scope, route_path(scope), self.open_paths):
                    roles.audit.info("refused %s %s: no valid token", scope["type"], route_path(scope))
                    await self._refuse(scope, receive, send)
                    return
                principal = roles.Principal(roles.Role.OBSERVER)  # an open path: nothing but what is open
            scope[roles.SCOPE_KEY] = principal
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        content = {"detail": auth.refusal(scope), "code": "UNAUTHORIZED"}
        if scope["type"] == "http":  # close: an unread body is not read on, nor the next request
            await _respond(send, "http", 401, content, (b"www-authenticate", b"Bearer"), (b"connection", b"close"))
            return
        await refuse_handshake(receive, send, scope, 401, content, (b"www-authenticate", b"Bearer"))


async def refuse_handshake(
    receive: Any, send: Any, scope: Dict[str, Any], status: int, content: Any, *headers: Tuple[bytes, bytes]
) -> None:
    """Answer a WebSocket handshake with an HTTP ``status`` and ``content`` as JSON, where the
    server offers ASGI's ``websocket.http.response`` (uvicorn does); elsewhere a close before
    accepting, which the server answers with 403. ``send`` must be the server's own (outermost);
    ``receive`` None: its ``websocket.connect`` was received already."""
    if receive is not None:
        await receive()  # websocket.connect: the handshake to answer
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await _respond(send, "websocket.http", status, content, *headers)
    else:
        await send({"type": "websocket.close", "code": 1008})
    uvicorn_compat.end_refused_handshake(send)


class BodyLimits:
    """Reads an HTTP request's body before the app does, refusing it past the message limit
    (413), past the server's budget of bytes in flight (503), or nested too deeply (400), and
    hands it on as one message."""

    def __init__(self, app: Any, limit: int, budget: InFlightBudget) -> None:
        self.app = app
        self.limit = limit
        self.budget = budget

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit, budget = self.limit, self.budget
        declared = -1
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                declared = int(value) if value.isdigit() else -1
                if declared > limit:
                    await refuse(scope, send, MessageTooLargeError(declared, limit))
                    return
        reserved = 0  # drawn from the budget for this body: all it declared, else as it arrives
        if declared > 0:
            if not budget.reserve(declared):
                await refuse(scope, send, ServerBusyError(budget.refusal()))
                return
            reserved = declared
        try:
            chunks = []
            size = 0
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client left mid-body: nobody to answer
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    await refuse(scope, send, MessageTooLargeError(None, limit))
                    return
                if size - reserved >= BUDGET_EXEMPT_BYTES:
                    if not budget.reserve(size - reserved):
                        await refuse(scope, send, ServerBusyError(budget.refusal()))
                        return
                    reserved = size
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
            del chunks
            if body.count(b"{") + body.count(b"[") > MAX_JSON_DEPTH and route_path(scope) not in RPC_ROUTES:
                try:
                    parse_json(body)
                except ValueError as exc:
                    reason = str(exc)
                    if "nesting" in reason or "recursion" in reason:  # ours, or pydantic-core's own limit
                        await refuse(scope, send, InvalidJsonError(reason))
                        return
                    # other decoding errors: the route answers them as it always does
            await self.app(scope, _replay(body, receive), send)
        finally:
            budget.release(reserved)


def _replay(body: bytes, receive: Any) -> Any:
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replay


def http_error(exc: BaseException) -> Response:
    """The HTTP answer to ``exc``, by the table of :mod:`..exceptions`: an invalid message's 422
    with pydantic's errors, an OpenEnv error's status and ``{"detail", "code"}``; anything else a
    500 worded by :func:`..error_details.describe`."""
    kind = kind_of(exc)
    if kind is VALIDATION:
        body = to_json_bytes({"detail": json.loads(exc.json())})  # type: ignore[attr-defined]
        return Response(body, status_code=422, media_type="application/json")
    if isinstance(exc, OpenEnvError) and kind is not EXECUTION:
        detail = exc.text
    else:
        detail = error_details.describe(exc, logger, "environment call failed")
    return JSONResponse({"detail": detail, "code": kind.ws_code}, status_code=kind.http_status)


async def refuse(scope: Dict[str, Any], send: Any, error: OpenEnvError) -> None:
    """Answer ``error`` by its kind: a JSON-RPC error on :data:`RPC_ROUTES` (as MCP clients
    expect), ``{"detail", "code"}`` elsewhere."""
    kind = error.kind
    if route_path(scope) in RPC_ROUTES:
        content: Any = JsonRpcResponse.error_response(kind.rpc_code, error.text).model_dump()
    else:
        content = {"detail": error.text, "code": kind.ws_code}
    await _respond(send, "http", kind.http_status, content)


async def _respond(send: Any, prefix: str, status: int, content: Any, *headers: Tuple[bytes, bytes]) -> None:
    """Send ``content`` as a JSON response (``prefix``: ``http``, or ``websocket.http`` for a
    handshake answered with one)."""
    body = to_json_bytes(content)
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": f"{prefix}.response.start", "status": status, "headers": start})
    await send({"type": f"{prefix}.response.body", "body": body})
