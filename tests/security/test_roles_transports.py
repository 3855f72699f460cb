"""Roles, transport by transport: each credential x each operation that a transport itself offers
is allowed or refused exactly as the table of docs/roles.md says (roles_matrix.TABLE, written out
independently of ``openenv.core.env_server.roles``: changing one cell there fails these tests).

No transport answers for another: HTTP is asked its routes (the environment's, ours under
``/openenv``, the Task API, FastAPI's docs, the web playground), ``POST /mcp`` its JSON-RPC methods
(the session named in ``params`` and, as MCP clients do, in ``Mcp-Session-Id``), ``/ws`` and
``WS /mcp`` their handshake for every credential and, for the one credential that gets past it,
every frame; then the ``--workers`` front, two sandboxed processes behind one URL. (A RayEnvPool:
test_roles_ray.py.) Every cell acts on session A; real server on 127.0.0.1, real clients.

A refusal runs nothing: the in-process server's environment records the marker each cell's reset,
step or guess carries, and exactly the allowed cells' markers are there afterwards; behind the
front, session A's and B's guesses say the same.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, Iterator, Optional

import httpx
import pytest
from websockets.exceptions import ConnectionClosedOK, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from ..conftest import serve
from .roles_matrix import (
    FORBIDDEN,
    GRADER,
    OBSERVER,
    OK,
    ORCHESTRATOR,
    QUIZ,
    UNAUTHORIZED,
    WHO,
    WRONG,
    Matrix,
    bearer,
    load_quiz,
    outcome,
    rpc_body,
    rpc_outcome,
    sandboxed_code_under_test,
)

quiz = load_quiz()
ROLE_TOKENS = {"OPENENV_AUTH_TOKEN": ORCHESTRATOR, "OPENENV_GRADER_TOKEN": GRADER, "OPENENV_OBSERVER_TOKEN": OBSERVER}


@dataclasses.dataclass
class World:
    """A server with every role's token, and sessions A (every cell's), B and C (closed)."""

    url: str
    http: httpx.Client
    tokens: Dict[str, Optional[str]]
    a: str
    b: str
    snapshot: str  # of A, for the restores

    def headers(self, who: str, **extra: str) -> Dict[str, str]:
        return {**bearer(self.tokens[who]), **extra}

    def rpc(self, who: str, method: str, header_session: Optional[str] = None, **params: Any) -> httpx.Response:
        extra = {"Mcp-Session-Id": header_session} if header_session else {}
        return self.http.post("/mcp", json=rpc_body(method, **params), headers=self.headers(who, **extra))

    def create(self) -> str:
        return self.rpc("orchestrator", "openenv/session/create").json()["result"]["session_id"]

    def close(self, session_id: str) -> None:
        self.rpc("orchestrator", "openenv/session/close", session_id=session_id)  # (it may be closed already)

    def mint(self, session_id: str) -> str:
        answer = self.http.post(
            "/openenv/agent_token", json={"session_id": session_id}, headers=self.headers("orchestrator")
        )
        return answer.json()["token"]


def make_world(url: str, http: httpx.Client) -> World:
    tokens: Dict[str, Optional[str]] = {"orchestrator": ORCHESTRATOR, "grader": GRADER, "observer": OBSERVER}
    world = World(url, http, tokens, "", "", "")
    world.a, world.b, c = world.create(), world.create(), world.create()
    tokens["stale_agent"] = world.mint(c)
    world.close(c)
    tokens.update(agent=world.mint(world.a), other_agent=world.mint(world.b), none=None, wrong=WRONG)
    answer = http.post("/openenv/snapshot", json={"session_id": world.a}, headers=world.headers("orchestrator"))
    world.snapshot = answer.json()["snapshot"]
    return world


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    app = quiz.quiz_app(auth_token=ORCHESTRATOR, grader_token=GRADER, observer_token=OBSERVER, web=True)
    with serve(app) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        yield make_world(server.base_url, http)


def finish(matrix: Matrix, cells: int) -> None:
    print(matrix.report())
    assert not matrix.wrong, "\n".join(map(str, matrix.wrong))
    assert matrix.cells == cells


def ran_markers() -> set:
    return {value for _, value in quiz.RAN}


def guess(value: str) -> Dict[str, Any]:
    return {"type": "call_tool", "tool_name": "guess", "arguments": {"value": value}}


# --- (a) HTTP routes and the web playground ------------------------------------------------------


def test_http_routes_and_the_playground_allow_and_refuse_as_the_table_says(world: World) -> None:
    quiz.RAN.clear()
    http, a = world.http, world.a
    matrix = Matrix("http")

    def throwaway(call: Callable[[str], httpx.Response]) -> httpx.Response:
        """``call`` on a session of its own (closed afterwards, if the call did not)."""
        session = world.create()
        try:
            return call(session)
        finally:
            world.close(session)

    # label -> (row, call(who, marker) -> response)
    routes: Dict[str, Any] = {
        "POST /reset": ("reset", lambda h, m: http.post("/reset", json={"session_id": a, "episode_id": m}, headers=h)),
        "POST /step": ("step", lambda h, m: http.post("/step", json={"session_id": a, "action": guess(m)}, headers=h)),
        "GET /state": ("state", lambda h, m: http.get("/state", params={"session_id": a}, headers=h)),
        "GET /metadata": ("metadata", lambda h, m: http.get("/metadata", headers=h)),
        "GET /schema": ("schema", lambda h, m: http.get("/schema", headers=h)),
        "GET /health": ("health", lambda h, m: http.get("/health", headers=h)),
        "GET /openenv/capacity": ("capacity", lambda h, m: http.get("/openenv/capacity", headers=h)),
        "GET /list_environments": ("schema", lambda h, m: http.get("/list_environments", headers=h)),
        "POST /openenv/snapshot": (
            "snapshot",
            lambda h, m: http.post("/openenv/snapshot", json={"session_id": a}, headers=h),
        ),
        "POST /openenv/restore": (
            "restore",
            lambda h, m: http.post("/openenv/restore", json={"session_id": a, "snapshot": world.snapshot}, headers=h),
        ),
        "POST /openenv/agent_token": (
            "mint",
            lambda h, m: http.post("/openenv/agent_token", json={"session_id": a}, headers=h),
        ),
        "POST /openenv/grade": ("grade", lambda h, m: http.post("/openenv/grade", json={"session_id": a}, headers=h)),
        "POST /openenv/trajectory": (
            "trajectory",
            lambda h, m: http.post("/openenv/trajectory", json={"session_id": a}, headers=h),
        ),
        "POST /openenv/diff": ("diff", lambda h, m: http.post("/openenv/diff", json={"session_id": a}, headers=h)),
        "GET /openenv/metrics": ("metrics", lambda h, m: http.get("/openenv/metrics", headers=h)),
        "GET /quiz/splits": ("task", lambda h, m: http.get("/quiz/splits", headers=h)),
        "POST /quiz/tasks": ("task", lambda h, m: http.post("/quiz/tasks", json={"split": "test"}, headers=h)),
        "POST /quiz/num_tasks": ("task", lambda h, m: http.post("/quiz/num_tasks", json={"split": "test"}, headers=h)),
        "POST /quiz/task": (
            "task",
            lambda h, m: http.post("/quiz/task", json={"split": "test", "index": 0}, headers=h),
        ),
        "POST /quiz/task_range": (
            "task",
            lambda h, m: http.post("/quiz/task_range", json={"split": "test", "start": 0, "stop": 1}, headers=h),
        ),
        "GET /openapi.json": ("schema", lambda h, m: http.get("/openapi.json", headers=h)),
        "GET /docs": ("schema", lambda h, m: http.get("/docs", headers=h)),
        "GET /redoc": ("schema", lambda h, m: http.get("/redoc", headers=h)),
        # the web playground
        "GET /web/": ("page", lambda h, m: http.get("/web/", headers=h)),
        "GET /web/playground.js": ("page", lambda h, m: http.get("/web/playground.js", headers=h)),
        "GET /web/playground.css": ("page", lambda h, m: http.get("/web/playground.css", headers=h)),
        "GET /web/metadata": ("metadata", lambda h, m: http.get("/web/metadata", headers=h)),
        "POST /web/session": ("create", lambda h, m: web_create(http, world, h)),
        "DELETE /web/session": (
            "close",
            lambda h, m: throwaway(lambda s: http.delete("/web/session", headers={**h, "X-OpenEnv-Session": s})),
        ),
        "POST /web/reset": (
            "reset",
            lambda h, m: http.post("/web/reset", json={"episode_id": m}, headers={**h, "X-OpenEnv-Session": a}),
        ),
        "POST /web/step": (
            "step",
            lambda h, m: http.post("/web/step", json={"action": guess(m)}, headers={**h, "X-OpenEnv-Session": a}),
        ),
        "GET /web/state": ("state", lambda h, m: http.get("/web/state", headers={**h, "X-OpenEnv-Session": a})),
    }
    for label, (row, call) in routes.items():
        for who in WHO:
            matrix.check(label, row, who, outcome(call(world.headers(who), matrix.marker(label, row, who))))
    finish(matrix, 32 * len(WHO))
    assert not matrix.ran_exactly_the_allowed(ran_markers()), matrix.ran_exactly_the_allowed(ran_markers())


def web_create(http: httpx.Client, world: World, headers: Dict[str, str]) -> httpx.Response:
    made = http.post("/web/session", json={}, headers=headers)
    if made.status_code == 200:
        world.close(made.json()["session_id"])
    return made


# --- (b) JSON-RPC over POST /mcp -----------------------------------------------------------------


@pytest.mark.parametrize("naming", ["params", "Mcp-Session-Id"])
def test_json_rpc_over_post_mcp_allows_and_refuses_as_the_table_says(world: World, naming: str) -> None:
    """Every method, session A named in ``params.session_id`` (OpenEnv's clients) or in the
    ``Mcp-Session-Id`` header (MCP clients'); and ``DELETE /mcp``, which closes the header's."""
    quiz.RAN.clear()
    matrix = Matrix(f"POST /mcp ({naming})")
    a = world.a

    def call(who: str, method: str, **params: Any) -> str:
        if naming == "params":
            response = world.rpc(who, method, session_id=a, **params)
        else:
            response = world.rpc(who, method, header_session=a, **params)
        return outcome(response, who)

    def create(who: str, marker: str) -> str:
        response = world.rpc(who, "openenv/session/create", header_session=a if naming != "params" else None)
        made = (response.json().get("result") or {}).get("session_id") if response.status_code == 200 else None
        if made:
            world.close(made)
        return outcome(response, who)

    def close(who: str, marker: str) -> str:
        session = world.create()
        try:
            extra = {"Mcp-Session-Id": a} if naming != "params" else {}
            body = rpc_body("openenv/session/close", session_id=session)
            return outcome(world.http.post("/mcp", json=body, headers=world.headers(who, **extra)), who)
        finally:
            world.close(session)

    methods: Dict[str, Any] = {
        "initialize": ("mcp lifecycle", lambda who, m: call(who, "initialize", protocolVersion="2025-06-18")),
        "ping": ("mcp lifecycle", lambda who, m: call(who, "ping")),
        "tools/list": ("tools/list", lambda who, m: call(who, "tools/list")),
        "tools/call guess": (
            "call agent tool",
            lambda who, m: call(who, "tools/call", name="guess", arguments={"value": m}),
        ),
        "tools/call check": ("call grader tool", lambda who, m: call(who, "tools/call", name="check", arguments={})),
        "openenv/session/create": ("create", create),
        "openenv/session/close": ("close", close),
        "openenv/session/snapshot": ("snapshot", lambda who, m: call(who, "openenv/session/snapshot")),
        "openenv/session/restore": (
            "restore",
            lambda who, m: call(who, "openenv/session/restore", snapshot=world.snapshot),
        ),
        "openenv/session/grade": ("grade", lambda who, m: call(who, "openenv/session/grade")),
        "openenv/session/trajectory": ("trajectory", lambda who, m: call(who, "openenv/session/trajectory")),
        "openenv/session/diff": ("diff", lambda who, m: call(who, "openenv/session/diff")),
        "openenv/metrics": ("metrics", lambda who, m: call(who, "openenv/metrics")),
        "openenv/session/agent_token": ("mint", lambda who, m: call(who, "openenv/session/agent_token")),
    }
    for label, (row, run) in methods.items():
        for who in WHO:
            matrix.check(label, row, who, run(who, matrix.marker(label, row, who)))
    for who in WHO:  # DELETE /mcp: closes the MCP session its header names
        session = world.create()
        try:
            deleted = world.http.delete("/mcp", headers=world.headers(who, **{"Mcp-Session-Id": session}))
        finally:
            world.close(session)
        got = OK if deleted.status_code == 204 else {401: UNAUTHORIZED, 403: FORBIDDEN}.get(deleted.status_code, "?")
        matrix.check("DELETE /mcp", "close", who, got)
    finish(matrix, 15 * len(WHO))
    assert not matrix.ran_exactly_the_allowed(ran_markers()), matrix.ran_exactly_the_allowed(ran_markers())


def test_an_agent_naming_another_session_in_params_is_refused_not_redirected_to_its_own(world: World) -> None:
    """``POST /mcp`` without ``Mcp-Session-Id`` runs an agent's calls on its own session; a call
    that names another one in ``params`` is refused, as docs/roles.md says, rather than quietly run
    on the agent's own session instead."""
    quiz.RAN.clear()
    refused = world.rpc("other_agent", "tools/call", session_id=world.a, name="guess", arguments={"value": "x"})
    assert outcome(refused, "other_agent") == FORBIDDEN, refused.text
    assert "own session" in refused.json()["error"]["message"]
    own = world.rpc("other_agent", "tools/call", session_id=world.b, name="guess", arguments={"value": "y"})
    assert outcome(own, "other_agent") == OK, own.text
    assert ran_markers() == {"y"}


# --- (c) /ws and (d) WS /mcp ---------------------------------------------------------------------


def handshake(world: World, path: str, who: str) -> str:
    url = world.url.replace("http", "ws", 1) + path
    try:
        with ws_connect(url, additional_headers=world.headers(who), open_timeout=10):
            return OK
    except InvalidStatus as exc:
        status, body = exc.response.status_code, exc.response.body or b""
        if status == 401 and b"UNAUTHORIZED" in body:
            return UNAUTHORIZED
        if status == 403 and b"FORBIDDEN" in body:
            return FORBIDDEN
        return f"handshake answered {status}: {body[:200]!r}"


def exchange(ws: ClientConnection, message: Dict[str, Any]) -> Dict[str, Any]:
    ws.send(json.dumps(message))
    return json.loads(ws.recv(timeout=30))


def frame_outcome(frame: Dict[str, Any], expected_type: str) -> str:
    if frame.get("type") == "mcp":
        return rpc_outcome(frame.get("data"), "orchestrator")
    if frame.get("type") == "error":
        data = frame.get("data") or {}
        return FORBIDDEN if data.get("code") == "FORBIDDEN" else f"error frame: {data}"
    return OK if frame.get("type") == expected_type else f"answered {frame!r:.200}"


def test_ws_handshakes_and_the_orchestrator_s_frames_follow_the_table(world: World) -> None:
    """``/ws`` opens a session (new, or attaching a detached one by ``?session_id=``): the
    orchestrator's alone, so every other credential is refused at the handshake and sends no
    frame at all; the orchestrator's connection then serves every frame type."""
    quiz.RAN.clear()
    matrix = Matrix("/ws")
    for label, path in (("handshake", "/ws"), ("handshake ?session_id=A", f"/ws?session_id={world.a}")):
        for who in WHO:
            matrix.check(label, "create", who, handshake(world, path, who))
    url = world.url.replace("http", "ws", 1) + "/ws"
    who = "orchestrator"
    with ws_connect(url, additional_headers=world.headers(who), open_timeout=10) as ws:
        frames: Dict[str, Any] = {
            "reset": ("reset", "observation", lambda m: {"type": "reset", "data": {"episode_id": m}}),
            "step": ("step", "observation", lambda m: {"type": "step", "data": guess(m)}),
            "state": ("state", "state", lambda m: {"type": "state"}),
            "snapshot": ("snapshot", "snapshot", lambda m: {"type": "snapshot"}),
            "restore": ("restore", "restore", lambda m: {"type": "restore", "data": {"snapshot": world.snapshot}}),
            "agent_token": ("mint", "agent_token", lambda m: {"type": "agent_token"}),
            "grade": ("grade", "grade", lambda m: {"type": "grade"}),
            "trajectory": ("trajectory", "trajectory", lambda m: {"type": "trajectory"}),
            "diff": ("diff", "diff", lambda m: {"type": "diff"}),
        }
        mcp_frames: Dict[str, Any] = {
            "initialize": ("mcp lifecycle", lambda m: rpc_body("initialize")),
            "ping": ("mcp lifecycle", lambda m: rpc_body("ping")),
            "tools/list": ("tools/list", lambda m: rpc_body("tools/list")),
            "tools/call guess": (
                "call agent tool",
                lambda m: rpc_body("tools/call", name="guess", arguments={"value": m}),
            ),
            "tools/call check": ("call grader tool", lambda m: rpc_body("tools/call", name="check", arguments={})),
            "openenv/session/create": ("create", lambda m: rpc_body("openenv/session/create")),
            "openenv/session/snapshot": ("snapshot", lambda m: rpc_body("openenv/session/snapshot")),
            "openenv/session/restore": (
                "restore",
                lambda m: rpc_body("openenv/session/restore", snapshot=world.snapshot),
            ),
            "openenv/session/grade": ("grade", lambda m: rpc_body("openenv/session/grade")),
            "openenv/session/trajectory": ("trajectory", lambda m: rpc_body("openenv/session/trajectory")),
            "openenv/session/diff": ("diff", lambda m: rpc_body("openenv/session/diff")),
            "openenv/metrics": ("metrics", lambda m: rpc_body("openenv/metrics")),
            "openenv/session/agent_token": ("mint", lambda m: rpc_body("openenv/session/agent_token")),
        }
        for label, (row, expected_type, make) in frames.items():
            answer = exchange(ws, make(matrix.marker(label, row, who)))
            matrix.check(label, row, who, frame_outcome(answer, expected_type))
        for label, (row, make) in mcp_frames.items():
            answer = exchange(ws, {"type": "mcp", "data": make(matrix.marker(f"mcp {label}", row, who))})
            matrix.check(f"mcp {label}", row, who, frame_outcome(answer, "mcp"))
        other = world.create()
        answer = exchange(ws, {"type": "mcp", "data": rpc_body("openenv/session/close", session_id=other)})
        matrix.check("mcp openenv/session/close", "close", who, frame_outcome(answer, "mcp"))
        ws.send(json.dumps({"type": "close"}))
        try:
            ws.recv(timeout=10)
            closed = "the connection stayed open"
        except ConnectionClosedOK:
            closed = OK
        matrix.check("close", "close", who, closed)
    finish(matrix, 2 * len(WHO) + len(frames) + len(mcp_frames) + 2)
    assert not matrix.ran_exactly_the_allowed(ran_markers()), matrix.ran_exactly_the_allowed(ran_markers())


def test_ws_mcp_handshakes_and_the_orchestrator_s_methods_follow_the_table(world: World) -> None:
    quiz.RAN.clear()
    matrix = Matrix("WS /mcp")
    for label, path in (("handshake", "/mcp"), ("handshake ?session_id=A", f"/mcp?session_id={world.a}")):
        for who in WHO:
            matrix.check(label, "create", who, handshake(world, path, who))
    url = world.url.replace("http", "ws", 1) + "/mcp"
    who = "orchestrator"
    other = world.create()
    methods: Dict[str, Any] = {
        "initialize": ("mcp lifecycle", lambda m: rpc_body("initialize")),
        "ping": ("mcp lifecycle", lambda m: rpc_body("ping")),
        "tools/list": ("tools/list", lambda m: rpc_body("tools/list")),
        "tools/call guess": ("call agent tool", lambda m: rpc_body("tools/call", name="guess", arguments={"value": m})),
        "tools/call check": ("call grader tool", lambda m: rpc_body("tools/call", name="check", arguments={})),
        "openenv/session/create": ("create", lambda m: rpc_body("openenv/session/create")),
        "openenv/session/close": ("close", lambda m: rpc_body("openenv/session/close", session_id=other)),
        "openenv/session/snapshot": ("snapshot", lambda m: rpc_body("openenv/session/snapshot")),
        "openenv/session/restore": ("restore", lambda m: rpc_body("openenv/session/restore", snapshot=world.snapshot)),
        "openenv/session/grade": ("grade", lambda m: rpc_body("openenv/session/grade")),
        "openenv/session/trajectory": ("trajectory", lambda m: rpc_body("openenv/session/trajectory")),
        "openenv/session/diff": ("diff", lambda m: rpc_body("openenv/session/diff")),
        "openenv/metrics": ("metrics", lambda m: rpc_body("openenv/metrics")),
        "openenv/session/agent_token": ("mint", lambda m: rpc_body("openenv/session/agent_token")),
    }
    with ws_connect(url, additional_headers=world.headers(who), open_timeout=10) as ws:
        for label, (row, make) in methods.items():
            answer = exchange(ws, make(matrix.marker(label, row, who)))
            matrix.check(label, row, who, rpc_outcome(answer, who))
    finish(matrix, 2 * len(WHO) + len(methods))
    assert not matrix.ran_exactly_the_allowed(ran_markers()), matrix.ran_exactly_the_allowed(ran_markers())


# --- (e) behind the --workers front --------------------------------------------------------------


@pytest.fixture(scope="module")
def front() -> Iterator[World]:
    """``openenv serve --workers 2``'s pool: two sandboxed servers of the quiz package behind one
    front, the role tokens in their environment (as the command hands them on from its own)."""
    from openenv.core.containers.runtime import SandboxPool

    options = sandboxed_code_under_test()
    options["env_vars"].update(ROLE_TOKENS)
    with SandboxPool(str(QUIZ), workers=2, **options) as pool:
        assert pool.base_url is not None
        with httpx.Client(base_url=pool.base_url, timeout=30) as http:
            yield make_world(pool.base_url, http)


def test_behind_the_workers_front_each_process_enforces_the_table(front: World) -> None:
    """Sessions A and B live on different processes: the front routes every call to the process
    holding the session it names (or, for an agent credential naming none, the one its credential
    was minted for), and that process decides by the same table."""
    world, http, a = front, front.http, front.a
    assert a.split("-")[0] != world.b.split("-")[0], (a, world.b)  # one session on each process
    matrix = Matrix("front", foreign_agents=True)

    def rpc(h: Dict[str, str], method: str, **params: Any) -> httpx.Response:
        return http.post("/mcp", json=rpc_body(method, **params), headers=h)

    routes: Dict[str, Any] = {
        "POST /reset": ("reset", lambda h, m: http.post("/reset", json={"session_id": a, "episode_id": m}, headers=h)),
        "POST /step": ("step", lambda h, m: http.post("/step", json={"session_id": a, "action": guess(m)}, headers=h)),
        "GET /state": ("state", lambda h, m: http.get("/state", params={"session_id": a}, headers=h)),
        "GET /metadata": ("metadata", lambda h, m: http.get("/metadata", headers=h)),
        "POST /openenv/snapshot": (
            "snapshot",
            lambda h, m: http.post("/openenv/snapshot", json={"session_id": a}, headers=h),
        ),
        "POST /openenv/agent_token": (
            "mint",
            lambda h, m: http.post("/openenv/agent_token", json={"session_id": a}, headers=h),
        ),
        "POST /openenv/grade": ("grade", lambda h, m: http.post("/openenv/grade", json={"session_id": a}, headers=h)),
        "POST /openenv/trajectory": (
            "trajectory",
            lambda h, m: http.post("/openenv/trajectory", json={"session_id": a}, headers=h),
        ),
        "POST /openenv/diff": ("diff", lambda h, m: http.post("/openenv/diff", json={"session_id": a}, headers=h)),
        "GET /openenv/metrics": ("metrics", lambda h, m: http.get("/openenv/metrics", headers=h)),
        "tools/list": ("tools/list", lambda h, m: rpc(h, "tools/list", session_id=a)),
        "tools/call guess": (
            "call agent tool",
            lambda h, m: rpc(h, "tools/call", session_id=a, name="guess", arguments={"value": m}),
        ),
        "tools/call check": ("call grader tool", lambda h, m: rpc(h, "tools/call", session_id=a, name="check")),
        "tools/call guess, no session named": (
            "call agent tool, own session",
            lambda h, m: rpc(h, "tools/call", name="guess", arguments={"value": m}),
        ),
    }
    markers: Dict[str, str] = {}
    for label, (row, call) in routes.items():
        for who in WHO:
            markers[label, who] = matrix.marker(label, row, who)  # type: ignore[index]
            matrix.check(label, row, who, outcome(call(world.headers(who), markers[label, who]), who))  # type: ignore[index]
    for who in WHO:
        matrix.check("/ws handshake", "create", who, handshake(world, "/ws", who))
    finish(matrix, (len(routes) + 1) * len(WHO))

    # What ran, where: A was reset by the orchestrator, then guessed at by the calls allowed on it
    # (the orchestrator's and its agent's); B only by its own agent's call that named no session.
    boss = world.headers("orchestrator")
    state_a = http.get("/state", params={"session_id": a}, headers=boss).json()
    state_b = http.get("/state", params={"session_id": world.b}, headers=boss).json()
    assert state_a["episode_id"] == markers["POST /reset", "orchestrator"]  # type: ignore[index]
    assert state_a["guesses"] == [
        markers["POST /step", "orchestrator"],  # type: ignore[index]
        markers["tools/call guess", "orchestrator"],  # type: ignore[index]
        markers["tools/call guess", "agent"],  # type: ignore[index]
        markers["tools/call guess, no session named", "agent"],  # type: ignore[index]
    ]
    assert state_b["guesses"] == [markers["tools/call guess, no session named", "other_agent"]]  # type: ignore[index]
