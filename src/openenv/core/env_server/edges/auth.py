"""A bearer token in front of every route but ``/health`` (spec §14.16: upstream has no auth).

Off unless asked for: ``$OPENENV_AUTH_TOKEN`` or, when that is not set,
``create_app(..., auth_token=...)`` (see :mod:`..settings`). Then every
HTTP request and WebSocket handshake must carry ``Authorization: Bearer <token>``; anything else
is answered 401 (``{"detail", "code": "UNAUTHORIZED"}``, ``WWW-Authenticate: Bearer``, and the
connection closed) before a route runs, a body is read or a session is made. A WebSocket is
refused during its handshake, so the client sees the 401 too. ``GET /health`` stays open for
load balancers and health polls, and so do the web playground's own files (its HTML, CSS and
JavaScript, see :mod:`..web`), where it is served: a browser cannot add a header to a page it
navigates to. The page asks for the token and sends it as this header with every call it makes.

Clients send the token as a header: ``EnvClient(base_url, headers={"Authorization": "Bearer
<token>"})`` (upstream's clients take the same ``headers``), ``httpx`` / ``curl -H``, or the
``mcp`` SDK's ``streamablehttp_client(url, headers=...)``.
"""

from __future__ import annotations

import hmac
import os
from typing import Any, Dict, Optional

ENV_VAR = "OPENENV_AUTH_TOKEN"
MIN_LENGTH = 16
OPEN_PATHS = frozenset({"/health"})

_HINT = 'make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'


def checked_token(token: Optional[str]) -> Optional[bytes]:
    """The token the server requires (``OPENENV_AUTH_TOKEN`` or ``auth_token``, as
    :mod:`..settings` chose), checked; None when there is none."""
    if token is None:
        return None
    source = ENV_VAR if os.environ.get(ENV_VAR, "").strip() == token else "auth_token"
    if len(token) < MIN_LENGTH:
        raise ValueError(f"{source} must be at least {MIN_LENGTH} characters; {_HINT}")
    if not all("!" <= ch <= "~" for ch in token):
        raise ValueError(f"{source} must be printable ASCII without spaces (it travels in a header); {_HINT}")
    return token.encode()


def is_open(scope: Dict[str, Any], path: str, open_paths: frozenset = OPEN_PATHS) -> bool:
    """Whether ``scope`` needs no token: an HTTP GET of one of ``open_paths`` (``/health``, and
    the web page's files where it is served: they hold no data), nothing else."""
    return scope["type"] == "http" and path in open_paths and scope.get("method") == "GET"


def authorized(scope: Dict[str, Any], token: bytes) -> bool:
    """Whether the request or handshake of ``scope`` carries ``token`` (compared in constant time)
    in its one ``Authorization`` header (two are refused: a proxy might read the other)."""
    found = [value for name, value in scope.get("headers", ()) if name == b"authorization"]
    if len(found) != 1:
        return False
    scheme, _, credentials = found[0].partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token)


def refusal(scope: Dict[str, Any]) -> str:
    """Why the request or handshake of ``scope`` is refused (the 401's ``detail``)."""
    if any(name == b"authorization" for name, _ in scope.get("headers", ())):
        return "this server did not accept the token sent"
    return "this server requires a token: send the header 'Authorization: Bearer <token>'"
