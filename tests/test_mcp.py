"""MCP environments: direct use, the /mcp JSON-RPC endpoint, sessions, and standard MCP clients."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastmcp import FastMCP
from fastmcp.client.client import CallToolResult
from websockets.asyncio.client import connect

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    ToolErrorType,
)
from openenv.core.env_server.types import Observation

from .conftest import serve, until
from .envs import TRACKER, LegacyToolEnv, ToolEnv, ToolsOnlyEnv


def tool_app(**kwargs):
    kwargs.setdefault("max_concurrent_envs", 4)
    return create_app(ToolEnv, CallToolAction, CallToolObservation, env_name="tools", **kwargs)


@pytest.fixture
def tool_server():
    with serve(tool_app()) as server:
        yield server


@pytest.fixture
def http(tool_server):
    with httpx.Client(base_url=tool_server.base_url, timeout=10) as client:
        yield client


def rpc(http, method, params=None, request_id=1, **headers):
    body = {"jsonrpc": "2.0", "method": method, "id": request_id}
    if params is not None:
        body["params"] = params
    response = http.post("/mcp", json=body, headers=headers)
    assert response.status_code == 200
    return response.json()


# --- MCPEnvironment used directly -------------------------------------------------------------


def test_sync_step_lists_and_calls_tools():
    env = ToolEnv()
    listing = env.step(ListToolsAction())
    assert isinstance(listing, ListToolsObservation)
    assert [t.name for t in listing.tools] == ["add", "boom", "nap"]
    assert listing.tools[0].input_schema["required"] == ["a"]
    result = env.step(CallToolAction(tool_name="add", arguments={"a": 2, "b": 5}))
    assert isinstance(result, CallToolObservation)
    assert result.error is None
    assert result.result.data == 7  # FastMCP's CallToolResult, as in OpenEnv 0.10 (a client gets the value)
    sent = result.model_dump()["result"]  # the wire keeps OpenEnv 0.10's whole result object
    assert sent["data"] == 7
    assert sent["structured_content"] == {"result": 7}
    assert sent["content"] == [{"type": "text", "text": "7"}]
    assert sent["is_error"] is False


async def test_a_tool_calls_result_in_process_through_our_client_and_in_the_frame(tool_server):
    """In process ``observation.result`` is FastMCP's CallToolResult, as OpenEnv 0.10's (upstream
    packages' tests read ``result.data``); our client gives the tool's value; the frame on the wire
    (what upstream's clients read) carries OpenEnv 0.10's whole result object."""
    from openenv.core.mcp_client import MCPToolClient

    call = CallToolAction(tool_name="add", arguments={"a": 2, "b": 5})
    in_process = ToolEnv().step(call)
    async with MCPToolClient(base_url=tool_server.base_url) as client:
        await client.reset()
        through_our_client = (await client.step(call)).observation
    async with connect(tool_server.base_url.replace("http://", "ws://") + "/ws") as ws:
        await ws.send(json.dumps({"type": "reset", "data": {}}))
        await ws.recv()
        await ws.send(json.dumps({"type": "step", "data": call.model_dump()}))
        frame = json.loads(await ws.recv())["data"]["observation"]
    assert isinstance(in_process.result, CallToolResult)
    assert in_process.result.data == through_our_client.result == frame["result"]["data"] == 7
    assert in_process.result.content[0].text == "7" and in_process.result.is_error is False
    assert frame["result"]["structured_content"] == {"result": 7} and frame["result"]["is_error"] is False
    assert in_process.model_dump()["result"] == frame["result"]  # what the server sends of it


def test_a_result_the_environment_replaces_is_sent_as_it_set_it():
    class Rounded(ToolEnv):
        async def _after_mcp_action(self, action, observation):
            if isinstance(observation, CallToolObservation) and observation.error is None:
                observation.result = {"rounded": observation.result.data}
            return await super()._after_mcp_action(action, observation)

    observation = Rounded().step(CallToolAction(tool_name="add", arguments={"a": 1}))
    assert observation.result == {"rounded": 3}
    assert observation.model_dump()["result"] == {"rounded": 3}


async def test_async_step_maps_failures_to_tool_error_types():
    env = ToolEnv()
    cases = {
        "boom": (CallToolAction(tool_name="boom"), ToolErrorType.EXECUTION_ERROR, "kaboom"),
        "missing": (CallToolAction(tool_name="nope"), ToolErrorType.TOOL_NOT_FOUND, "Unknown tool: 'nope'"),
        "bad args": (
            CallToolAction(tool_name="add", arguments={"a": "x"}),
            ToolErrorType.INVALID_ARGS,
            "Invalid arguments",
        ),
        "slow": (
            CallToolAction(tool_name="nap", arguments={"seconds": 2}),
            ToolErrorType.TIMEOUT,
            "timed out after 0.1 seconds",
        ),
    }
    for name, (action, error_type, fragment) in cases.items():
        observation = await env.step_async(action, timeout_s=0.1)
        assert observation.error is not None, name
        assert observation.error.error_type is error_type, name
        assert fragment in observation.error.message, name


def test_reserved_tool_names_are_refused():
    server = FastMCP("bad")

    @server.tool
    def reset() -> str:
        return "no"

    class Bad(MCPEnvironment):
        def _step_impl(self, action, timeout_s=None, **kwargs):
            return Observation()

        def reset(self, seed=None, episode_id=None, **kwargs):
            return Observation()

        @property
        def state(self):
            return None

    with pytest.raises(ValueError, match="reserved"):
        Bad(server)


def test_mode_tools_are_offered_only_in_their_mode():
    env = ToolEnv()
    assert "peek" not in [t.name for t in env.step(ListToolsAction()).tools]
    env._mode = "simulation"
    assert "peek" in [t.name for t in env.step(ListToolsAction()).tools]
    assert env.step(CallToolAction(tool_name="peek")).result.data == 0
    env._mode = "production"
    assert env.step(CallToolAction(tool_name="peek")).error.error_type is ToolErrorType.TOOL_NOT_FOUND


def test_a_tool_declared_in_both_modes_under_one_name_runs_the_one_of_the_current_mode():
    class TwoModes(ToolsOnlyEnv):
        def __init__(self) -> None:
            super().__init__(FastMCP("two-modes"))

            @self.tool(mode="production", name="source")
            def production() -> str:
                return "production"

            @self.tool(mode="simulation", name="source")
            def simulation() -> str:
                return "simulation"

    env = TwoModes()
    for mode in ("production", "simulation", "production"):
        env._mode = mode
        assert env.step(CallToolAction(tool_name="source")).result.data == mode


class ModeTools(ToolsOnlyEnv):
    """One tool name per mode, sync and async: which runs must follow the server's mode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__(FastMCP("mode-tools"))

        @self.tool(mode="production", name="source")
        def production() -> str:
            return "production"

        @self.tool(mode="simulation", name="source")
        def simulation() -> str:
            return "simulation"

        @self.tool(mode="production", name="later")
        async def production_later(n: int) -> str:
            await asyncio.sleep(0)
            return f"production {n}"

        @self.tool(mode="simulation", name="later")
        async def simulation_later(n: int) -> str:
            await asyncio.sleep(0)
            return f"simulation {n}"


@pytest.mark.parametrize("mode", ["production", "simulation"])
async def test_a_served_environment_runs_the_tools_of_the_servers_mode(mode):
    from openenv.core.mcp_client import MCPToolClient

    app = create_app(ModeTools, CallToolAction, CallToolObservation, env_name="modes", mode=mode, max_concurrent_envs=2)
    with serve(app) as server:
        async with MCPToolClient(base_url=server.base_url) as client:  # MCP clients are production clients
            await client.reset()
            assert await client.call_tool("source") == mode
            assert await client.call_tool("later", n=3) == f"{mode} 3"  # the async one, awaited
            step = await client.step(CallToolAction(tool_name="source"))
            assert step.observation.result == mode  # and through step
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "later", "arguments": {"n": 1}}}
        answer = httpx.post(server.base_url + "/mcp", json=rpc).json()  # a stateless call
        assert answer["result"]["data"] == f"{mode} 1", answer


def test_mcp_clients_refuse_simulation_mode_as_upstreams_do(monkeypatch):
    from openenv.core.mcp_client import MCPClientBase, MCPToolClient

    for cls in (MCPToolClient, MCPClientBase):
        with pytest.raises(ValueError, match=r"only supports 'production' mode, got 'simulation'.*GenericEnvClient"):
            cls(base_url="http://127.0.0.1:9", mode="simulation")
    assert MCPToolClient(base_url="http://127.0.0.1:9", mode="PRODUCTION").mode == "production"
    monkeypatch.setenv("OPENENV_CLIENT_MODE", "simulation")  # meant for other clients: MCP ones stay production
    assert MCPToolClient(base_url="http://127.0.0.1:9").mode == "production"


async def test_use_production_mode_says_whether_tool_calls_are_steps():
    """Upstream's switch: on (the default), tools are reached directly on the HTTP-created
    session and are no steps; off, the client owns a plain /ws session and ``list_tools`` /
    ``call_tool`` go through ``step``, each counted (echo_env counts every MCP action)."""
    from echo_env.server.app import app

    from openenv.core.client_errors import ToolCallError
    from openenv.core.mcp_client import MCPToolClient

    manager = app.state.openenv_server.manager
    with serve(app) as server:
        direct = MCPToolClient(base_url=server.base_url)
        assert direct.use_production_mode is True
        async with direct:
            await direct.reset()
            assert direct.session_id is not None  # created over HTTP, the WebSocket attached to it
            assert [t.name for t in await direct.list_tools()] == ["echo_message", "echo_with_length"]
            assert await direct.call_tool("echo_message", message="hi") == "hi"
            assert (await direct.state()).step_count == 0
        stepping = MCPToolClient(base_url=server.base_url)
        stepping.use_production_mode = False
        async with stepping:
            await stepping.reset()
            assert stepping.session_id is None  # no HTTP session: the WebSocket made its own
            assert [t.name for t in await stepping.list_tools()] == ["echo_message", "echo_with_length"]
            assert await stepping.call_tool("echo_message", message="hi") == "hi"
            with pytest.raises(ToolCallError, match=r"Tool 'nope' failed: .*\(type: tool_not_found\)"):
                await stepping.call_tool("nope")
            assert (await stepping.state()).step_count == 3
        await until(lambda: manager.active_sessions == 0)


def test_the_mode_parameter_is_documented_with_its_values():
    from openenv.core.env_client import EnvClient
    from openenv.core.mcp_client import MCPClientBase

    for documented in (EnvClient.__doc__, MCPClientBase.__doc__, MCPEnvironment.tool.__doc__):
        assert "``mode``" in documented and '"production"' in documented and '"simulation"' in documented
    assert "OPENENV_CLIENT_MODE" in EnvClient.__doc__
    assert "use_production_mode" in MCPClientBase.__doc__


async def test_a_simulation_client_drives_mcp_tools_through_step():
    """What the refusal above points to: a GenericEnvClient in simulation mode owns its socket's session."""
    from openenv.core.generic_client import GenericEnvClient

    app = create_app(ModeTools, CallToolAction, CallToolObservation, env_name="modes", max_concurrent_envs=2)
    with serve(app) as server:
        async with GenericEnvClient(base_url=server.base_url, mode="simulation") as client:
            step = await client.step({"type": "call_tool", "tool_name": "later", "arguments": {"n": 2}})
            assert step.observation["result"]["data"] == "simulation 2"


def test_non_mcp_actions_go_to_step_impl():
    from openenv.core.env_server.types import Action

    class Other(Action):
        x: int = 0

    assert ToolEnv().step(Other()).metadata == {"error": "tools only"}


# --- POST /mcp -------------------------------------------------------------------------------


def test_parse_error_and_invalid_requests_are_http_200(http):
    response = http.post("/mcp", content=b"{not json", headers={"content-type": "application/json"})
    assert (response.status_code, response.json()) == (
        200,
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700, "message": response.json()["error"]["message"], "data": None},
        },
    )
    assert response.json()["error"]["message"].startswith("Parse error: ")  # and why
    body = http.post("/mcp", json={}).json()
    assert body["error"]["code"] == -32600
    assert body["error"]["message"].startswith("Invalid request:")
    assert (
        http.post("/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "params": [1]}).json()["error"]["code"]
        == -32600
    )
    assert http.post("/mcp", json={"jsonrpc": "2.0", "method": "x", "extra": 1}).json()["error"]["code"] == -32600


def test_unknown_method_is_method_not_found(http):
    assert rpc(http, "resources/list")["error"] == {
        "code": -32601,
        "message": "Method not found: resources/list",
        "data": None,
    }


def test_tools_list_uses_mcp_camel_case(http):
    body = rpc(http, "tools/list")
    assert list(body) == ["jsonrpc", "id", "result"]
    tools = body["result"]["tools"]
    assert [t["name"] for t in tools] == ["add", "boom", "nap", "peek"]  # simulation mode shows 'peek'
    assert tools[0]["inputSchema"]["properties"]["a"] == {"type": "integer"}
    assert tools[0]["description"] == "Add two numbers."
    # every key of upstream's entries (the MCP SDK Tool's model_dump), nulls included, and _meta
    upstream_keys = {"name", "title", "description", "inputSchema", "outputSchema", "icons", "annotations"}
    assert upstream_keys | {"meta", "execution", "_meta"} <= set(tools[0])
    assert tools[0]["meta"] == tools[0]["_meta"]


def test_tools_call_result_carries_both_key_styles(http):
    result = rpc(http, "tools/call", {"name": "add", "arguments": {"a": 1, "b": 4}})["result"]
    assert result["data"] == 5
    assert result["structured_content"] == result["structuredContent"] == {"result": 5}
    assert result["is_error"] is False and result["isError"] is False
    assert result["content"] == [{"type": "text", "text": "5"}]


def test_tool_failures_are_jsonrpc_errors_for_openenv_clients(http):
    body = rpc(http, "tools/call", {"name": "boom"})
    assert body["error"]["code"] == -32603
    assert body["error"]["message"] == "Error calling tool 'boom': kaboom"
    assert rpc(http, "tools/call", {"name": "nope"})["error"]["message"] == "Unknown tool: 'nope'"
    assert rpc(http, "tools/call", {"arguments": {}})["error"] == {
        "code": -32602,
        "message": "Missing 'name' in params",
        "data": None,
    }


def test_session_create_call_and_close(http):
    session_id = rpc(http, "openenv/session/create")["result"]["session_id"]
    rpc(http, "tools/call", {"name": "add", "arguments": {"a": 1}, "session_id": session_id})
    rpc(http, "tools/call", {"name": "add", "arguments": {"a": 1}, "session_id": session_id})
    assert rpc(http, "tools/call", {"name": "peek", "session_id": session_id})["result"]["data"] == 2  # state persists
    assert rpc(http, "openenv/session/close", {"session_id": session_id})["result"] == {
        "session_id": session_id,
        "closed": True,
    }
    closed_again = rpc(http, "openenv/session/close", {"session_id": session_id})["error"]
    assert closed_again["code"] == -32602 and closed_again["data"] is None
    assert closed_again["message"].startswith(f"Unknown session_id: {session_id}. ")  # and what to do
    assert rpc(http, "openenv/session/close", {})["error"]["message"] == "Invalid params - 'session_id' is required"
    assert rpc(http, "tools/list", {"session_id": "nope"})["error"]["code"] == -32602


async def test_stateless_calls_use_a_fresh_env_each_time(http):
    rpc(http, "tools/call", {"name": "add", "arguments": {"a": 1}})
    assert rpc(http, "tools/call", {"name": "peek"})["result"]["data"] == 0
    await until(lambda: TRACKER.alive == 0)  # (each closed soon after its answer: in a worker)


def test_session_create_at_capacity_is_server_error():
    with serve(tool_app(max_concurrent_envs=1)) as server, httpx.Client(base_url=server.base_url) as http:
        rpc(http, "openenv/session/create")
        error = rpc(http, "openenv/session/create")["error"]
        assert error["code"] == -32000
        assert error["data"] == {"code": "CAPACITY_REACHED", "active_sessions": 1, "max_sessions": 1}


async def test_websocket_attaches_to_an_http_session_once(tool_server, http):
    session_id = rpc(http, "openenv/session/create")["result"]["session_id"]
    base = tool_server.base_url.replace("http://", "ws://")
    async with connect(f"{base}/ws?session_id={session_id}") as ws:
        await ws.send(
            json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": "add", "arguments": {"a": 3}}})
        )
        reply = json.loads(await ws.recv())
        assert reply["data"]["observation"]["result"]["data"] == 5
        async with connect(f"{base}/ws?session_id={session_id}") as second:
            refused = json.loads(await second.recv())
            assert refused["data"]["code"] == "SESSION_ERROR"
            assert "already attached" in refused["data"]["message"]
        # the HTTP side sees the same environment
        assert rpc(http, "tools/call", {"name": "peek", "session_id": session_id})["result"]["data"] == 1
        # closing an attached session is deferred until the socket lets go
        assert rpc(http, "openenv/session/close", {"session_id": session_id})["result"] == {
            "session_id": session_id,
            "closed": False,
            "closing": True,
        }
    # the socket has let go: the deferred close follows, after which the session is unknown
    await until(lambda: rpc(http, "tools/list", {"session_id": session_id}).get("error", {}).get("code") == -32602)


async def test_detached_session_survives_its_socket(tool_server, http):
    session_id = rpc(http, "openenv/session/create")["result"]["session_id"]
    base = tool_server.base_url.replace("http://", "ws://")
    async with connect(f"{base}/ws?session_id={session_id}") as ws:
        await ws.send(json.dumps({"type": "reset"}))
        await ws.recv()
    await asyncio.sleep(0.1)
    assert "result" in rpc(http, "tools/list", {"session_id": session_id})


async def test_mcp_frames_on_ws_act_on_the_socket_session(tool_server):
    base = tool_server.base_url.replace("http://", "ws://")
    async with connect(f"{base}/ws") as ws:

        async def call(method, params=None):
            await ws.send(
                json.dumps(
                    {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 7, "method": method, "params": params or {}}}
                )
            )
            return json.loads(await ws.recv())

        reply = await call("tools/call", {"name": "add", "arguments": {"a": 1}})
        assert reply["type"] == "mcp"
        assert reply["data"]["result"]["data"] == 3
        assert (await call("tools/call", {"name": "peek"}))["data"]["result"]["data"] == 1
        created = await call("openenv/session/create")
        assert created["data"]["result"]["session_id"]  # the socket's own session
        await ws.send(json.dumps({"type": "mcp", "data": {"method": "tools/list"}}))
        assert json.loads(await ws.recv())["data"]["error"]["code"] == -32600


async def test_websocket_mcp_endpoint():
    with serve(tool_app()) as server:
        async with connect(server.base_url.replace("http://", "ws://") + "/mcp") as ws:
            await ws.send(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "tools/call",
                        "params": {"name": "add", "arguments": {"a": 5}},
                    }
                )
            )
            assert json.loads(await ws.recv())["result"]["data"] == 7
            await ws.send("nope")
            assert json.loads(await ws.recv())["error"]["code"] == -32700
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "peek"}}))
            assert json.loads(await ws.recv())["result"]["data"] == 1
        await until(lambda: server.server.config.app.state.openenv_server.active_sessions == 0)


def test_legacy_environment_answers_mcp_through_step():
    app = create_app(LegacyToolEnv, CallToolAction, CallToolObservation, max_concurrent_envs=2)
    with serve(app) as server, httpx.Client(base_url=server.base_url) as http:
        tools = rpc(http, "tools/list")["result"]["tools"]
        assert tools == [
            {
                "name": "shout",
                "description": "Upper-case",
                "input_schema": {"type": "object"},
                "inputSchema": {"type": "object"},
            }
        ]
        result = rpc(http, "tools/call", {"name": "shout", "arguments": {"text": "hi"}})["result"]
        assert result["result"] == "HI"
        assert result["tool_name"] == "shout"


def test_non_mcp_environment_says_so():
    from .conftest import counter_app

    with serve(counter_app()) as server, httpx.Client(base_url=server.base_url) as http:
        assert rpc(http, "tools/list")["error"] == {
            "code": -32603,
            "message": "Environment does not support MCP",
            "data": None,
        }


# --- standard MCP clients ---------------------------------------------------------------------


def test_mcp_lifecycle_methods(http):
    response = http.post(
        "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
    )
    result = response.json()["result"]
    assert result["protocolVersion"] == "2025-06-18"
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"]["name"] == "tools"
    session_id = response.headers["mcp-session-id"]
    headers = {"mcp-session-id": session_id, "mcp-protocol-version": "2025-06-18"}
    assert (
        http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers).status_code
        == 202
    )
    assert http.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=headers).json()["result"] == {}
    # MCP dialect: a failing tool is a result with isError, not a JSON-RPC error
    failed = http.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "boom"}}, headers=headers
    ).json()["result"]
    assert failed["isError"] is True
    assert "kaboom" in failed["content"][0]["text"]
    assert http.get("/mcp").status_code == 405
    assert http.delete("/mcp", headers={"mcp-session-id": session_id}).status_code == 204
    assert http.post("/mcp", json={"jsonrpc": "2.0", "id": 4, "method": "ping"}, headers=headers).status_code == 404


async def test_the_official_mcp_sdk_client_lists_and_calls_tools(tool_server):
    mcp = pytest.importorskip("mcp")
    url = tool_server.base_url + "/mcp"
    if hasattr(mcp, "Client"):  # mcp >= 2
        async with mcp.Client(url) as client:
            tools = await client.list_tools()
            result = await client.call_tool("add", {"a": 20, "b": 22})
            again = await client.call_tool("peek", {})
            failed = await client.call_tool("boom", {})
    else:  # mcp 1.x
        from mcp.client.streamable_http import streamablehttp_client

        async with streamablehttp_client(url) as (read, write, _), mcp.ClientSession(read, write) as client:
            await client.initialize()
            tools = await client.list_tools()
            result = await client.call_tool("add", {"a": 20, "b": 22})
            again = await client.call_tool("peek", {})
            failed = await client.call_tool("boom", {})
    assert [t.name for t in tools.tools] == ["add", "boom", "nap", "peek"]
    assert result.content[0].text == "42"
    assert not result.is_error if hasattr(result, "is_error") else not result.isError
    assert again.content[0].text == "1"  # one MCP session = one environment instance
    assert (failed.is_error if hasattr(failed, "is_error") else failed.isError) is True


async def test_mcp_client_refused_at_capacity_raises_a_runtime_error():
    from openenv.core.client_errors import CapacityReachedError
    from openenv.core.mcp_client import MCPToolClient

    with serve(tool_app(max_concurrent_envs=1)) as server:
        async with MCPToolClient(base_url=server.base_url) as first:
            await first.reset()
            second = MCPToolClient(base_url=server.base_url)
            with pytest.raises(CapacityReachedError) as refused:
                await second.reset()
            assert isinstance(refused.value, RuntimeError)
            assert refused.value.details == {"active_sessions": 1, "max_sessions": 1}
            await second.close()


# --- direct dispatch gives what FastMCP gives ---------------------------------------------------


def _values_tool_env():
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int
        y: int

    server = FastMCP("values")
    values = {
        "text": "hello",
        "number": 7,
        "ratio": 0.25,
        "flag": True,
        "nothing": None,
        "mapping": {"a": [1, 2, {"b": None}], "c": "d"},
        "items": [1, "two", 3.0],
        "point": Point(x=1, y=2),
        "raw": b"bytes",
        "nan": float("nan"),
    }
    for key, value in values.items():
        server.tool(lambda value=value: value, name=f"ret_{key}")
        server.tool(lambda value=value: value, name=f"plain_{key}", output_schema=None)

    return ToolsOnlyEnv(server), values


@pytest.mark.internals("fastmcp")
async def test_direct_tool_results_equal_fastmcps_own():
    from openenv.core.env_server._compat.fastmcp import tool_result_payload
    from openenv.core.env_server.mcp_environment import ToolCallFailed

    env, values = _values_tool_env()
    for key in values:
        for prefix in ("ret", "plain"):
            name = f"{prefix}_{key}"
            try:
                expected = tool_result_payload(await env.mcp_server.call_tool(name, {}))
            except Exception as exc:  # FastMCP refuses (e.g. NaN): so must we
                with pytest.raises(ToolCallFailed):
                    await env.call_tool_payload(name, {})
                assert "nan" in key, exc
                continue
            for _ in range(2):  # the first call verifies, the second takes the direct way
                assert await env.call_tool_payload(name, {}) == expected, name
            direct = await env._direct.get(name)
            takes_direct_way = direct.verified[type(values[key])]
            assert takes_direct_way is (key not in ("point", "raw")), name  # models and bytes stay with FastMCP


def _raising_tools_env(mask: bool):
    """Tools (sync in the pool, sync on the loop, async) that each raise one kind of failure."""
    import pydantic
    from fastmcp.exceptions import NotFoundError, ToolError
    from fastmcp.exceptions import ValidationError as FastMCPValidationError

    class Point(pydantic.BaseModel):
        x: int

    status_request = httpx.Request("GET", "http://127.0.0.1/upstream")
    failures = {
        "plain": lambda: ValueError("secret path /srv/keys"),
        "empty": lambda: RuntimeError(),
        "own_timeout": lambda: TimeoutError("the tool's own timeout"),
        "tool_error": lambda: ToolError("x must be positive"),  # deliberate: shown as it is
        "fastmcp_validation": lambda: FastMCPValidationError("bad value"),
        "not_found": lambda: NotFoundError("no such row"),  # not a FastMCPError: wrapped
        "http_timeout": lambda: httpx.ReadTimeout("read timed out", request=status_request),
        "http_429": lambda: httpx.HTTPStatusError(
            "429", request=status_request, response=httpx.Response(429, request=status_request)
        ),
        "http_500": lambda: httpx.HTTPStatusError(
            "500", request=status_request, response=httpx.Response(500, request=status_request)
        ),
    }

    def raise_one(key):
        if key == "body_pydantic":
            Point(x="not a number")
        raise failures[key]()

    server = FastMCP("raising", mask_error_details=mask)
    keys = [*failures, "body_pydantic"]
    for key in keys:

        def sync_tool(x: int, key=key) -> int:
            raise_one(key)

        async def async_tool(x: int, key=key) -> int:
            raise_one(key)

        server.tool(sync_tool, name=f"sync_{key}")
        server.tool(sync_tool, name=f"inline_{key}", run_in_thread=False)
        server.tool(async_tool, name=f"async_{key}")

    return ToolsOnlyEnv(server), [f"{kind}_{key}" for key in keys for kind in ("sync", "inline", "async")]


@pytest.mark.internals("fastmcp")
@pytest.mark.parametrize("mask", [False, True], ids=["details", "mask_error_details"])
async def test_direct_tool_failures_read_as_fastmcps_own(mask):
    """A tool that raises is reported in FastMCP's words, whichever way it is called: its own
    ToolError as it is, other exceptions as "Error calling tool 'name': text", without the text
    under FastMCP's mask_error_details, and FastMCP's words for an upstream API's 429 or timeout."""
    from openenv.core.env_server.mcp_environment import ToolCallFailed, _failure

    env, names = _raising_tools_env(mask)
    for name in names:
        with pytest.raises(Exception) as through_fastmcp:
            await env.mcp_server.call_tool(name, {"x": 1})
        expected = _failure(through_fastmcp.value, name).error
        for _ in range(2):  # the first call finds the tool, the second uses the cached index
            with pytest.raises(ToolCallFailed) as direct:
                await env.call_tool_payload(name, {"x": 1})
            assert direct.value.error == expected, name
        assert (await env._direct.get(name)) is not None, name  # the direct way was taken
        if mask and not name.endswith(("tool_error", "fastmcp_validation")):
            assert "secret" not in expected.message and "not a number" not in expected.message
    words = {}
    for name in ("async_plain", "sync_tool_error", "inline_http_429", "sync_fastmcp_validation"):
        with pytest.raises(ToolCallFailed) as failed:
            await env.call_tool_payload(name, {"x": 1})
        words[name] = (failed.value.error.error_type, failed.value.error.message)
    plain = "Error calling tool 'async_plain'" + ("" if mask else ": secret path /srv/keys")
    assert words == {
        "async_plain": (ToolErrorType.EXECUTION_ERROR, plain),
        "sync_tool_error": (ToolErrorType.EXECUTION_ERROR, "x must be positive"),
        "inline_http_429": (ToolErrorType.EXECUTION_ERROR, "Rate limited by upstream API, please retry later"),
        "sync_fastmcp_validation": (
            ToolErrorType.INVALID_ARGS,
            "Invalid arguments for tool 'sync_fastmcp_validation': bad value",
        ),
    }


@pytest.mark.internals("fastmcp")
@pytest.mark.parametrize("mask", [False, True], ids=["details", "mask_error_details"])
async def test_tools_off_the_direct_path_are_worded_and_masked_as_fastmcp_does(mask):
    """Mode tools FastMCP must run itself (an injected dependency), and tools raising what
    OpenEnv words itself (SystemExit, their own CancelledError), follow the server's mask too."""
    from fastmcp.dependencies import Depends

    from openenv.core.env_server.mcp_environment import ToolCallFailed

    def database_url() -> str:
        return "postgres://admin:hunter2@db.internal/prod"

    class Masked(ToolsOnlyEnv):
        def __init__(self) -> None:
            super().__init__(FastMCP("masked", mask_error_details=mask))

            @self.tool(mode="simulation")
            def injected(x: int, url: str = Depends(database_url)) -> int:
                raise ConnectionError(f"cannot connect to {url}")

            @self.mcp_server.tool
            def registered(x: int, url: str = Depends(database_url)) -> int:
                raise ConnectionError(f"cannot connect to {url}")

            @self.mcp_server.tool
            def exits(x: int) -> int:
                raise SystemExit("alembic: cannot connect to postgres://admin:hunter2@db")

            @self.mcp_server.tool
            async def cancels(x: int) -> int:
                raise asyncio.CancelledError("job cancelled by /srv/worker/secret.conf")

    env = Masked()
    env._mode = "simulation"  # what a server in simulation mode sets
    assert env._mode_tools["simulation"]["injected"][1] is None  # FastMCP runs it
    messages = {}
    for name in ("injected", "registered", "exits", "cancels"):
        with pytest.raises(ToolCallFailed) as failed:
            await env.call_tool_payload(name, {"x": 1})
        messages[name] = failed.value.error.message
    if mask:
        assert messages == {name: f"Error calling tool '{name}'" for name in messages}
    else:
        assert messages["injected"] == messages["registered"].replace("registered", "injected")
        assert messages["registered"] == (
            "Error calling tool 'registered': cannot connect to postgres://admin:hunter2@db.internal/prod"
        )
        assert (
            messages["exits"] == "SystemExit raised by the call: alembic: cannot connect to postgres://admin:hunter2@db"
        )
        assert messages["cancels"] == "CancelledError raised by the call: job cancelled by /srv/worker/secret.conf"


def test_without_fastmcps_helpers_the_direct_path_tests_httpx_itself():
    """FastMCP 3 has no get_http_status_code / is_timeout_error but words an httpx 429 and
    timeout all the same: the fallback does too (FastMCP 3 simulated by hiding the helpers)."""
    import subprocess
    import sys

    script = """
import sys
sys.modules["fastmcp.utilities.exceptions"] = None  # as on FastMCP 3: the import fails
import httpx
from openenv.core.env_server._compat.fastmcp import ToolBodyError, body_error_message
request = httpx.Request("GET", "http://127.0.0.1/upstream")
limited = httpx.HTTPStatusError("429", request=request, response=httpx.Response(429, request=request))
failed = httpx.HTTPStatusError("500", request=request, response=httpx.Response(500, request=request))
for exc in (limited, httpx.ReadTimeout("slow", request=request), failed, ValueError("v")):
    print(body_error_message(ToolBodyError(exc), "fetch", False))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "Rate limited by upstream API, please retry later",
        "Upstream request timed out, please retry",
        "Error calling tool 'fetch': 500",
        "Error calling tool 'fetch': v",
    ]


class _SharedToolsEnv(MCPEnvironment):
    """Stateless tools on one FastMCP server shared by every instance; per-instance call counts."""

    def __init__(self, server: FastMCP) -> None:
        super().__init__(server)
        self.calls = 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> Observation:  # type: ignore[override]
        self.calls = 0
        return Observation()

    async def _after_mcp_action(self, action, observation):  # type: ignore[override]
        self.calls += 1
        return await super()._after_mcp_action(action, observation)

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:  # type: ignore[override]
        return Observation()

    @property
    def state(self):  # type: ignore[override]
        return None


async def test_environments_built_on_one_server_share_its_tool_index_but_not_their_state() -> None:
    server = FastMCP("shared")

    @server.tool(run_in_thread=False)
    def double(x: int) -> int:
        return 2 * x

    first, second, other = _SharedToolsEnv(server), _SharedToolsEnv(server), _SharedToolsEnv(FastMCP("other"))
    assert first._direct is second._direct and first._direct is not other._direct
    for env in (first, second):
        env.reset()
    result = await first.step_async(CallToolAction(tool_name="double", arguments={"x": 4}))
    assert result.result.data == 8
    await first.step_async(CallToolAction(tool_name="double", arguments={"x": 1}))
    result = await second.step_async(CallToolAction(tool_name="double", arguments={"x": "nope"}))
    assert result.error is not None and result.error.error_type.value == "invalid_args"
    assert (first.calls, second.calls) == (2, 1)
