"""Roles: each credential x each operation x each transport is allowed or refused exactly as the
table of docs/roles.md says (a real server on 127.0.0.1 with every role's token, real clients).

The expected table is written out here, independently of ``openenv.core.env_server.roles``:
changing one cell there makes this test fail. Refusals must not run anything: after the whole
matrix, the environment has been reset and stepped only by the calls the table allows.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List, Optional, Tuple

import httpx
import pytest
from fastmcp import FastMCP
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State

from ..conftest import serve

ORCHESTRATOR = "orchestrator-token-0123456789"
GRADER = "grader-token-0123456789abcd"
OBSERVER = "observer-token-0123456789ab"
ANSWER = "42"  # the task's answer: the grader's tool checks against it; the agent must never read it


class QuizEnv(MCPEnvironment):
    """An agent tool (``guess``) that changes the session, and a grader-only one (``check``)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True
    GRADER_TOOLS = ("check",)

    def __init__(self) -> None:
        mcp = FastMCP("quiz")
        self.guesses: List[str] = []
        self._state = State(episode_id="q", step_count=0)

        @mcp.tool
        def guess(value: str) -> str:
            """Make a guess."""
            self.guesses.append(value)
            return f"guessed {value}"

        @mcp.tool
        def check() -> dict:
            """Whether the last guess is the answer (grader only)."""
            return {"correct": bool(self.guesses) and self.guesses[-1] == ANSWER, "answer": ANSWER}

        super().__init__(mcp)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self.guesses = []
        self._state = State(episode_id=episode_id or "q", step_count=0)
        return Observation(done=False, reward=0.0)

    def _step_impl(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return Observation(done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state

    def grade(self) -> dict:
        """The oracle: run on a copy of the session, so what it does there (it guesses the
        answer itself, say) never reaches the episode."""
        verdict = {"correct": bool(self.guesses) and self.guesses[-1] == ANSWER, "guesses": len(self.guesses)}
        self.guesses.append(ANSWER)
        return verdict


def quiz_app() -> Any:
    return create_app(
        QuizEnv,
        CallToolAction,
        CallToolObservation,
        env_name="quiz",
        max_concurrent_envs=16,
        auth_token=ORCHESTRATOR,
        grader_token=GRADER,
        observer_token=OBSERVER,
        web=True,
    )


# --- the table, written out ------------------------------------------------------------------------

CREDENTIALS = ["orchestrator", "grader", "observer", "agent", "other_agent", "stale_agent", "none", "wrong"]
OPERATIONS = [
    "reset",
    "step",
    "state",
    "snapshot",
    "mint",
    "create",
    "metadata",
    "tools/list",
    "call agent tool",
    "call grader tool",
    "grade",
    "trajectory",
    "diff",
    "metrics",
]
Y, N = True, False
EXPECTED: Dict[str, Tuple[bool, ...]] = {
    #                    orch grader observer agent other stale none wrong
    "reset": (Y, N, N, N, N, N, N, N),
    "step": (Y, N, N, N, N, N, N, N),
    "state": (Y, Y, N, N, N, N, N, N),
    "snapshot": (Y, N, N, N, N, N, N, N),
    "mint": (Y, N, N, N, N, N, N, N),
    "create": (Y, N, N, N, N, N, N, N),
    "metadata": (Y, Y, Y, N, N, N, N, N),
    "tools/list": (Y, Y, N, Y, N, N, N, N),
    "call agent tool": (Y, N, N, Y, N, N, N, N),
    "call grader tool": (Y, Y, N, N, N, N, N, N),
    "grade": (Y, Y, N, N, N, N, N, N),
    "trajectory": (Y, Y, N, N, N, N, N, N),
    "diff": (Y, Y, N, N, N, N, N, N),
    "metrics": (Y, Y, Y, N, N, N, N, N),
}
"""Who may do what on session A (an agent credential of A, one of B, one of a closed session C)."""

TOOLS_SEEN = {"orchestrator": {"guess", "check"}, "grader": {"check"}, "agent": {"guess"}}


class Matrix:
    def __init__(self, http: httpx.Client, tokens: Dict[str, Optional[str]], session: str) -> None:
        self.http = http
        self.tokens = tokens
        self.session = session

    def headers(self, who: str, mcp_session: bool = False) -> Dict[str, str]:
        token = self.tokens[who]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if mcp_session:
            headers["Mcp-Session-Id"] = self.session
        return headers

    def rpc(self, who: str, method: str, mcp_session: bool = False, **params: Any) -> httpx.Response:
        if not mcp_session:
            params.setdefault("session_id", self.session)
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return self.http.post("/mcp", json=body, headers=self.headers(who, mcp_session))

    def allowed(self, who: str, op: str, transport: str) -> bool:
        """Whether ``who`` could do ``op`` on session A over ``transport`` ("http" or "mcp")."""
        h = self.headers(who)
        s = self.session
        if transport == "http":
            if op == "reset":
                r = self.http.post("/reset", json={"session_id": s}, headers=h)
            elif op == "step":
                r = self.http.post(
                    "/step",
                    json={
                        "session_id": s,
                        "action": {"type": "call_tool", "tool_name": "guess", "arguments": {"value": "1"}},
                    },
                    headers=h,
                )
            elif op == "state":
                r = self.http.get("/state", params={"session_id": s}, headers=h)
            elif op == "snapshot":
                r = self.http.post("/openenv/snapshot", json={"session_id": s}, headers=h)
            elif op == "mint":
                r = self.http.post("/openenv/agent_token", json={"session_id": s}, headers=h)
            elif op == "grade":
                r = self.http.post("/openenv/grade", json={"session_id": s}, headers=h)
            elif op in ("trajectory", "diff"):
                r = self.http.post(f"/openenv/{op}", json={"session_id": s}, headers=h)
                if op == "diff" and "declares no workspace" in r.json().get("detail", ""):
                    return True  # it ran: QuizEnv declares no workspace, and says so
            elif op == "metrics":
                r = self.http.get("/openenv/metrics", headers=h)
            elif op == "metadata":
                r = self.http.get("/metadata", headers=h)
            elif op == "create":
                r = self.http.post("/web/session", json={}, headers=h)  # the playground's create
                if r.status_code == 200:
                    self.http.request(
                        "DELETE", "/web/session", headers={**h, "X-OpenEnv-Session": r.json()["session_id"]}
                    )
            else:
                return self.allowed(who, op, "mcp")  # tools have no HTTP route of their own
            return r.status_code == 200
        # JSON-RPC over POST /mcp: agents name their session in Mcp-Session-Id, the rest in params
        agentish = who.endswith("agent")
        if op == "tools/list":
            r = self.rpc(who, "tools/list", mcp_session=agentish)
            if r.status_code != 200 or "error" in r.json():
                return False
            names = {tool["name"] for tool in r.json()["result"]["tools"]}
            assert names == TOOLS_SEEN[who], (who, names)
            return True
        if op in ("call agent tool", "call grader tool"):
            name, arguments = ("guess", {"value": "7"}) if op == "call agent tool" else ("check", {})
            r = self.rpc(who, "tools/call", mcp_session=agentish, name=name, arguments=arguments)
            return r.status_code == 200 and "error" not in r.json()
        method = {
            "snapshot": "openenv/session/snapshot",
            "mint": "openenv/session/agent_token",
            "create": "openenv/session/create",
            "trajectory": "openenv/session/trajectory",
            "diff": "openenv/session/diff",
            "metrics": "openenv/metrics",
        }.get(op)
        if method is None:
            return self.allowed(who, op, "http")  # reset/step/state/metadata: HTTP routes only
        r = self.rpc(who, method, mcp_session=agentish)
        if op == "diff" and "declares no workspace" in r.json().get("error", {}).get("message", ""):
            return True  # it ran: QuizEnv declares no workspace, and says so
        return r.status_code == 200 and "error" not in r.json()


def test_every_credential_op_and_transport_is_allowed_or_refused_as_the_table_says() -> None:
    with serve(quiz_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        boss = {"Authorization": f"Bearer {ORCHESTRATOR}"}

        def create() -> str:
            body = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
            return http.post("/mcp", json=body, headers=boss).json()["result"]["session_id"]

        def mint(session: str) -> str:
            return http.post("/openenv/agent_token", json={"session_id": session}, headers=boss).json()["token"]

        a, b, c = create(), create(), create()
        stale = mint(c)
        body = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/close", "params": {"session_id": c}}
        assert http.post("/mcp", json=body, headers=boss).json()["result"]["closed"]
        tokens = {
            "orchestrator": ORCHESTRATOR,
            "grader": GRADER,
            "observer": OBSERVER,
            "agent": mint(a),
            "other_agent": mint(b),
            "stale_agent": stale,
            "none": None,
            "wrong": "not-a-token-of-this-server-000",
        }
        matrix = Matrix(http, tokens, a)
        cells, wrong = 0, []
        for op in OPERATIONS:
            for column, who in enumerate(CREDENTIALS):
                for transport in ("http", "mcp"):
                    got = matrix.allowed(who, op, transport)
                    cells += 1
                    if got != EXPECTED[op][column]:
                        wrong.append((who, op, transport, got))
        assert not wrong, wrong
        assert cells == len(OPERATIONS) * len(CREDENTIALS) * 2

        # WebSockets open a session: the orchestrator's alone, on /ws and WS /mcp
        async def sockets() -> None:
            for path in ("/ws", "/mcp"):
                url = server.base_url.replace("http", "ws") + path
                for who in CREDENTIALS:
                    token = tokens[who]
                    headers = {"Authorization": f"Bearer {token}"} if token else {}
                    try:
                        async with ws_connect(url, additional_headers=headers):
                            opened = True
                    except InvalidStatus as exc:
                        opened = False
                        assert exc.response.status_code in (401, 403), (who, path, exc.response.status_code)
                    assert opened == (who == "orchestrator"), (who, path)

        asyncio.run(sockets())


def test_an_agent_credential_reaches_its_own_socket_session_and_dies_with_it() -> None:
    """The trainer plays over /ws and hands its agent a credential for that session: the agent
    calls its tools over POST /mcp (initialize gives it its session), never the grader's; once
    the trainer's connection ends, the credential is refused."""
    from openenv.core.generic_client import GenericEnvClient

    with serve(quiz_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:

        async def main() -> None:
            async with GenericEnvClient(
                base_url=server.base_url, headers={"Authorization": f"Bearer {ORCHESTRATOR}"}
            ) as env:
                await env.reset()
                credential = await env.agent_token()
                agent = {"Authorization": f"Bearer {credential['token']}"}

                def rpc(method: str, **params: Any) -> Dict[str, Any]:
                    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                    return http.post("/mcp", json=body, headers=agent).json()

                init = http.post(
                    "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}, headers=agent
                )
                assert init.headers["mcp-session-id"] == credential["session_id"]
                assert {t["name"] for t in rpc("tools/list")["result"]["tools"]} == {"guess"}
                assert rpc("tools/call", name="guess", arguments={"value": ANSWER})["result"]
                refused = rpc("tools/call", name="check", arguments={})
                assert "not found" in json.dumps(refused["error"]).lower() and ANSWER not in json.dumps(refused)
                # the trainer's session saw the agent's guess
                state = http.get("/state", params={"session_id": credential["session_id"]}, headers=agent)
                assert state.status_code == 403 and state.json()["code"] == "FORBIDDEN"
            for _ in range(50):  # the session ends with its connection (no resume asked)
                if "error" in rpc("tools/list"):
                    break
                await asyncio.sleep(0.05)
            assert "no longer valid" in json.dumps(rpc("tools/list")["error"])

        asyncio.run(main())


def test_reward_hacking_attempts_from_an_agent_credential_are_refused_and_audited(caplog: Any) -> None:
    with serve(quiz_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        boss = {"Authorization": f"Bearer {ORCHESTRATOR}"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
        session = http.post("/mcp", json=body, headers=boss).json()["result"]["session_id"]
        token = http.post("/openenv/agent_token", json={"session_id": session}, headers=boss).json()["token"]
        agent = {"Authorization": f"Bearer {token}"}
        caplog.set_level("INFO", logger="openenv.audit")
        attempts = [
            http.post("/reset", json={"session_id": session}, headers=agent),  # reset its own episode
            http.get("/state", params={"session_id": session}, headers=agent),  # read the state
            http.post("/openenv/snapshot", json={"session_id": session}, headers=agent),  # read it all
            http.post("/web/session", json={}, headers=agent),  # the playground
            http.post("/web/reset", json={}, headers={**agent, "X-OpenEnv-Session": session}),
            http.post("/quiz/task", json={"split": "test", "index": 0}, headers=agent),  # answer data
        ]
        assert [r.status_code for r in attempts] == [403] * len(attempts), [r.text for r in attempts]
        assert all(r.json()["code"] == "FORBIDDEN" for r in attempts)
        assert "orchestrator" in attempts[0].json()["detail"]  # names the role needed
        audited = [r.getMessage() for r in caplog.records if r.name == "openenv.audit"]
        assert sum("refused" in line and f"agent[{session}]" in line for line in audited) >= len(attempts)
        assert not any(token in line for line in audited)  # never the token


def test_tokens_come_from_files_and_a_role_token_needs_the_orchestrators(tmp_path: Any) -> None:
    from openenv.core.env_server.edges.auth import credentials
    from openenv.core.env_server.settings import ServerSettings

    (tmp_path / "grader").write_text(GRADER + "\n")
    settings = ServerSettings.resolve(
        {"OPENENV_AUTH_TOKEN": ORCHESTRATOR, "OPENENV_GRADER_TOKEN_FILE": str(tmp_path / "grader")}
    )
    assert settings.grader_token == GRADER and GRADER not in repr(settings) and ORCHESTRATOR not in repr(settings)
    with pytest.raises(ValueError, match="OPENENV_OBSERVER_TOKEN_FILE names a file that cannot be read"):
        ServerSettings.resolve({"OPENENV_OBSERVER_TOKEN_FILE": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="OPENENV_GRADER_TOKEN is set but OPENENV_AUTH_TOKEN"):
        credentials(None, GRADER, None)
    with pytest.raises(ValueError, match="must differ"):
        credentials(ORCHESTRATOR, ORCHESTRATOR, None)
    assert GRADER not in repr(credentials(ORCHESTRATOR, GRADER, OBSERVER))


def test_the_grader_runs_the_check_on_a_copy_of_the_session() -> None:
    with serve(quiz_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        boss = {"Authorization": f"Bearer {ORCHESTRATOR}"}
        grader = {"Authorization": f"Bearer {GRADER}"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
        session = http.post("/mcp", json=body, headers=boss).json()["result"]["session_id"]
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"session_id": session, "name": "guess", "arguments": {"value": "7"}},
        }
        http.post("/mcp", json=call, headers=boss)
        first = http.post("/openenv/grade", json={"session_id": session}, headers=grader).json()["grade"]
        again = http.post("/openenv/grade", json={"session_id": session}, headers=grader).json()["grade"]
        assert first == again == {"correct": False, "guesses": 1}  # the check's own guess stayed in its copy
