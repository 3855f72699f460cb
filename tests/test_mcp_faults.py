"""Faulty MCP requests and faulty tools, each found by review and reproduced against a live server
before it was fixed."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List, Optional

import httpx
import pytest
from fastmcp import FastMCP

from openenv.core.env_server import mcp_environment
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from .conftest import serve, until
from .envs import ToolsOnlyEnv


class Events:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: List[tuple] = []

    def add(self, *event: Any) -> None:
        with self.lock:
            self.log.append(event)


EVENTS = Events()


class FaultyToolEnv(ToolsOnlyEnv):
    """``block`` sleeps in a worker thread; ``cancels`` and ``exits`` raise what tools should not."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("faulty")

        @mcp.tool
        def block(seconds: float) -> str:
            """Sleep in the worker, noting whether the environment was closed meanwhile."""
            EVENTS.add("start", id(self))
            time.sleep(seconds)
            EVENTS.add("end", id(self), self.mcp_server is None)
            return "done"

        @mcp.tool
        async def cancels() -> str:
            """Raise CancelledError without being cancelled."""
            raise asyncio.CancelledError()

        @mcp.tool
        async def exits() -> str:
            """Raise SystemExit."""
            raise SystemExit(3)

        @mcp.tool
        async def generator_exit() -> str:
            """Raise GeneratorExit."""
            raise GeneratorExit()

        @mcp.tool
        def add(a: int, b: int = 2) -> int:
            """Add."""
            return a + b

        super().__init__(mcp)

    def close(self) -> None:
        EVENTS.add("close", id(self))
        super().close()


def faulty_app(**kwargs: Any) -> Any:
    kwargs.setdefault("max_concurrent_envs", 4)
    return create_app(FaultyToolEnv, CallToolAction, CallToolObservation, env_name="faulty", **kwargs)


def rpc(http: httpx.Client, method: str, params: Optional[dict] = None, request_id: Any = 1) -> dict:
    response = http.post("/mcp", json={"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(autouse=True)
def _clear_events() -> None:
    EVENTS.log.clear()


@pytest.mark.internals("fastmcp")
@pytest.mark.parametrize("how", ["stateless", "session-close"])
async def test_an_environment_is_closed_only_after_its_abandoned_sync_tool_returns(monkeypatch, how):
    monkeypatch.setattr(mcp_environment, "MCP_TOOL_CALL_TIMEOUT", 0.3)
    with serve(faulty_app()) as server, httpx.Client(base_url=server.base_url, timeout=10) as http:
        params: dict = {"name": "block", "arguments": {"seconds": 0.8}}
        if how == "session-close":
            params["session_id"] = rpc(http, "openenv/session/create")["result"]["session_id"]
        reply = rpc(http, "tools/call", params)
        assert "timed out" in reply["error"]["message"]
        if how == "session-close":
            assert rpc(http, "openenv/session/close", {"session_id": params["session_id"]})["result"]["closed"]
        await until(lambda: any(e[0] == "close" for e in EVENTS.log), timeout=5)
        kinds = [e[0] for e in EVENTS.log]
        assert kinds == ["start", "end", "close"], EVENTS.log
        assert EVENTS.log[1][2] is False  # the tool ran to its end on an open environment


@pytest.mark.parametrize("tool", ["cancels", "exits", "generator_exit"])
def test_a_tool_raising_cancelled_error_or_system_exit_is_a_tool_failure(tool):
    with serve(faulty_app()) as server, httpx.Client(base_url=server.base_url, timeout=10) as http:
        reply = rpc(http, "tools/call", {"name": tool})
        assert reply["error"]["code"] == -32603, reply
        assert rpc(http, "tools/call", {"name": "add", "arguments": {"a": 1}})["result"]["data"] == 3


@pytest.fixture(scope="module")
def faulty_server():
    with serve(faulty_app()) as server:
        yield server


@pytest.fixture
def http(faulty_server):
    with httpx.Client(base_url=faulty_server.base_url, timeout=10) as client:
        yield client


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"name": {"x": 1}}, "'name' must be a string"),
        ({"name": ["add"]}, "'name' must be a string"),
        ({"name": 5}, "'name' must be a string"),
        ({"name": "add", "arguments": False}, "'arguments' must be an object"),
        ({"name": "add", "arguments": [1]}, "'arguments' must be an object"),
    ],
)
def test_mistyped_tool_call_params_are_invalid_params(http, params, message):
    reply = rpc(http, "tools/call", params)
    assert reply["error"]["code"] == -32602 and reply["error"]["message"] == message
    assert rpc(http, "tools/call", {"name": "add", "arguments": {"a": 2}})["result"]["data"] == 4


@pytest.mark.parametrize("request_id", [True, False, 1.5, [1], {"a": 1}])
def test_ids_a_response_cannot_echo_are_invalid_requests_answered_with_a_null_id(http, request_id):
    reply = rpc(http, "tools/list", request_id=request_id)
    assert reply["error"]["code"] == -32600 and reply["id"] is None


@pytest.mark.parametrize("request_id", ["7", 7, None])
def test_string_and_integer_ids_come_back_as_they_were_sent(http, request_id):
    assert rpc(http, "ping", request_id=request_id)["id"] == request_id


async def test_a_bad_id_on_an_mcp_frame_is_answered_with_an_mcp_frame(faulty_server):
    import json

    from websockets.asyncio.client import connect

    async with connect(faulty_server.base_url.replace("http://", "ws://") + "/ws") as ws:
        for request_id in (1.5, [1], True):
            await ws.send(
                json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": request_id}})
            )
            frame = json.loads(await ws.recv())
            assert frame["type"] == "mcp" and frame["data"]["error"]["code"] == -32600 and frame["data"]["id"] is None
        await ws.send(json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "ping", "id": 3}}))
        assert json.loads(await ws.recv())["data"] == {"jsonrpc": "2.0", "id": 3, "result": {}}


async def test_the_official_mcp_sdk_calls_tools_of_an_environment_answering_them_in_its_own_step():
    mcp = pytest.importorskip("mcp")
    from .envs import LegacyToolEnv

    app = create_app(LegacyToolEnv, CallToolAction, CallToolObservation, env_name="legacy")
    with serve(app) as server:
        url = server.base_url + "/mcp"
        if hasattr(mcp, "Client"):  # mcp >= 2
            async with mcp.Client(url) as client:
                tools = await client.list_tools()
                result = await client.call_tool("shout", {"text": "hi"})
        else:  # mcp 1.x
            from mcp.client.streamable_http import streamablehttp_client

            async with streamablehttp_client(url) as (read, write, _), mcp.ClientSession(read, write) as client:
                await client.initialize()
                tools = await client.list_tools()
                result = await client.call_tool("shout", {"text": "hi"})
        assert [t.name for t in tools.tools] == ["shout"]
        assert result.content[0].text == "HI"
        assert not (result.is_error if hasattr(result, "is_error") else result.isError)
        # OpenEnv clients (no MCP headers) still get the observation as it was
        with httpx.Client(base_url=server.base_url, timeout=10) as http:
            plain = rpc(http, "tools/call", {"name": "shout", "arguments": {"text": "x"}})["result"]
            assert plain["result"] == "X" and "content" not in plain


@pytest.mark.parametrize(("requested", "answered"), [("2025-06-18", "2025-06-18"), ("1999-01-01", None), (7, None)])
def test_initialize_answers_a_supported_protocol_version(http, requested, answered):
    from openenv.core.env_server.transports.mcp import LATEST_PROTOCOL_VERSION

    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": requested}}
    response = http.post("/mcp", json=body)
    assert response.json()["result"]["protocolVersion"] == (answered or LATEST_PROTOCOL_VERSION)
    session_id = response.headers["mcp-session-id"]
    assert http.delete("/mcp", headers={"mcp-session-id": session_id}).status_code == 204


def test_an_unsupported_protocol_version_header_is_a_400(http):
    response = http.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"mcp-protocol-version": "bogus"}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == -32600
    ok = http.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"mcp-protocol-version": "2025-06-18"}
    )
    assert ok.status_code == 200 and ok.json()["result"] == {}


def test_a_notification_method_sent_with_an_id_is_answered(http):
    response = http.post("/mcp", json={"jsonrpc": "2.0", "id": 7, "method": "notifications/initialized"})
    assert response.status_code == 200 and response.json() == {"jsonrpc": "2.0", "id": 7, "result": {}}
    assert http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202


class LateReservedEnv(ToolsOnlyEnv):
    """Registers a tool named ``reset`` after MCPEnvironment checked the names."""

    def __init__(self) -> None:
        mcp = FastMCP("late")

        @mcp.tool
        def ok() -> str:
            """Fine."""
            return "ok"

        super().__init__(mcp)

        @mcp.tool
        def reset() -> str:
            """Reserved."""
            return "a tool named reset ran"


def test_a_tool_with_a_reserved_name_registered_late_is_neither_listed_nor_called():
    from openenv.core.env_server.mcp_types import ListToolsAction

    app = create_app(LateReservedEnv, CallToolAction, CallToolObservation, env_name="late")
    with serve(app) as server, httpx.Client(base_url=server.base_url, timeout=10) as http:
        assert [t["name"] for t in rpc(http, "tools/list")["result"]["tools"]] == ["ok"]
        refused = rpc(http, "tools/call", {"name": "reset"})
        assert "reserved" in refused["error"]["message"]
        assert rpc(http, "tools/call", {"name": "ok"})["result"]["data"] == "ok"
    env = LateReservedEnv()
    assert [t.name for t in env.step(ListToolsAction()).tools] == ["ok"]
    assert env.step(CallToolAction(tool_name="reset")).error is not None
