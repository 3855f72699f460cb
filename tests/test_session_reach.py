"""A WebSocket's session is reached only through its own connection, or a resume with its token.

Session ids are not secrets: a resumable ``/ws`` hands its id back in a handshake header, ids go to
logs, proxies and error messages. So every transport that takes a session id (HTTP ``/step``,
``/state``, ``/reset``, ``POST``/``DELETE /mcp`` with ``Mcp-Session-Id`` or ``params.session_id``,
``openenv/session/*`` over HTTP, ``WS /mcp`` or a ``/ws`` frame, the web playground's
``X-OpenEnv-Session`` routes, a second ``/ws?session_id=``) answers an id that names a socket's
session exactly as it answers an id the server never made: the attacker learns nothing, and the
victim's episode goes on untouched, while it is attached and while it waits for its resume.
Sessions made over HTTP (``openenv/session/create``, the playground's) stay reachable by id: that
is upstream's HTTP model, tested in test_mcp.py, test_web.py and test_resume.py.

Each test attacks a real server on 127.0.0.1 with real HTTP and WebSocket clients; the victim is
a real client, behind a fault-injecting proxy where its connection is to drop.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Awaitable, Callable, Dict, Iterator

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.generic_client import GenericEnvClient
from openenv.testing.faults import FaultProxy

from .conftest import serve, until
from .envs import ToolEnv

ADD = {"type": "call_tool", "tool_name": "add", "arguments": {"a": 100}}
"""What an attacker's step runs on the victim's environment: one more call in its counter."""


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    """One server for the module (each test's sessions are gone when it ends): an MCP
    environment whose ``add`` tool counts calls and whose ``peek`` tool reads that count, with
    the web playground on."""
    app = create_app(ToolEnv, CallToolAction, CallToolObservation, env_name="tools", max_concurrent_envs=4, web=True)
    with serve(app) as running:
        yield running


def manager_of(server: BackgroundServer) -> Any:
    return server.server.config.app.state.openenv_server.manager


def rpc(method: str, params: Dict[str, Any]) -> Dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


# --- the attacks: each names the session by its id alone, and returns what it was answered ---------

Attack = Callable[[httpx.AsyncClient, str, str], Awaitable[Any]]


async def http_step(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.post("/step", json={"action": ADD, "session_id": session_id})
    return answer.status_code, answer.text


async def http_step_numbered(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    body = {"action": ADD, "session_id": session_id}
    answer = await http.post("/step", json=body, headers={"X-OpenEnv-Seq": "999999"})
    return answer.status_code, answer.text


async def http_state(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.get("/state", params={"session_id": session_id})
    return answer.status_code, answer.text


async def http_reset(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.post("/reset", json={"session_id": session_id})
    return answer.status_code, answer.text


async def mcp_call_tool(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    params = {"name": "add", "arguments": {"a": 100}, "session_id": session_id}
    answer = await http.post("/mcp", json=rpc("tools/call", params))
    return answer.status_code, answer.text


async def mcp_read_state(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.post("/mcp", json=rpc("tools/call", {"name": "peek", "session_id": session_id}))
    return answer.status_code, answer.text


async def mcp_session_header(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    headers = {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-06-18"}
    answer = await http.post("/mcp", json=rpc("tools/call", {"name": "add", "arguments": {"a": 100}}), headers=headers)
    return answer.status_code, answer.text


async def mcp_close(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.post("/mcp", json=rpc("openenv/session/close", {"session_id": session_id}))
    return answer.status_code, answer.text


async def mcp_delete(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.delete("/mcp", headers={"Mcp-Session-Id": session_id})
    return answer.status_code, answer.text


async def ws_mcp_close(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    """``openenv/session/close`` from another client's ``WS /mcp`` connection."""
    async with ws_connect(f"{ws_base}/mcp") as ws:
        await ws.send(json.dumps(rpc("openenv/session/close", {"session_id": session_id})))
        return await ws.recv()


async def ws_frame_close(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    """``openenv/session/close`` in an ``{"type": "mcp"}`` frame of another client's ``/ws``."""
    async with ws_connect(f"{ws_base}/ws") as ws:
        await ws.send(json.dumps({"type": "mcp", "data": rpc("openenv/session/close", {"session_id": session_id})}))
        return await ws.recv()


async def web_step(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.post("/web/step", json={"action": ADD}, headers={"X-OpenEnv-Session": session_id})
    return answer.status_code, answer.text


async def web_state(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.get("/web/state", headers={"X-OpenEnv-Session": session_id})
    return answer.status_code, answer.text


async def web_reset(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.post("/web/reset", json={}, headers={"X-OpenEnv-Session": session_id})
    return answer.status_code, answer.text


async def web_close(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    answer = await http.delete("/web/session", headers={"X-OpenEnv-Session": session_id})
    return answer.status_code, answer.text


async def ws_attach(http: httpx.AsyncClient, ws_base: str, session_id: str) -> Any:
    """A second ``/ws?session_id=``, asking for resume too: no token, no session."""
    url = f"{ws_base}/ws?session_id={session_id}"
    async with ws_connect(url, additional_headers={"X-OpenEnv-Resume": "1"}) as ws:
        granted = sorted(k for k in ws.response.headers if k.lower().startswith("x-openenv"))
        frame = await ws.recv()
        try:
            await ws.recv()
        except ConnectionClosed:
            pass
        return granted, frame, ws.close_code


ATTACKS = [
    http_step,
    http_step_numbered,
    http_state,
    http_reset,
    mcp_call_tool,
    mcp_read_state,
    mcp_session_header,
    mcp_close,
    mcp_delete,
    ws_mcp_close,
    ws_frame_close,
    web_step,
    web_state,
    web_reset,
    web_close,
    ws_attach,
]


async def answered_as_unknown(server: BackgroundServer, attack: Attack, session_id: str) -> None:
    """Attack ``session_id``, and an id of the same shape that the server never made: the two
    answers must be the same (each with its own id in it)."""
    ws_base = server.base_url.replace("http://", "ws://")
    stranger = str(uuid.uuid4())
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
        seen = await attack(http, ws_base, session_id)
        unknown = await attack(http, ws_base, stranger)
    assert json.dumps(seen).replace(session_id, "<id>") == json.dumps(unknown).replace(stranger, "<id>")


async def calls_on(client: GenericEnvClient) -> int:
    """How many ``add`` calls the client's environment has run (its ``peek`` tool)."""
    result = await client.step({"type": "call_tool", "tool_name": "peek", "arguments": {}})
    return result.observation["result"]["data"]


async def add_one(client: GenericEnvClient) -> None:
    result = await client.step({"type": "call_tool", "tool_name": "add", "arguments": {"a": 1, "b": 0}})
    assert result.observation["result"]["data"] == 1


# --- the victims --------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["attached", "waiting for its resume"])
@pytest.mark.parametrize("attack", ATTACKS, ids=lambda attack: attack.__name__)
async def test_a_resumable_sockets_session_cannot_be_reached_by_its_id(server, attack, phase):
    """The id comes back in the victim's own handshake (``X-OpenEnv-Resume-Session``): with it alone the
    attacker neither steps, reads, resets nor closes the session; the victim then carries on (and
    resumes, when its connection had dropped) with its environment as it left it."""
    manager = manager_of(server)
    with FaultProxy(server.port) as proxy:
        async with GenericEnvClient(base_url=proxy.base_url) as victim:
            await victim.reset()
            await add_one(victim)
            session_id = victim._resume[0]
            if phase != "attached":
                assert proxy.fault("reset")
                await until(lambda: not manager.sessions()[session_id].attached)
            await answered_as_unknown(server, attack, session_id)
            await add_one(victim)  # (resumes the session, when its connection dropped)
            assert await calls_on(victim) == 2  # the attacker's calls never reached it
            assert proxy.accepted == (1 if phase == "attached" else 2)  # the same session, resumed
    await until(lambda: manager.active_sessions == 0)


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda attack: attack.__name__)
async def test_a_plain_sockets_session_cannot_be_reached_by_its_id(server, attack):
    """A client that does not ask for resume (upstream's) is never told its id, but the server's
    logs and errors show it: it gives nothing either."""
    manager = manager_of(server)
    async with GenericEnvClient(base_url=server.base_url, reconnect_timeout_s=0) as victim:
        await victim.reset()
        await add_one(victim)
        (session_id,) = manager.sessions()
        await answered_as_unknown(server, attack, session_id)
        await add_one(victim)
        assert await calls_on(victim) == 2
    await until(lambda: manager.active_sessions == 0)


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda attack: attack.__name__)
async def test_a_ws_mcp_sockets_session_cannot_be_reached_by_its_id(server, attack):
    """``WS /mcp`` owns its session as ``/ws`` does (``openenv/session/create`` on it answers that
    session's id, as upstream's does)."""
    manager = manager_of(server)
    ws_base = server.base_url.replace("http://", "ws://")

    async def call(ws: Any, method: str, params: Dict[str, Any]) -> Dict[str, Any]:
        await ws.send(json.dumps(rpc(method, params)))
        return json.loads(await ws.recv())

    async with ws_connect(f"{ws_base}/mcp") as victim:
        session_id = (await call(victim, "openenv/session/create", {}))["result"]["session_id"]
        await call(victim, "tools/call", {"name": "add", "arguments": {"a": 1}})
        await answered_as_unknown(server, attack, session_id)
        await call(victim, "tools/call", {"name": "add", "arguments": {"a": 1}})
        assert (await call(victim, "tools/call", {"name": "peek"}))["result"]["data"] == 2
    await until(lambda: manager.active_sessions == 0)


async def test_the_refusal_tells_an_honest_caller_what_to_do(server):
    manager = manager_of(server)
    async with GenericEnvClient(base_url=server.base_url) as victim:
        await victim.reset()
        session_id = victim._resume[0]
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            status, text = await http_state(http, "", session_id)
    assert status == 404
    assert json.loads(text) == {
        "detail": f"Unknown session_id: {session_id}. A call that names a session reaches one made with "
        "openenv/session/create and still open; a WebSocket's own session is reached only through its "
        "connection (or a resume with its token)",
        "code": "SESSION_ERROR",
    }
    await until(lambda: manager.active_sessions == 0)


async def test_sessions_made_over_http_are_still_reached_by_id(server):
    """Upstream's HTTP model is unchanged: a session from ``openenv/session/create`` is stepped,
    read and closed by its id, over HTTP and MCP, and a WebSocket attaches to it by id."""
    manager = manager_of(server)
    ws_base = server.base_url.replace("http://", "ws://")
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        created = await http.post("/mcp", json=rpc("openenv/session/create", {}))
        session_id = created.json()["result"]["session_id"]
        assert (await http_step(http, ws_base, session_id))[0] == 200
        assert (await mcp_call_tool(http, ws_base, session_id))[0] == 200
        assert (await http_state(http, ws_base, session_id))[0] == 200
        async with ws_connect(f"{ws_base}/ws?session_id={session_id}") as ws:
            await ws.send(json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": "peek"}}))
            assert json.loads(await ws.recv())["data"]["observation"]["result"]["data"] == 2
        status, text = await mcp_close(http, ws_base, session_id)
        assert status == 200 and json.loads(text)["result"] == {"session_id": session_id, "closed": True}
    await until(lambda: manager.active_sessions == 0)
