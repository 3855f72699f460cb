"""The table of docs/roles.md, written out independently of ``openenv.core.env_server.roles``, and
how a cell of it is judged: shared by test_roles_transports.py and test_roles_ray.py.

A cell is one credential making one operation through one transport. An allowed cell must
succeed; a refused one must be refused the right way: 401 ``UNAUTHORIZED`` for no credential or
one the server does not know, 403 ``FORBIDDEN`` (JSON-RPC error -32001, a ``/ws`` error frame
with that code) or, for a tool outside the caller's reach, "unknown tool" for a credential it
knows. Anything else (a 404, a 500, an error of the environment) is a wrong cell either way.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import httpx

QUIZ = Path(__file__).resolve().parents[1] / "fixtures" / "roles_quiz_env"
"""The environment package these tests serve: an agent tool (``guess``), a grader-only one
(``check``), ``grade()`` and a Task API."""

ORCHESTRATOR = "orchestrator-token-matrix-0123456789"
GRADER = "grader-token-matrix-0123456789abcdef"
OBSERVER = "observer-token-matrix-0123456789abcd"
WRONG = "not-a-token-of-this-server-00000000"

WHO = ("orchestrator", "grader", "observer", "agent", "other_agent", "stale_agent", "none", "wrong")
"""The credentials: the three role tokens; an agent credential of session A (the one every cell
acts on), one of another live session B, one of a session C that was closed; no credential; and
a token the server does not know."""

Y, N = True, False
TABLE: Dict[str, Tuple[bool, ...]] = {
    #                          orch grader observer agent other stale none wrong
    "reset": (Y, N, N, N, N, N, N, N),
    "step": (Y, N, N, N, N, N, N, N),
    "state": (Y, Y, N, N, N, N, N, N),
    "snapshot": (Y, N, N, N, N, N, N, N),
    "restore": (Y, N, N, N, N, N, N, N),
    "mint": (Y, N, N, N, N, N, N, N),
    "create": (Y, N, N, N, N, N, N, N),  # a session: HTTP, MCP, the playground, or a WebSocket opened
    "close": (Y, N, N, N, N, N, N, N),
    "metadata": (Y, Y, Y, N, N, N, N, N),
    "schema": (Y, Y, Y, N, N, N, N, N),
    "capacity": (Y, Y, Y, N, N, N, N, N),
    "task": (Y, Y, N, N, N, N, N, N),
    "tools/list": (Y, Y, N, Y, N, N, N, N),
    "call agent tool": (Y, N, N, Y, N, N, N, N),
    "call grader tool": (Y, Y, N, N, N, N, N, N),
    "grade": (Y, Y, N, N, N, N, N, N),
    "trajectory": (Y, Y, N, N, N, N, N, N),
    "diff": (Y, Y, N, N, N, N, N, N),
    "metrics": (Y, Y, Y, N, N, N, N, N),
    # An agent's own session, none named (the credential says which): B is the other agent's own,
    # C has ended; the orchestrator's call runs on a throw-away environment; a grader names one.
    "call agent tool, own session": (Y, N, N, Y, Y, N, N, N),
    # Outside the table: open to anyone (the load balancer's poll, the page's own files) ...
    "health": (Y, Y, Y, Y, Y, Y, Y, Y),
    "page": (Y, Y, Y, Y, Y, Y, Y, Y),
    # ... and MCP's handshake and ping (initialize, ping): any live credential of this server's
    # (an agent's whose session ended is told so at once).
    "mcp lifecycle": (Y, Y, Y, Y, Y, N, N, N),
}

MARKED_ROWS = frozenset({"reset", "step", "call agent tool", "call agent tool, own session"})
"""The rows whose calls carry a marker (:meth:`Matrix.marker`) into what the environment runs."""

OK, UNAUTHORIZED, FORBIDDEN, NO_SUCH_TOOL = "ok", "401", "403", "unknown tool"
FORBIDDEN_RPC_CODE = -32001
TOOLS_SEEN = {"orchestrator": {"guess", "check"}, "grader": {"check"}, "agent": {"guess"}}


def load_quiz() -> Any:
    """The quiz package's ``server/app.py``, imported (once) as ``roles_quiz_env_app``."""
    name = "roles_quiz_env_app"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, QUIZ / "server" / "app.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # (a snapshot names the class by its module)
        spec.loader.exec_module(module)
    return sys.modules[name]


def sandboxed_code_under_test() -> Dict[str, Any]:
    """Options for a :class:`SandboxPool` whose servers run the framework this test imports.

    A sandboxed server gets a clean environment, and a warm one forks from a warden that imported
    the framework in its own: both import the installed ``openenv`` (an editable install may be
    another checkout's). Where ``PYTHONPATH`` is set (a worktree's tests), the servers get it too,
    each started afresh (``warm=False``); its directories are in the sandbox already (read-only),
    as every directory this interpreter imports from is."""
    path = os.environ.get("PYTHONPATH")
    return {"warm": False, "env_vars": {"PYTHONPATH": path}} if path else {"env_vars": {}}


def bearer(token: Optional[str]) -> Dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def rpc_body(method: str, **params: Any) -> Dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def rpc_outcome(message: Any, who: Optional[str] = None) -> str:
    """A JSON-RPC response's outcome (a tools/list must list exactly what ``who`` may see)."""
    if not isinstance(message, dict):
        return f"not a JSON-RPC response: {message!r:.200}"
    error = message.get("error")
    if error is None:
        result = message.get("result")
        if isinstance(result, dict) and result.get("isError"):
            return f"tool failed: {result!r:.200}"
        if isinstance(result, dict) and "tools" in result and who in TOOLS_SEEN:
            names = {tool["name"] for tool in result["tools"]}
            if names != TOOLS_SEEN[who]:
                return f"listed {sorted(names)}"
        return OK
    if error.get("code") == FORBIDDEN_RPC_CODE:
        return FORBIDDEN
    if (error.get("data") or {}).get("error_type") == "tool_not_found":
        return NO_SUCH_TOOL
    return f"JSON-RPC error {error.get('code')}: {error.get('message')!r:.200}"


def outcome(response: httpx.Response, who: Optional[str] = None) -> str:
    """What an HTTP answer was: OK, UNAUTHORIZED, FORBIDDEN, NO_SUCH_TOOL, or what went wrong."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    code = body.get("code") if isinstance(body, dict) else None
    if status == 401:
        return UNAUTHORIZED if code == "UNAUTHORIZED" else f"401 without its code: {response.text:.200}"
    if status == 403:
        return FORBIDDEN if code == "FORBIDDEN" else f"403 without its code: {response.text:.200}"
    if not 200 <= status < 300:
        return f"HTTP {status}: {response.text:.200}"
    if isinstance(body, dict) and body.get("jsonrpc") == "2.0":
        return rpc_outcome(body, who)
    return OK


@dataclasses.dataclass
class Matrix:
    """The cells of one transport: each checked against :data:`TABLE`, the wrong ones kept.

    ``foreign_agents``: an agent credential may land on a server that did not mint it (behind a
    front, in a pool), which cannot tell it from any unknown token: 401 is its right refusal there.
    """

    transport: str
    foreign_agents: bool = False
    cells: int = 0
    wrong: List[Tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    markers: Dict[str, bool] = dataclasses.field(default_factory=dict)

    def allowed(self, row: str, who: str) -> bool:
        return TABLE[row][WHO.index(who)]

    def check(self, label: str, row: str, who: str, got: str) -> None:
        """One cell: ``who`` made ``label`` (an operation of row ``row``) and got ``got``."""
        allowed = self.allowed(row, who)
        self.cells += 1
        if allowed:
            right = got == OK
        elif who in ("none", "wrong"):
            right = got == UNAUTHORIZED
        elif self.foreign_agents and who.endswith("agent") and got == UNAUTHORIZED:
            right = True
        else:
            right = got in (FORBIDDEN, NO_SUCH_TOOL)
        if not right:
            self.wrong.append((label, who, "allowed" if allowed else "refused", got))

    def marker(self, label: str, row: str, who: str) -> str:
        """A value for the environment to record if the cell's call runs: every reset carries one
        as its episode id, every step and agent tool call as its guess (:data:`MARKED_ROWS`); it
        must run exactly when the table allows the cell."""
        value = f"{self.transport}:{label}@{who}"
        if row in MARKED_ROWS:
            self.markers[value] = self.allowed(row, who)
        return value

    def ran_exactly_the_allowed(self, ran: Set[str]) -> List[str]:
        """The markers that ran though refused, or did not run though allowed."""
        seen = {value for value in ran if value in self.markers}
        expected = {value for value, allowed in self.markers.items() if allowed}
        return sorted(seen ^ expected)

    def report(self) -> str:
        return f"{self.transport}: {self.cells} cells, {len(self.wrong)} wrong"
