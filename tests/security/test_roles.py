"""Roles, attempt by attempt (a real server on 127.0.0.1 with every role's token, real clients):
an agent's credential reaches its own socket session and dies with it; reward-hacking attempts
from an agent credential are refused and audited; tokens come from files; the grader's check
runs on a copy of the session. The whole table, every credential against every operation of
every transport, is tests/security/test_roles_transports.py's (and test_roles_ray.py's).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List, Optional

import httpx
import pytest
from fastmcp import FastMCP

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


# Every credential x every operation x every transport: tests/security/test_roles_transports.py
# and test_roles_ray.py, against the table written out in roles_matrix.py. Here: the attempts
# one by one, credentials over sockets, token files, grading a copy.


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
            # the MCP lifecycle too: an agent harness learns at its first request that the episode is over
            for method in ("initialize", "ping"):
                refused = rpc(method)
                assert "result" not in refused and "no longer valid" in json.dumps(refused["error"]), refused

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
