"""Bad input and churn: the server stays healthy, answers every bad frame, and leaks no session.

(Memory growth per cycle is measured by bench/bench_churn.py, not asserted here.)
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from .conftest import connect, counter_app, serve, until
from .envs import TRACKER

# Every test here runs twice: see conftest.compression_offer.
pytestmark = pytest.mark.usefixtures("compression_offer")


def ws_url(server) -> str:
    return server.base_url.replace("http://", "ws://") + "/ws"


async def ask(ws, message) -> dict:
    await ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))
    return json.loads(await ws.recv())


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def healthy(server) -> bool:
    return httpx.get(server.base_url + "/health", timeout=5).json() == {"status": "healthy"}


@pytest.mark.internals("uvicorn")
async def test_a_200_mb_frame_is_refused_and_the_connection_keeps_working():
    """Refused from its header on, never buffered (uncompressed: a compressed message over the
    limit closes the connection, see test_ws_protocol)."""
    with serve(counter_app()) as server:
        async with connect(ws_url(server), max_size=None, open_timeout=30, compression=None) as ws:
            await ask(ws, {"type": "reset", "data": {"start": 1}})
            blob = "x" * (200 * 1024 * 1024)
            reply = await asyncio.wait_for(ask(ws, '{"type":"step","data":{"metadata":{"blob":"' + blob + '"}}}'), 60)
            del blob
            assert reply["data"]["code"] == "MESSAGE_TOO_LARGE"
            assert (await ask(ws, {"type": "step", "data": {"delta": 1}}))["data"]["observation"]["value"] == 2
        assert healthy(server)


async def test_every_kind_of_bad_frame_in_a_row_on_one_connection():
    bad = [
        "not json",
        "[]",
        "null",
        "42",
        b"\x00\x01binary",
        json.dumps({"type": 7}),
        json.dumps({"type": "step", "data": {"delta": {"nested": [1, 2]}}}),
        json.dumps({"type": "step", "data": {"metadata": "not a dict"}}),
        json.dumps({"type": "mcp", "data": "nope"}),
        json.dumps({"type": "mcp", "data": {"jsonrpc": "1.0", "method": "x"}}),
        "{" * 10_000,
        "[" * 100_000 + "]" * 100_000,  # deeper than the JSON decoder's recursion limit
        json.dumps({"type": "step", "data": {"metadata": _nested(150)}}),  # deeper than the server's limit
    ]
    with serve(counter_app()) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset"})
            for frame in bad:
                reply = await ask(ws, frame)
                assert reply["type"] in ("error", "mcp"), frame
                if reply["type"] == "mcp":
                    assert "error" in reply["data"]
            assert (await ask(ws, {"type": "step", "data": {"delta": 3}}))["data"]["observation"]["value"] == 3
        assert healthy(server)


async def test_fifty_clients_dropping_mid_step_leak_nothing():
    with serve(counter_app(max_concurrent_envs=64)) as server:
        manager = server.server.config.app.state.openenv_server.manager
        sockets = []
        for _ in range(50):
            ws = await connect(ws_url(server))
            await ask(ws, {"type": "reset"})
            await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 0.3}}))
            sockets.append(ws)
        await asyncio.sleep(0.05)
        for ws in sockets:
            ws.transport.abort()
        await until(lambda: manager.active_sessions == 0)
        await until(lambda: TRACKER.alive == 0, timeout=10)  # each env closed after its step returned
        await until(lambda: not manager._background)
        assert manager.pool.stuck == 0
        assert healthy(server)
        async with connect(ws_url(server)) as ws:
            assert (await ask(ws, {"type": "reset"}))["type"] == "observation"


async def test_frames_read_ahead_during_a_long_step_are_bounded_in_size_and_all_answered():
    """A client may send more frames while a step runs; the server reads some ahead (to notice the
    client leaving) but holds at most PIPELINE_MAX_CHARS of them plus one, not PIPELINE_DEPTH frames
    of up to the message limit each, and answers every frame in order once the step is done."""
    from openenv.core.env_server.transports.ws import PIPELINE_DEPTH, PIPELINE_MAX_CHARS

    pad = "x" * (PIPELINE_MAX_CHARS // 3 + 1)  # three frames reach the bound
    frames = 8
    assert frames < PIPELINE_DEPTH
    with serve(counter_app()) as server:
        app_server = server.server.config.app.state.openenv_server
        async with connect(ws_url(server), max_size=None) as ws:
            await ask(ws, {"type": "reset"})
            await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 0.8}}))
            for i in range(frames):
                await ws.send(json.dumps({"type": "step", "data": {"delta": 1, "metadata": {"i": i, "pad": pad}}}))
            (connection,) = app_server.ws_context.watch._connections
            await until(lambda: connection._watcher is not None and connection._watcher.done())
            held = [m for m in connection._backlog if m.get("text")]
            assert len(held) == 3
            assert sum(len(m["text"]) for m in held) < PIPELINE_MAX_CHARS + len(pad) + 200
            assert (await ws.recv()).startswith('{"type":"observation"')
            values = [json.loads(await ws.recv())["data"]["observation"]["value"] for _ in range(frames)]
            assert values == list(range(2, frames + 2))  # the long step counted 1
        assert healthy(server)


async def test_binary_frames_read_ahead_during_a_long_step_are_not_kept():
    from openenv.core.env_server.transports.ws import WSConnection

    kept = []
    original = WSConnection._admit

    def admit(self, message):
        admitted = original(self, message)
        kept.append(admitted)
        return admitted

    with serve(counter_app()) as server:
        async with connect(ws_url(server), max_size=None) as ws:
            await ask(ws, {"type": "reset"})
            WSConnection._admit = admit
            try:
                await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 0.3}}))
                await ws.send(b"\0" * 1_000_000)
                assert json.loads(await ws.recv())["type"] == "observation"
                assert json.loads(await ws.recv())["data"]["code"] == "UNSUPPORTED_FRAME"
            finally:
                WSConnection._admit = original
            assert (await ask(ws, {"type": "step", "data": {"delta": 2}}))["data"]["observation"]["value"] == 3
        assert kept and not any(m.get("bytes") for m in kept)
        assert healthy(server)


async def test_graceful_and_abrupt_connect_disconnect_cycles_leak_nothing():
    cycles = 1000
    with serve(counter_app(max_concurrent_envs=8)) as server:
        manager = server.server.config.app.state.openenv_server.manager
        for i in range(cycles):
            ws = await connect(ws_url(server))
            if i % 2:
                await ask(ws, {"type": "reset"})
            await ws.close()
        for i in range(cycles):
            ws = await connect(ws_url(server))
            if i % 2:
                await ask(ws, {"type": "reset"})
            ws.transport.abort()
        await until(lambda: manager.active_sessions == 0, timeout=10)
        await until(lambda: TRACKER.alive == 0, timeout=10)
        assert TRACKER.created == 2 * cycles
        assert manager.pool.threads <= manager.pool.max_workers
        assert healthy(server)


async def test_capacity_refusals_under_churn_never_leak_a_slot():
    with serve(counter_app(max_concurrent_envs=2)) as server:
        manager = server.server.config.app.state.openenv_server.manager

        async def try_session() -> str:
            async with connect(ws_url(server)) as ws:
                try:
                    await ws.send(json.dumps({"type": "reset"}))
                except ConnectionClosed:
                    pass  # refused before our frame went out; its error frame is still readable
                reply = json.loads(await ws.recv())
                await asyncio.sleep(0.01)
                return reply["type"] if reply["type"] != "error" else reply["data"]["code"]

        outcomes = await asyncio.gather(*(try_session() for _ in range(40)))
        assert set(outcomes) <= {"observation", "CAPACITY_REACHED"}
        assert "observation" in outcomes and "CAPACITY_REACHED" in outcomes
        await until(lambda: manager.active_sessions == 0)
        async with connect(ws_url(server)) as a, connect(ws_url(server)) as b:
            assert (await ask(a, {"type": "reset"}))["type"] == "observation"
            assert (await ask(b, {"type": "reset"}))["type"] == "observation"


async def test_detached_sessions_are_reaped_but_connected_ones_never_are():
    from openenv.core.env_server.types import ConcurrencyConfig

    config = ConcurrencyConfig(max_concurrent_envs=4, session_timeout=0.3)
    with serve(counter_app(max_concurrent_envs=None, concurrency_config=config)) as server:
        manager = server.server.config.app.state.openenv_server.manager
        http = httpx.Client(base_url=server.base_url)
        detached = http.post("/mcp", json={"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}).json()[
            "result"
        ]["session_id"]
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset", "data": {"start": 5}})
            await asyncio.sleep(1.2)  # four idle limits, several reaper passes
            # the connected, idle session still has its environment and its episode
            assert (await ask(ws, {"type": "step", "data": {"delta": 1}}))["data"]["observation"]["value"] == 6
            assert detached not in manager.sessions()
        http.close()


def test_deep_json_in_http_requests_is_refused_cleanly():
    with serve(counter_app()) as server, httpx.Client(base_url=server.base_url) as http:
        response = http.post(
            "/mcp", content=("[" * 100_000 + "]" * 100_000).encode(), headers={"content-type": "application/json"}
        )
        assert response.json()["error"]["code"] == -32700
        response = http.post(
            "/step", content=("[" * 100_000 + "]" * 100_000).encode(), headers={"content-type": "application/json"}
        )
        assert 400 <= response.status_code < 500
        assert healthy(server)


async def test_a_closed_session_frees_its_slot_before_the_close_completes():
    """With one slot, a client that reconnects right after close() is never refused."""
    from .envs import CounterClient

    with serve(counter_app(max_concurrent_envs=1)) as server:
        for start in range(200):
            async with CounterClient(base_url=server.base_url) as env:
                assert (await env.reset(start=start)).observation.value == start
