"""One dispatch (``openenv.core.env_server.dispatch``): what every transport gets from it alike.

``WS /mcp`` is served by the same connection as ``/ws``: it resumes (a call re-sent with its
number after the connection dropped is answered from the record, not run again) and a client
that leaves mid-call frees its slot at once. Numbered calls are answered once on every transport
that numbers them. And no transport looks sessions up or numbers calls by itself (read from the
source)."""

from __future__ import annotations

import ast
import asyncio
import json
import pathlib
from typing import Any, Dict

import pytest
from websockets.asyncio.client import connect as ws_connect

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from .conftest import serve, until
from .envs import ToolEnv

SERVER = pathlib.Path(__file__).resolve().parents[1] / "src" / "openenv" / "core" / "env_server"


def tool_app() -> Any:
    return create_app(ToolEnv, CallToolAction, CallToolObservation, env_name="tools", max_concurrent_envs=4)


def manager_of(server: Any) -> Any:
    return server.server.config.app.state.openenv_server.manager


def rpc(method: str, params: Dict[str, Any], request_id: int, **extra: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params, "id": request_id, **extra})


def add(a: int, request_id: int, seq: int) -> str:
    return rpc("tools/call", {"name": "add", "arguments": {"a": a, "b": 0}}, request_id, seq=seq)


async def test_ws_mcp_resumes_and_a_resent_numbered_call_runs_once() -> None:
    with serve(tool_app()) as server:
        manager = manager_of(server)
        url = f"ws://127.0.0.1:{server.port}/mcp"
        ws = await ws_connect(url, additional_headers={"X-OpenEnv-Resume": "1"})
        session_id = ws.response.headers["x-openenv-resume-session"]
        token = ws.response.headers["x-openenv-resume-token"]
        await ws.send(add(5, 1, seq=1))
        first = json.loads(await ws.recv())
        assert first["result"]["structured_content"] == {"result": 5}
        ws.transport.abort()  # dropped without a close: the session waits for its resume
        await until(lambda: not manager.sessions()[session_id].attached)
        headers = {"X-OpenEnv-Resume-Session": session_id, "X-OpenEnv-Resume-Token": token}
        async with ws_connect(url, additional_headers=headers) as resumed:
            await resumed.send(add(5, 1, seq=1))  # the answer was lost: sent again
            assert json.loads(await resumed.recv()) == first
            assert manager.sessions()[session_id].env.calls == 1  # answered from the record
            await resumed.send(add(7, 2, seq=2))
            assert json.loads(await resumed.recv())["result"]["structured_content"] == {"result": 7}
            assert manager.sessions()[session_id].env.calls == 2
            await resumed.send(add(1, 3, seq=1))
            stale = json.loads(await resumed.recv())["error"]
            assert "older than this session's last call" in stale["message"], stale
        await until(lambda: manager.active_sessions == 0)


async def test_ws_mcp_without_the_resume_header_numbers_nothing_and_ends_with_its_connection() -> None:
    with serve(tool_app()) as server:
        manager = manager_of(server)
        async with ws_connect(f"ws://127.0.0.1:{server.port}/mcp") as ws:
            assert "x-openenv-resume-session" not in ws.response.headers
            await ws.send(rpc("tools/call", {"name": "add", "arguments": {"a": 1}}, 1))
            assert json.loads(await ws.recv())["result"]["structured_content"] == {"result": 3}
            await ws.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            await ws.send(rpc("ping", {}, 2))  # a notification gets no answer: the next one is the ping's
            assert json.loads(await ws.recv()) == {"jsonrpc": "2.0", "result": {}, "id": 2}
            ws.transport.abort()
        await until(lambda: manager.active_sessions == 0)  # no resume asked: nothing waits


async def test_a_ws_mcp_client_that_leaves_mid_call_frees_its_slot_at_once() -> None:
    """As on ``/ws`` (the connection watcher): the slot is not held until the tool returns."""
    with serve(tool_app()) as server:
        manager = manager_of(server)
        ws = await ws_connect(f"ws://127.0.0.1:{server.port}/mcp")
        await ws.send(rpc("tools/call", {"name": "nap", "arguments": {"seconds": 30}}, 1))
        await until(lambda: any(s.lock.locked() for s in manager.sessions().values()))
        await asyncio.sleep(0.2)  # past WATCH_AFTER_S
        ws.transport.abort()
        await until(lambda: manager.active_sessions == 0, timeout=3)


async def test_an_mcp_frame_on_ws_with_its_number_runs_once() -> None:
    with serve(tool_app()) as server:
        manager = manager_of(server)
        async with ws_connect(f"ws://127.0.0.1:{server.port}/ws", additional_headers={"X-OpenEnv-Resume": "1"}) as ws:
            session_id = ws.response.headers["x-openenv-resume-session"]
            frame = {"type": "mcp", "data": json.loads(rpc("tools/call", {"name": "add", "arguments": {"a": 4}}, 9))}
            answers = []
            for _ in range(2):
                await ws.send(json.dumps({**frame, "seq": 1}))
                answers.append(json.loads(await ws.recv()))
            assert answers[0] == answers[1] and answers[0]["data"]["result"]["structured_content"] == {"result": 6}
            assert manager.sessions()[session_id].env.calls == 1


TRANSPORTS = ("transports/ws.py", "http_server.py", "transports/mcp.py", "web/__init__.py")
ONE_PLACE = {"once": "numbered calls answered once", "get": "a session looked up by id",
             "temporary": "a throw-away session"}  # fmt: skip


@pytest.mark.parametrize("module", TRANSPORTS)
def test_no_transport_looks_sessions_up_or_numbers_calls_itself(module: str) -> None:
    """Only the dispatcher calls ``Resume.once``, ``SessionManager.get`` and ``.temporary``."""
    tree = ast.parse((SERVER / module).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ONE_PLACE:
            owner = ast.unparse(node.func.value)
            if node.func.attr != "get" or "manager" in owner:  # (dict.get is fine)
                found.append(f"line {node.lineno}: {ast.unparse(node)[:80]} ({ONE_PLACE[node.func.attr]})")
    assert not found, f"{module} does what the dispatcher owns:\n" + "\n".join(found)
    dispatch = ast.unparse(ast.parse((SERVER / "dispatch.py").read_text()))
    assert all(f".{name}(" in dispatch for name in ONE_PLACE)  # (the test reads the right names)


async def test_each_environment_learns_its_servers_mode_and_pool_from_its_host() -> None:
    """The public host object (``Environment.host``), on every instance the server builds."""
    from .conftest import counter_app

    with serve(counter_app()) as server:
        manager = manager_of(server)
        async with ws_connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            await ws.recv()
            (session,) = manager.sessions().values()
            assert (session.env.host.mode, session.env.host.pool) == ("simulation", manager.pool)
    env = ToolEnv()
    assert (env.host.mode, env.host.pool) == (None, None)  # on its own: no server, no mode tools
    assert "peek" not in [tool.name for tool in await env.fastmcp_tools()]
    env._mode = "simulation"  # upstream's name still sets it
    assert env.host.mode == "simulation" and "peek" in [tool.name for tool in await env.fastmcp_tools()]
    env.close()
