"""The grader's trajectory and workspace diff, the observer's metrics: who may read each (every
credential, over HTTP and MCP), and what each holds. Real servers on 127.0.0.1, real clients.

The notes environment below keeps a work directory, as shell_env does; its observations carry a
secret (the task's answer) that the observer must never see.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx
import pytest
from fastmcp import FastMCP
from websockets.asyncio.client import connect as ws_connect

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.settings import ServerSettings
from openenv.core.env_server.types import Observation, State

from ..conftest import serve

ORCHESTRATOR = "orchestrator-token-0123456789"
GRADER = "grader-token-0123456789abcd"
OBSERVER = "observer-token-0123456789ab"
SECRET = "the-answer-is-swordfish-7731"  # in every observation: never in what the observer reads


class NotesEnv(MCPEnvironment):
    """An agent writes notes in a work directory of its own (``workspace_dir``); each tool call
    earns 1.0, ``finish`` ends the episode. ``link`` makes a symbolic link as an unconfined
    agent could."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("notes")
        self.root = Path(tempfile.mkdtemp(prefix="notes-"))

        @mcp.tool
        def write(path: str, text: str) -> str:
            """Write a note."""
            (self.root / path).parent.mkdir(parents=True, exist_ok=True)
            (self.root / path).write_text(text)
            return f"wrote {path}"

        @mcp.tool
        def remove(path: str) -> str:
            """Remove a note."""
            (self.root / path).unlink()
            return f"removed {path}"

        @mcp.tool
        def link(path: str, target: str) -> str:
            """Make a symbolic link."""
            os.symlink(target, self.root / path)
            return f"linked {path}"

        @mcp.tool
        def fail() -> str:
            """Always fails."""
            raise ValueError("this tool always fails")

        @mcp.tool
        async def nap(seconds: float) -> str:
            """Sleep (past the server's step timeout, in a test)."""
            await asyncio.sleep(seconds)
            return "rested"

        @mcp.tool
        def finish() -> str:
            """End the episode."""
            return "finished"

        super().__init__(mcp)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        if kwargs.get("fail"):
            raise RuntimeError("this reset fails")
        shutil.rmtree(self.root)
        self.root.mkdir()
        (self.root / "task.txt").write_text("line one\nline two\n")
        return Observation(done=False, reward=0.0, metadata={"answer": SECRET})

    def _step_impl(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"answer": SECRET})

    async def _after_mcp_action(self, action: Any, observation: Observation) -> Observation:
        observation.reward = 1.0
        observation.done = getattr(action, "tool_name", None) == "finish"
        observation.metadata = {"answer": SECRET}
        return observation

    @property
    def state(self) -> State:
        return State(step_count=0)

    def workspace_dir(self) -> Path:
        return self.root

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        super().close()


def notes_app(**options: Any) -> Any:
    options.setdefault("auth_token", ORCHESTRATOR)
    if options["auth_token"] is not None:
        options.setdefault("grader_token", GRADER)
        options.setdefault("observer_token", OBSERVER)
    return create_app(NotesEnv, CallToolAction, CallToolObservation, env_name="notes", max_concurrent_envs=8, **options)


def bearer(token: Optional[str]) -> Dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


BOSS = bearer(ORCHESTRATOR)


class Client:
    """One HTTP client to a server, speaking its routes and its JSON-RPC."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def rpc(self, headers: Dict[str, str], method: str, **params: Any) -> httpx.Response:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return self.http.post("/mcp", json=body, headers=headers)

    def result(self, headers: Dict[str, str], method: str, **params: Any) -> Any:
        answer = self.rpc(headers, method, **params).json()
        assert "error" not in answer, answer
        return answer["result"]

    def create(self) -> str:
        return self.result(BOSS, "openenv/session/create")["session_id"]

    def reset(self, session: str, **kwargs: Any) -> None:
        assert self.http.post("/reset", json={"session_id": session, **kwargs}, headers=BOSS).status_code == 200

    def step(self, session: str, tool: str, **arguments: Any) -> Dict[str, Any]:
        action = {"type": "call_tool", "tool_name": tool, "arguments": arguments}
        answer = self.http.post("/step", json={"session_id": session, "action": action}, headers=BOSS)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def call(self, session: str, tool: str, headers: Dict[str, str] = BOSS, **arguments: Any) -> Any:
        return self.rpc(headers, "tools/call", session_id=session, name=tool, arguments=arguments).json()

    def trajectory(self, session: str, headers: Dict[str, str] = BOSS) -> Dict[str, Any]:
        answer = self.http.post("/openenv/trajectory", json={"session_id": session}, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def diff(self, session: str, headers: Dict[str, str] = BOSS) -> httpx.Response:
        return self.http.post("/openenv/diff", json={"session_id": session}, headers=headers)

    def agent_token(self, session: str) -> str:
        return self.http.post("/openenv/agent_token", json={"session_id": session}, headers=BOSS).json()["token"]


# --- who may read what -------------------------------------------------------------------------

CREDENTIALS = ["orchestrator", "grader", "observer", "agent", "other_agent", "none"]
Y, N = True, False
EXPECTED = {
    #             orch grader observer agent other none
    "trajectory": (Y, Y, N, N, N, N),
    "diff": (Y, Y, N, N, N, N),
    "metrics": (Y, Y, Y, N, N, N),
}
"""Who may read what of session A (an agent credential of A, one of B, no credential)."""


def test_trajectory_diff_and_metrics_are_allowed_or_refused_as_the_table_says_on_http_and_mcp() -> None:
    with serve(notes_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)
        a, b = client.create(), client.create()
        client.reset(a)
        client.step(a, "write", path="done.txt", text="yes\n")
        tokens = {
            "orchestrator": ORCHESTRATOR,
            "grader": GRADER,
            "observer": OBSERVER,
            "agent": client.agent_token(a),
            "other_agent": client.agent_token(b),
            "none": None,
        }
        wrong = []
        for op, row in EXPECTED.items():
            for who, expected in zip(CREDENTIALS, row, strict=True):
                headers = bearer(tokens[who])
                # over HTTP
                if op == "metrics":
                    answer = http.get("/openenv/metrics", headers=headers)
                else:
                    answer = http.post(f"/openenv/{op}", json={"session_id": a}, headers=headers)
                refused = 401 if who == "none" else 403
                if answer.status_code != (200 if expected else refused):
                    wrong.append((op, who, "http", answer.status_code))
                if answer.status_code == 200:
                    check_answer(op, answer.json(), a)
                # over MCP (an agent names its session in Mcp-Session-Id, as its MCP client does)
                method = "openenv/metrics" if op == "metrics" else f"openenv/session/{op}"
                if who.endswith("agent"):
                    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}
                    session = a if who == "agent" else b
                    answer = http.post("/mcp", json=body, headers={**headers, "Mcp-Session-Id": session})
                else:
                    answer = client.rpc(headers, method, session_id=a)
                if who == "none":
                    ok = answer.status_code == 401
                elif expected:
                    ok = answer.status_code == 200 and "result" in answer.json()
                    if ok:
                        check_answer(op, answer.json()["result"], a)
                else:
                    ok = answer.json().get("error", {}).get("data", {}).get("code") == "FORBIDDEN"
                if not ok:
                    wrong.append((op, who, "mcp", answer.text[:200]))
        assert not wrong, wrong
        # and the observer still reads no state
        assert http.get("/state", params={"session_id": a}, headers=bearer(OBSERVER)).status_code == 403


def check_answer(op: str, answer: Dict[str, Any], session: str) -> None:
    """What an allowed reader gets: the session's own record, its diff, the server's counts."""
    if op == "trajectory":
        assert [entry["kind"] for entry in answer["entries"]] == ["reset", "step"]
    elif op == "diff":
        assert [entry["path"] for entry in answer["added"]] == ["done.txt"]
    else:
        assert {entry["session_id"] for entry in answer["sessions"]} >= {session}
        assert SECRET not in json.dumps(answer)


# --- the trajectory ----------------------------------------------------------------------------


def test_the_trajectory_holds_exactly_the_calls_since_the_reset_and_a_reset_clears_it() -> None:
    with serve(notes_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)
        session = client.create()
        client.reset(session, seed=7)
        client.step(session, "write", path="a.txt", text="A\n")  # a step (HTTP /step)
        assert "result" in client.call(session, "write", path="b.txt", text="B\n")  # a tool call (MCP)
        agent = bearer(client.agent_token(session))
        assert "result" in client.call(session, "remove", headers=agent, path="a.txt")  # the agent's own call
        assert "error" in client.call(session, "fail")  # a failing tool call is recorded too
        assert "error" in client.call(session, "peek_answer")  # an attempt at a tool there is not: recorded too

        record = client.trajectory(session, bearer(GRADER))
        entries = record["entries"]
        assert record["truncated"] == 0 and record["session_id"] == session
        assert [(e["index"], e["kind"]) for e in entries] == [
            (0, "reset"),
            (1, "step"),
            (2, "tool"),
            (3, "tool"),
            (4, "tool"),
            (5, "tool"),
        ]
        reset, step, call, removal, failure, attempt = entries
        assert reset["action"] == {"seed": 7} and reset["observation"]["metadata"] == {"answer": SECRET}
        assert step["action"]["tool_name"] == "write" and step["action"]["arguments"] == {
            "path": "a.txt",
            "text": "A\n",
        }
        assert step["reward"] == 1.0 and step["done"] is False
        assert (call["tool"], call["arguments"]) == ("write", {"path": "b.txt", "text": "B\n"})
        assert call["result"]["structured_content"] == {"result": "wrote b.txt"}
        assert (removal["tool"], removal["arguments"]) == ("remove", {"path": "a.txt"})
        assert failure["tool"] == "fail" and "always fails" in failure["error"] and "result" not in failure
        assert attempt["tool"] == "peek_answer" and attempt["error"].startswith("tool_not_found")
        assert [e["time"] for e in entries] == sorted(e["time"] for e in entries)

        failed = http.post("/reset", json={"session_id": session, "fail": True}, headers=BOSS)
        assert failed.status_code == 500  # no new episode began: the record goes on, with the failure
        entries = client.trajectory(session)["entries"]
        assert len(entries) == 7 and entries[-1]["kind"] == "reset" and "this reset fails" in entries[-1]["error"]
        client.reset(session)
        assert [e["kind"] for e in client.trajectory(session)["entries"]] == ["reset"]


def test_the_grader_reads_the_trajectory_of_a_websocket_session_and_its_orchestrator_over_its_own_socket() -> None:
    with serve(notes_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)

        async def play() -> None:
            url = server.base_url.replace("http", "ws") + "/ws"
            async with ws_connect(url, additional_headers=BOSS) as ws:

                async def send(frame: Dict[str, Any]) -> Dict[str, Any]:
                    await ws.send(json.dumps(frame))
                    return json.loads(await ws.recv())

                await send({"type": "reset", "data": {}})
                action = {"type": "call_tool", "tool_name": "write", "arguments": {"path": "w.txt", "text": "ws\n"}}
                await send({"type": "step", "data": action})
                session = (await send({"type": "agent_token"}))["data"]["session_id"]
                # the grader reaches it by id, as it reaches any session
                kinds = [e["kind"] for e in client.trajectory(session, bearer(GRADER))["entries"]]
                assert kinds == ["reset", "step"]
                diff = client.diff(session, bearer(GRADER)).json()
                assert [e["path"] for e in diff["added"]] == ["w.txt"]
                # an id alone does not reach a socket's session, for the orchestrator either ...
                assert client.diff(session).status_code == 404
                # ... its own connection does
                rpc = {"jsonrpc": "2.0", "id": 3, "method": "openenv/session/trajectory", "params": {}}
                own = (await send({"type": "mcp", "data": rpc}))["data"]["result"]
                assert [e["kind"] for e in own["entries"]] == ["reset", "step"]

        asyncio.run(play())


def test_the_trajectory_keeps_its_latest_entries_within_its_bound_and_counts_the_rest() -> None:
    with serve(notes_app(max_trajectory_steps=5)) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)
        session = client.create()
        client.reset(session)
        for n in range(8):
            client.step(session, "write", path="n.txt", text=f"{n}\n")
        record = client.trajectory(session, bearer(GRADER))
        assert record["truncated"] == 4  # the reset and the first three steps
        assert [e["index"] for e in record["entries"]] == [4, 5, 6, 7, 8]
        assert [e["action"]["arguments"]["text"] for e in record["entries"]] == [f"{n}\n" for n in range(3, 8)]


def test_a_server_that_records_no_trajectory_says_how_to_turn_it_on() -> None:
    # no grader's token, no OPENENV_MAX_TRAJECTORY_STEPS: nothing is recorded
    with serve(notes_app(grader_token=None)) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)
        session = client.create()
        client.reset(session)
        answer = http.post("/openenv/trajectory", json={"session_id": session}, headers=BOSS)
        assert answer.status_code == 501 and answer.json()["code"] == "NOT_SUPPORTED"
        assert "OPENENV_MAX_TRAJECTORY_STEPS" in answer.json()["detail"]
    assert ServerSettings.resolve({}).trajectory_entries == 0
    assert ServerSettings.resolve({}, grader_token=GRADER).trajectory_entries == 10_000
    assert ServerSettings.resolve({"OPENENV_MAX_TRAJECTORY_STEPS": "0"}, grader_token=GRADER).trajectory_entries == 0
    with pytest.raises(ValueError, match="OPENENV_MAX_TRAJECTORY_STEPS must be a whole number"):
        ServerSettings.resolve({"OPENENV_MAX_TRAJECTORY_STEPS": "many"})


# --- the workspace diff ------------------------------------------------------------------------


def test_the_diff_shows_files_added_removed_and_modified_and_never_follows_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    with serve(notes_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)
        session = client.create()
        client.reset(session)
        assert client.diff(session).json()["added"] == []  # nothing since the reset
        client.step(session, "write", path="task.txt", text="line one\nline 2\n")
        client.step(session, "write", path="sub/new.txt", text="fresh\n")
        client.step(session, "link", path="to_file", target=str(outside / "secret.txt"))
        client.step(session, "link", path="to_dir", target=str(outside))
        client.step(session, "link", path="inside", target="task.txt")
        answer = client.diff(session, bearer(GRADER))
        assert answer.status_code == 200, answer.text
        diff = answer.json()
        assert SECRET not in answer.text  # neither link was followed
        added = {entry["path"]: entry for entry in diff["added"]}
        assert sorted(added) == ["inside", "sub", "sub/new.txt", "to_dir", "to_file"]
        assert added["to_file"] == {
            "path": "to_file",
            "type": "link",
            "size": len(str(outside / "secret.txt")),
            "mode": added["to_file"]["mode"],
            "target": str(outside / "secret.txt"),
            "outside": True,
        }
        assert added["to_dir"]["type"] == "link" and added["to_dir"]["outside"] is True
        assert added["inside"]["outside"] is False
        assert added["sub"]["type"] == "dir" and added["sub/new.txt"]["size"] == 6
        assert [(m["path"], m["changes"]) for m in diff["modified"]] == [("task.txt", ["content"])]
        assert diff["diffs"]["task.txt"].splitlines()[2:] == ["@@ -1,2 +1,2 @@", " line one", "-line two", "+line 2"]
        assert diff["diffs"]["sub/new.txt"].endswith("+fresh\n")
        assert diff["removed"] == [] and diff["since"] == "reset" and not diff["truncated"]

        client.step(session, "remove", path="task.txt")
        diff = client.diff(session).json()
        assert [entry["path"] for entry in diff["removed"]] == ["task.txt"]
        assert diff["diffs"]["task.txt"].endswith("-line one\n-line two\n")

        client.reset(session)  # a new baseline
        assert client.diff(session).json()["added"] == []


def test_the_diffs_bounds_hold(monkeypatch: Any) -> None:
    from openenv.core.env_server import workspace_diff

    with serve(notes_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)
        session = client.create()
        client.reset(session)
        deep = "/".join(["d"] * (workspace_diff.MAX_DEPTH + 3))
        client.step(session, "write", path=f"{deep}/bottom.txt", text="deep\n")
        client.step(session, "write", path="big.txt", text="x" * (workspace_diff.MAX_TEXT_FILE_BYTES + 1))
        client.step(session, "write", path="binary.dat", text="\0\1\2")
        diff = client.diff(session).json()
        assert diff["truncated"] is True  # the deepest directories are listed, not entered
        assert not any(entry["path"].endswith("bottom.txt") for entry in diff["added"])
        assert diff["omitted"]["big.txt"].startswith("larger than") and "binary.dat" in diff["omitted"]
        monkeypatch.setattr(workspace_diff, "MAX_ENTRIES", 5)  # (the server runs in this process)
        monkeypatch.setattr(workspace_diff, "MAX_DIFF_CHARS", 40)
        monkeypatch.setattr(workspace_diff, "MAX_HASH_BYTES", 10)
        client.reset(session)
        for name in "abcdefgh":
            client.step(session, "write", path=f"{name}.txt", text=f"{name * 30}\n")
        diff = client.diff(session).json()
        # the walk takes five entries, in sorted order (a..e.txt), and stops: past e.txt nothing is
        # compared, so task.txt is not reported removed, nor f..h.txt added
        assert diff["truncated"] is True and diff["removed"] == []
        assert [entry["path"] for entry in diff["added"]] == ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"]
        assert diff["unhashed"] is True  # past 10 bytes: compared by size and time
        assert sum(len(text) for text in diff["diffs"].values()) <= 40 and diff["omitted"]


def test_a_diff_without_a_workspace_or_a_baseline_says_why_and_the_server_keeps_serving() -> None:
    from ..envs import CounterAction, CounterEnv, CounterObservation

    counter = create_app(CounterEnv, CounterAction, CounterObservation, max_concurrent_envs=2)
    with serve(counter) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        session = Client(http).create()
        answer = http.post("/openenv/diff", json={"session_id": session})
        assert answer.status_code == 501 and "CounterEnv declares no workspace" in answer.json()["detail"]
    with serve(notes_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)
        session = client.create()
        answer = client.diff(session)  # never reset: nothing to compare with
        assert answer.status_code == 409 and "reset it first" in answer.json()["detail"]
        assert client.diff("no-such-session").status_code == 404
        for body in ({}, {"session_id": ""}, {"session_id": session, "extra": 1}, {"session_id": 7}):
            assert http.post("/openenv/diff", json=body, headers=BOSS).status_code == 422
        unnamed = client.rpc(BOSS, "openenv/session/diff").json()["error"]
        assert "is of a session: name one" in unnamed["message"]
        client.reset(session)
        assert client.diff(session).status_code == 200  # still serving


def test_a_session_whose_environment_was_rebuilt_after_a_timeout_has_no_baseline_until_its_reset() -> None:
    with serve(notes_app(step_timeout_s=0.5)) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)
        session = client.create()
        client.reset(session)
        timed_out = client.call(session, "nap", seconds=5)
        assert timed_out["error"]["data"]["code"] == "TIMEOUT", timed_out
        answer = client.diff(session)  # a fresh environment, never reset: its directory is not the one walked
        assert answer.status_code == 409 and "rebuilt" in answer.json()["detail"]
        assert client.trajectory(session)["entries"][-1]["error"].startswith("StepTimeoutError")
        client.reset(session)
        assert client.diff(session).status_code == 200


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
def test_the_diff_of_a_shell_env_session_shows_what_a_command_wrote() -> None:
    from shell_env.models import ShellObservation, ShellState
    from shell_env.server.shell_environment import ShellEnvironment

    made: List[ShellEnvironment] = []

    def factory() -> ShellEnvironment:
        made.append(ShellEnvironment(isolation="sandbox"))
        return made[-1]

    app = create_app(
        factory,
        CallToolAction,
        CallToolObservation,
        env_name="shell_env",
        max_concurrent_envs=2,
        reset_observation_cls=ShellObservation,
        state_cls=ShellState,
        auth_token=ORCHESTRATOR,
        grader_token=GRADER,
    )
    with serve(app) as server, httpx.Client(base_url=server.base_url, timeout=60) as http:
        client = Client(http)
        session = client.create()
        client.reset(session, task_id="edit_config")
        step = client.step(session, "run_command", command="echo made > out.txt && sed -i 's/true/false/' config.ini")
        assert step["observation"]["result"]["structured_content"]["exit_code"] == 0
        # a link out of the work directory, as a command of an unconfined deployment could leave one
        secret = Path(tempfile.mkdtemp()) / "secret.txt"
        secret.write_text(SECRET)
        os.symlink(secret, made[-1].workspace.path / "escape")
        answer = client.diff(session, bearer(GRADER))
        assert answer.status_code == 200, answer.text
        diff = answer.json()
        assert {e["path"]: e["type"] for e in diff["added"]} == {"escape": "link", "out.txt": "file"}
        assert diff["added"][0]["outside"] is True and SECRET not in answer.text
        assert diff["diffs"]["out.txt"].endswith("+made\n")
        assert [m["path"] for m in diff["modified"]] == ["config.ini"]
        assert "-debug = true" in diff["diffs"]["config.ini"] and "+debug = false" in diff["diffs"]["config.ini"]
        os.unlink(made[-1].workspace.path / "escape")
        shutil.rmtree(secret.parent)

        # a session restored from a snapshot: its record and its baseline start at the restore
        snapshot = http.post("/openenv/snapshot", json={"session_id": session}, headers=BOSS).json()["snapshot"]
        copy = client.create()
        restored = http.post("/openenv/restore", json={"session_id": copy, "snapshot": snapshot}, headers=BOSS)
        assert restored.status_code == 200, restored.text
        diff = client.diff(copy, bearer(GRADER)).json()
        assert (diff["since"], diff["added"], diff["modified"]) == ("restore", [], [])
        assert [e["kind"] for e in client.trajectory(copy, bearer(GRADER))["entries"]] == ["restore"]
        client.step(copy, "run_command", command="rm out.txt")
        assert [e["path"] for e in client.diff(copy).json()["removed"]] == ["out.txt"]
        assert [e["kind"] for e in client.trajectory(copy)["entries"]] == ["restore", "step"]


# --- the observer's metrics --------------------------------------------------------------------


def test_metrics_count_progress_and_never_carry_what_a_session_saw() -> None:
    with serve(notes_app()) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        client = Client(http)
        a, b = client.create(), client.create()
        client.reset(a)
        client.step(a, "write", path="x.txt", text=SECRET)
        client.step(a, "finish")
        client.reset(b)
        assert "error" in client.call(b, "fail")
        observer = bearer(OBSERVER)
        answer = http.get("/openenv/metrics", headers=observer)
        assert answer.status_code == 200
        metrics = answer.json()
        assert SECRET not in answer.text
        assert SECRET not in json.dumps(client.result(observer, "openenv/metrics"))
        assert (metrics["active_sessions"], metrics["max_sessions"]) == (2, 8)
        assert (metrics["resets"], metrics["steps"], metrics["episodes_done"], metrics["errors"]) == (2, 2, 1, 1)
        progress = {entry["session_id"]: entry for entry in metrics["sessions"]}
        assert set(progress[a]) == {
            "session_id",
            "kind",
            "steps",
            "total_steps",
            "episodes",
            "done",
            "last_reward",
            "reward_total",
            "age_s",
            "idle_s",
        }
        assert (progress[a]["steps"], progress[a]["done"], progress[a]["reward_total"]) == (2, True, 2.0)
        assert (progress[b]["steps"], progress[b]["done"], progress[b]["last_reward"]) == (0, False, 0.0)
        client.reset(a)
        again = {e["session_id"]: e for e in http.get("/openenv/metrics", headers=observer).json()["sessions"]}
        assert (again[a]["steps"], again[a]["done"], again[a]["episodes"], again[a]["total_steps"]) == (0, False, 2, 2)


def test_a_trainer_s_client_reads_its_own_session_s_trajectory_diff_and_grade() -> None:
    """``EnvClient.trajectory()``, ``diff()`` and ``grade()`` (and the sync client's) ask over the
    client's own connection, for its own session: no id, no grader's token. What cannot be
    answered raises an error that says why, and the connection goes on serving."""
    from openenv.core.client_errors import EnvClientError
    from openenv.core.generic_client import GenericEnvClient

    from .test_roles import ANSWER, quiz_app

    write = {"type": "call_tool", "tool_name": "write", "arguments": {"path": "a.txt", "text": "hello\n"}}
    with serve(notes_app()) as server:

        async def play() -> None:
            async with GenericEnvClient(base_url=server.base_url, headers=BOSS) as env:
                with pytest.raises(EnvClientError, match="reset it first"):
                    await env.diff()
                await env.reset()
                await env.step(write)
                record = await env.trajectory()
                assert [e["kind"] for e in record["entries"]] == ["reset", "step"]
                assert record["session_id"] and record["truncated"] == 0
                diff = await env.diff()
                assert [e["path"] for e in diff["added"]] == ["a.txt"] and "+hello" in diff["diffs"]["a.txt"]
                with pytest.raises(EnvClientError, match="SUPPORTS_SNAPSHOT"):
                    await env.grade()  # (the check runs on a copy: the notes environment makes none)
                assert (await env.step(write)).observation["result"]["data"] == "wrote a.txt"

        asyncio.run(play())
        with GenericEnvClient(base_url=server.base_url, headers=BOSS).sync() as env:
            env.reset()
            assert [e["kind"] for e in env.trajectory()["entries"]] == ["reset"]
            assert env.diff()["added"] == []

    with serve(quiz_app()) as server:
        with GenericEnvClient(base_url=server.base_url, headers=bearer("orchestrator-token-0123456789")).sync() as env:
            env.reset()
            env.step({"type": "call_tool", "tool_name": "guess", "arguments": {"value": ANSWER}})
            assert env.grade() == {"correct": True, "guesses": 1}
            assert env.grade() == {"correct": True, "guesses": 1}  # run on a copy: the episode is untouched

    with serve(notes_app(auth_token=None)) as server:  # no grader's token: nothing recorded
        with GenericEnvClient(base_url=server.base_url).sync() as env:
            env.reset()
            with pytest.raises(EnvClientError, match="OPENENV_MAX_TRAJECTORY_STEPS"):
                env.trajectory()
            assert env.state() is not None
