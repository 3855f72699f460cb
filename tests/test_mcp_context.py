"""Tools that keep per-session state with FastMCP's ``Context`` (``ctx.set_state`` /
``ctx.get_state``), served over every MCP transport: ``POST /mcp`` sessions, ``WS /mcp`` and MCP
frames on ``/ws``. The state lasts across one session's calls and stays apart between sessions."""

from __future__ import annotations

import json

import httpx
import pytest
from fastmcp import Context, FastMCP
from websockets.asyncio.client import connect

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from .conftest import serve, until
from .envs import ToolsOnlyEnv

SHARED = FastMCP("shared-context-tools")  # one server for every instance: state is kept per connection


@SHARED.tool
async def bump(ctx: Context, by: int = 1) -> int:
    """Add ``by`` to this session's counter and return it."""
    total = (await ctx.get_state("total") or 0) + by
    await ctx.set_state("total", total)
    return total


@SHARED.tool
def peek(ctx: Context) -> str:
    """A sync tool reading the same state: the session's id and nothing else."""
    return ctx.session_id


@SHARED.tool
async def fail(ctx: Context) -> int:
    raise ValueError("no luck")


class ContextEnv(ToolsOnlyEnv):
    SUPPORTS_CONCURRENT_SESSIONS = True
    built: list = []

    def __init__(self) -> None:
        super().__init__(SHARED)
        ContextEnv.built.append(self)


@pytest.fixture
def server():
    ContextEnv.built.clear()
    app = create_app(ContextEnv, CallToolAction, CallToolObservation, env_name="ctx", max_concurrent_envs=4)
    with serve(app) as running:
        yield running


def call(http, method, params=None):
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    return http.post("/mcp", json=body).json()


async def acall(http, method, params=None):
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    return (await http.post("/mcp", json=body)).json()


def bump_in(http, session_id, by=1):
    answer = call(http, "tools/call", {"name": "bump", "arguments": {"by": by}, "session_id": session_id})
    assert "result" in answer, answer
    return answer["result"]["data"]


def test_http_sessions_keep_their_own_context_state(server):
    with httpx.Client(base_url=server.base_url, timeout=10) as http:
        first = call(http, "openenv/session/create")["result"]["session_id"]
        second = call(http, "openenv/session/create")["result"]["session_id"]
        assert [bump_in(http, first), bump_in(http, first, 10), bump_in(http, second)] == [1, 11, 1]
        assert bump_in(http, first) == 12
        ids = {call(http, "tools/call", {"name": "peek", "session_id": s})["result"]["data"] for s in (first, second)}
        assert len(ids) == 2  # sync Context tools work too, each session under its own id
        stateless = call(http, "tools/call", {"name": "bump"})
        assert stateless["result"]["data"] == 1  # a throw-away environment starts from nothing


def test_a_failing_context_tool_is_an_error_and_the_session_goes_on(server):
    with httpx.Client(base_url=server.base_url, timeout=10) as http:
        session_id = call(http, "openenv/session/create")["result"]["session_id"]
        bump_in(http, session_id)
        error = call(http, "tools/call", {"name": "fail", "session_id": session_id})["error"]
        assert error["code"] == -32603
        assert error["message"] == "Error calling tool 'fail': no luck"
        assert bump_in(http, session_id) == 2


async def test_closing_a_session_closes_its_mcp_connection(server):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
        session_id = (await acall(http, "openenv/session/create"))["result"]["session_id"]
        await acall(http, "tools/call", {"name": "bump", "session_id": session_id})
        (env,) = [e for e in ContextEnv.built if e._connection is not None]
        client = env._connection[0]
        assert client.is_connected()
        assert (await acall(http, "openenv/session/close", {"session_id": session_id}))["result"]["closed"] is True
        await until(lambda: env._connection is None and not client.is_connected())


async def test_websocket_mcp_sockets_keep_their_own_context_state(server):
    url = server.base_url.replace("http://", "ws://") + "/mcp"

    async def bump_on(ws, by=1):
        request = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "bump", "arguments": {"by": by}},
        }
        await ws.send(json.dumps(request))
        return json.loads(await ws.recv())["result"]["data"]

    async with connect(url) as one, connect(url) as two:
        assert [await bump_on(one), await bump_on(one, 5), await bump_on(two)] == [1, 6, 1]
    async with connect(url) as three:
        assert await bump_on(three) == 1  # a new socket is a new session
    await until(lambda: server.server.config.app.state.openenv_server.active_sessions == 0)


async def test_mcp_frames_on_ws_and_the_production_client_share_the_sessions_state(server):
    from openenv.core.mcp_client import MCPToolClient

    async with MCPToolClient(base_url=server.base_url) as client:  # POST /mcp with its session_id
        assert [await client.call_tool("bump"), await client.call_tool("bump", by=2)] == [1, 3]
        step = await client.step(CallToolAction(tool_name="bump", arguments={"by": 4}))  # over /ws
        assert step.observation.result == 7
    base = server.base_url.replace("http://", "ws://")
    async with connect(f"{base}/ws") as ws:
        for expected in (1, 2):
            frame = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "bump"}}
            await ws.send(json.dumps({"type": "mcp", "data": frame}))
            assert json.loads(await ws.recv())["data"]["result"]["data"] == expected


def test_sync_step_opens_and_closes_a_connection_per_call():
    """Each sync ``step`` runs on a loop of its own (as upstream's does), so its state is the call's."""
    env = ContextEnv()
    assert [env.step(CallToolAction(tool_name="bump")).result.data for _ in range(2)] == [1, 1]
    assert env._connection is None
    env.close()


async def test_direct_use_keeps_state_on_one_loop_and_in_mcp_session():
    env = ContextEnv()
    results = [await env.step_async(CallToolAction(tool_name="bump")) for _ in range(2)]
    assert [r.result.data for r in results] == [1, 2]
    async with env.mcp_session() as client:  # the public client keeps one session while open
        assert [(await client.call_tool("bump")).data for _ in range(2)] == [1, 2]
    env.close()
