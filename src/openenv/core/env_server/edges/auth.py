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

Roles (see :mod:`..roles`): the token above is the orchestrator's; a server may also take a
grader's and an observer's (``OPENENV_GRADER_TOKEN``, ``OPENENV_OBSERVER_TOKEN``) and the agent
credentials it mints per session. :class:`Credentials` tells which role a request's token is;
what each role may do is decided in the dispatch.

Clients send the token as a header: ``EnvClient(base_url, headers={"Authorization": "Bearer
<token>"})`` (upstream's clients take the same ``headers``), ``httpx`` / ``curl -H``, or the
``mcp`` SDK's ``streamablehttp_client(url, headers=...)``.
"""

from __future__ import annotations

import hmac
import os
from typing import Any, Dict, Optional

from ..roles import AGENT_PREFIX, ORCHESTRATOR, AgentCredentials, Principal, Role

ENV_VAR = "OPENENV_AUTH_TOKEN"
MIN_LENGTH = 16
OPEN_PATHS = frozenset({"/health"})

_HINT = 'make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'


def checked_token(token: Optional[str], variable: str = ENV_VAR, argument: str = "auth_token") -> Optional[bytes]:
    """The token the server requires (``OPENENV_AUTH_TOKEN`` or ``auth_token``, as
    :mod:`..settings` chose; a role's own variable and argument for the others), checked; None
    when there is none."""
    if token is None:
        return None
    source = variable if os.environ.get(variable, "").strip() == token else argument
    if len(token) < MIN_LENGTH:
        raise ValueError(f"{source} must be at least {MIN_LENGTH} characters; {_HINT}")
    if not all("!" <= ch <= "~" for ch in token):
        raise ValueError(f"{source} must be printable ASCII without spaces (it travels in a header); {_HINT}")
    return token.encode()


def credentials(
    auth_token: Optional[str], grader_token: Optional[str], observer_token: Optional[str]
) -> Optional[Credentials]:
    """The :class:`Credentials` of a server's tokens (None: it requires none). A grader's or an
    observer's token without the orchestrator's is refused: anyone could then do everything."""
    orchestrator = checked_token(auth_token)
    tokens: Dict[Role, bytes] = {}
    for role, token in ((Role.GRADER, grader_token), (Role.OBSERVER, observer_token)):
        name = f"OPENENV_{role.value.upper()}_TOKEN"
        checked = checked_token(token, name, f"{role.value}_token")
        if checked is None:
            continue
        if orchestrator is None:
            raise ValueError(f"{name} is set but OPENENV_AUTH_TOKEN (the orchestrator's) is not: set both, or neither")
        if checked == orchestrator or checked in tokens.values():
            raise ValueError(f"{name} must differ from the server's other tokens")
        tokens[role] = checked
    if orchestrator is None:
        return None
    return Credentials({Role.ORCHESTRATOR: orchestrator, **tokens}, AgentCredentials())


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


class Credentials:
    """The tokens a server takes, each with its role, and its agent credentials: turns a
    request's ``Authorization`` header into a :class:`~..roles.Principal` (None: refused)."""

    def __init__(self, tokens: Dict[Role, bytes], agents: AgentCredentials) -> None:
        self.tokens = tokens
        self.agents = agents

    def __repr__(self) -> str:  # never the tokens
        return f"Credentials(roles={sorted(role.value for role in self.tokens)})"

    def principal(self, scope: Dict[str, Any]) -> Optional[Principal]:
        """Whose request ``scope`` is, by its one ``Authorization: Bearer`` header (compared in
        constant time with every token), or None."""
        found = [value for name, value in scope.get("headers", ()) if name == b"authorization"]
        if len(found) != 1:
            return None
        scheme, _, credentials = found[0].partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        credentials = credentials.strip()
        matched = None
        for role, token in self.tokens.items():  # every one compared, whichever matches
            if hmac.compare_digest(credentials, token):
                matched = role
        if matched is not None:
            return ORCHESTRATOR if matched is Role.ORCHESTRATOR else Principal(matched)
        if credentials.startswith(AGENT_PREFIX.encode()):
            try:
                return self.agents.principal(credentials.decode("ascii"))
            except UnicodeDecodeError:
                return None
        return None
