"""Who may do what: four roles, one table, decided in the one dispatch.

A server that requires tokens (``OPENENV_AUTH_TOKEN``) knows four roles:

* **orchestrator** (the trainer; today's single token): creates, resets, steps, reads and closes
  sessions, forks and snapshots them, and mints agent credentials;
* **agent** (the harness or code acting in an episode): lists and calls the agent-visible tools of
  **its own session** and nothing else, with a credential the orchestrator minted for that
  session (scoped to it, expiring, void once the session ends);
* **grader** (``OPENENV_GRADER_TOKEN``): inspects a session read-only: its state, the
  environment's grader-only tools, its ``grade()`` run on a copy of the session, its trajectory
  since its last reset (:mod:`.trajectory`) and what changed in its work directory
  (:mod:`.workspace_diff`);
* **observer** (``OPENENV_OBSERVER_TOKEN``): progress only (health, capacity, metadata, schemas,
  the server's metrics: counts and each session's progress, never what it saw or did).

The edge (:class:`.edges.middleware.BearerAuth`, with :class:`.edges.auth.Credentials`) turns the ``Authorization`` header into a
:class:`Principal` (or refuses it, 401); every transport hands the principal with each call to the
dispatcher, which checks it against :data:`ALLOWED` before anything runs (403, naming the role
needed). A server without tokens has one role, the orchestrator, for everyone, as before.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import hmac
import logging
import secrets
import time
from typing import Any, Dict, FrozenSet, Optional

from .exceptions import ErrorKind, OpenEnvError

audit = logging.getLogger("openenv.audit")
"""One line per privileged call and per refusal: who, what, which session; never a token."""


class Role(str, enum.Enum):
    ORCHESTRATOR = "orchestrator"
    AGENT = "agent"
    GRADER = "grader"
    OBSERVER = "observer"


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a request comes from: a role and, for an agent, the one session it may reach."""

    role: Role
    session_id: Optional[str] = None
    nonce: Optional[str] = None  # the agent credential's session nonce (void once the session ends)

    def __str__(self) -> str:
        return f"{self.role.value}" + (f"[{self.session_id}]" if self.session_id else "")


OPEN = Principal(Role.ORCHESTRATOR)
"""The principal of every request to a server that requires no token."""

ORCHESTRATOR = Principal(Role.ORCHESTRATOR)
"""The orchestrator's principal on a server with roles (equal to :data:`OPEN`, not it: its
privileged calls leave audit lines)."""

SCOPE_KEY = "openenv.principal"
"""Where the edge leaves a request's :class:`Principal` in its ASGI scope."""


def principal_of(scope: Any) -> Principal:
    """The principal the edge found for the request or connection of ``scope`` (:data:`OPEN`
    where the server requires no token)."""
    return scope.get(SCOPE_KEY) or OPEN


AGENT_PREFIX = "oe-agent."
DEFAULT_AGENT_TTL_S = 3600.0


# Operations (the dispatcher's ``Op`` values, and a few of the edges') each role may run.
_READ = frozenset({"metadata", "schema", "health", "capacity", "metrics"})
ALLOWED: Dict[Role, FrozenSet[str]] = {
    Role.ORCHESTRATOR: frozenset(
        {
            "reset",
            "step",
            "state",
            "tools/list",
            "tools/call",
            "session/create",
            "session/close",
            "snapshot",
            "restore",
            "view",
            "task",
            "agent/mint",
            "grade",
            "trajectory",
            "diff",
        }
    )
    | _READ,
    Role.AGENT: frozenset({"tools/list", "tools/call"}),
    Role.GRADER: frozenset({"state", "tools/list", "tools/call", "task", "grade", "trajectory", "diff"}) | _READ,
    Role.OBSERVER: _READ,
}
"""The table: which operations each role may run. An agent's are further bound to its own
session and its agent-visible tools; a grader's tools are the grader-only ones."""


def audit_line(principal: Principal, op: str, session_id: Optional[str], outcome: str) -> None:
    """Log one privileged call or refusal (``openenv.audit``): role, operation, session, outcome."""
    audit.info("%s %s session=%s %s", principal, op, session_id or "-", outcome)


def needed_roles(op: str) -> str:
    """The roles that may run ``op``, in words (for a refusal)."""
    names = [role.value for role, ops in ALLOWED.items() if op in ops]
    return " or ".join(names) if names else "no role"


FORBIDDEN = ErrorKind("FORBIDDEN", 403, -32001, 1008)


class ForbiddenError(OpenEnvError):
    """The caller's role may not do this (or, for an agent, not on this session)."""

    kind = FORBIDDEN

    def __init__(self, principal: Principal, op: str, message: Optional[str] = None) -> None:
        self.role = principal.role.value
        self.op = op
        super().__init__(message or f"'{op}' needs the {needed_roles(op)} role; this credential is {self.role}'s")

    def details(self) -> Dict[str, Any]:
        return {"role": self.role, "needed": needed_roles(self.op)}


class AgentCredentials:
    """Mints and checks per-session agent credentials: ``oe-agent.<session>.<expiry>.<nonce>.<mac>``,
    HMAC-signed with a key of this server's, bound to the session's nonce (a new one per session:
    a credential dies with its session, even if an id came back)."""

    def __init__(self, key: Optional[bytes] = None, ttl_s: float = DEFAULT_AGENT_TTL_S) -> None:
        self._key = key or secrets.token_bytes(32)
        self.ttl_s = ttl_s

    def __repr__(self) -> str:
        return f"AgentCredentials(ttl_s={self.ttl_s})"

    def _mac(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def mint(self, session_id: str, nonce: str, ttl_s: Optional[float] = None) -> Dict[str, Any]:
        """A credential for the agent of session ``session_id`` (whose nonce is ``nonce``):
        ``{"token", "session_id", "expires_at"}``."""
        expires = int(time.time() + (self.ttl_s if ttl_s is None else ttl_s))
        body = f"{session_id}.{expires}.{nonce}"
        return {"token": f"{AGENT_PREFIX}{body}.{self._mac(body)}", "session_id": session_id, "expires_at": expires}

    def principal(self, token: str) -> Optional[Principal]:
        """The agent principal of ``token``, or None when it is not one of ours or has expired."""
        if not token.startswith(AGENT_PREFIX):
            return None
        body, _, mac = token[len(AGENT_PREFIX) :].rpartition(".")
        if not body or not hmac.compare_digest(self._mac(body), mac):
            return None
        session_id, _, rest = body.rpartition(".")  # (session ids may hold dots: split from the right)
        session_id, _, expires = session_id.rpartition(".")
        try:
            if int(expires) < time.time():
                return None
        except ValueError:
            return None
        return Principal(Role.AGENT, session_id=session_id, nonce=rest)
