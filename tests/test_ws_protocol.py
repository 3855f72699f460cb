"""The /ws protocol on the wire, driven by a raw WebSocket client against a live server."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from websockets.exceptions import ConnectionClosed

from .conftest import connect, counter_app, serve, until
from .envs import TRACKER, AsyncCounterEnv, BrokenFactoryEnv, CounterEnv

# Every test here runs twice: see conftest.compression_offer.
pytestmark = pytest.mark.usefixtures("compression_offer")


def ws_url(server) -> str:
    return server.base_url.replace("http://", "ws://") + "/ws"


async def ask(ws, message) -> dict:
    await ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))
    return json.loads(await ws.recv())


async def test_reset_step_state_frames_have_the_openenv_shapes(counter_server):
    async with connect(ws_url(counter_server)) as ws:
        reply = await ask(ws, {"type": "reset", "data": {"seed": 3}})
        assert reply == {
            "type": "observation",
            "data": {
                "observation": {"metadata": {"seed": 3}, "value": 3},
                "reward": 0.0,
                "done": False,
                "metadata": {"seed": 3},
            },
        }
        reply = await ask(ws, {"type": "step", "data": {"delta": 2}})
        # empty metadata: no top-level key; an int reward stays an int
        assert reply == {
            "type": "observation",
            "data": {"observation": {"metadata": {}, "value": 5}, "reward": 2, "done": False},
        }
        reply = await ask(ws, {"type": "state"})
        assert reply == {"type": "state", "data": {"episode_id": "episode", "step_count": 1, "value": 5}}


async def test_reset_without_data_and_unknown_reset_keys_are_dropped(counter_server):
    async with connect(ws_url(counter_server)) as ws:
        assert (await ask(ws, {"type": "reset"}))["data"]["observation"]["value"] == 0
        reply = await ask(ws, {"type": "reset", "data": {"start": 7, "not_a_parameter": 1}})
        assert reply["data"]["observation"]["value"] == 7


async def test_done_is_reported(counter_server):
    async with connect(ws_url(counter_server)) as ws:
        await ask(ws, {"type": "reset"})
        reply = await ask(ws, {"type": "step", "data": {"delta": 10}})
        assert reply["data"]["done"] is True


@pytest.mark.parametrize(
    "frame, code, fragment",
    [
        ("this is not json", "INVALID_JSON", "Invalid JSON"),
        ("[1, 2, 3]", "VALIDATION_ERROR", "Invalid message"),
        ('"a string"', "VALIDATION_ERROR", "Invalid message"),
        (b'{"type": "reset"}', "UNSUPPORTED_FRAME", "Binary frames"),
        ({"type": "jump"}, "UNKNOWN_TYPE", "Unknown message type: jump"),
        ({"data": {}}, "UNKNOWN_TYPE", "Unknown message type: "),
        ({"type": "step", "data": {"delta": "many"}}, "VALIDATION_ERROR", "Invalid message"),
        ({"type": "step", "data": {"bogus": 1}}, "VALIDATION_ERROR", "Invalid message"),
        ({"type": "step"}, "VALIDATION_ERROR", "Invalid message"),
        ({"type": "step", "data": [1]}, "VALIDATION_ERROR", "Invalid message"),
        ({"type": "reset", "data": {}, "extra": 1}, "VALIDATION_ERROR", "Invalid message"),
        ({"type": "state", "data": {}}, "VALIDATION_ERROR", "Invalid message"),
        ({"type": "reset", "data": {"seed": -1}}, "VALIDATION_ERROR", "Invalid message"),
        ({"type": "reset", "data": {"episode_id": "x" * 256}}, "VALIDATION_ERROR", "Invalid message"),
        ({"type": "step", "data": {"fail": True}}, "EXECUTION_ERROR", "the step failed on purpose"),
    ],
)
async def test_every_bad_frame_gets_an_error_and_the_connection_keeps_working(counter_server, frame, code, fragment):
    async with connect(ws_url(counter_server)) as ws:
        await ask(ws, {"type": "reset", "data": {"start": 1}})
        reply = await ask(ws, frame)
        assert reply["type"] == "error"
        assert reply["data"]["code"] == code
        assert fragment in reply["data"]["message"]
        # same connection, same session: the episode goes on
        reply = await ask(ws, {"type": "step", "data": {"delta": 1}})
        assert reply["type"] == "observation"
        assert reply["data"]["observation"]["value"] == 2


async def test_validation_errors_carry_pydantic_error_lists(counter_server):
    async with connect(ws_url(counter_server)) as ws:
        reply = await ask(ws, {"type": "step", "data": {"bogus": 1}})
        errors = reply["data"]["errors"]
        assert errors[0]["type"] == "extra_forbidden"
        assert errors[0]["loc"] == ["bogus"]


@pytest.mark.internals("uvicorn")
async def test_oversized_frame_is_refused_with_an_error_and_an_uncompressed_connection_survives(compression_offer):
    """An uncompressed frame over the limit is skipped unread and the connection goes on; a
    compressed one cannot be skipped (the compression context would break): after the same error
    frame, the connection is closed with 1009."""
    with serve(counter_app(max_message_size_mb=0.01)) as server:
        async with connect(ws_url(server), max_size=None) as ws:
            await ask(ws, {"type": "reset"})
            reply = await ask(ws, {"type": "step", "data": {"delta": 1, "metadata": {"blob": "x" * 20_000}}})
            assert reply["data"]["code"] == "MESSAGE_TOO_LARGE"
            assert reply["data"]["limit"] == int(0.01 * 1024 * 1024)
            if compression_offer is None:
                assert (await ask(ws, {"type": "step", "data": {"delta": 1}}))["data"]["observation"]["value"] == 1
            else:
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
                assert closed.value.rcvd.code == 1009


async def test_close_frame_ends_the_session_and_frees_its_slot():
    with serve(counter_app(max_concurrent_envs=1)) as server:
        app_server = server.server.config.app.state.openenv_server
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset"})
            assert app_server.active_sessions == 1
            await ws.send(json.dumps({"type": "close"}))
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
        await until(lambda: app_server.active_sessions == 0)
        await until(lambda: TRACKER.alive == 0)


async def test_capacity_is_enforced_with_an_error_frame_then_close():
    with serve(counter_app(max_concurrent_envs=2)) as server:
        async with connect(ws_url(server)) as a, connect(ws_url(server)) as b:
            await ask(a, {"type": "reset"})
            await ask(b, {"type": "reset"})
            async with connect(ws_url(server)) as c:
                reply = json.loads(await c.recv())
                assert reply == {
                    "type": "error",
                    "data": {
                        "message": "Server at capacity: 2/2 sessions active. Cannot accept new connections.",
                        "code": "CAPACITY_REACHED",
                        "active_sessions": 2,
                        "max_sessions": 2,
                    },
                }
                with pytest.raises(ConnectionClosed):
                    await c.recv()
        # both slots are free again: a new connection works
        async with connect(ws_url(server)) as d:
            assert (await ask(d, {"type": "reset"}))["type"] == "observation"


async def test_factory_failure_is_reported_as_factory_error():
    with serve(counter_app(BrokenFactoryEnv)) as server:
        async with connect(ws_url(server)) as ws:
            reply = json.loads(await ws.recv())
            assert reply["data"]["code"] == "FACTORY_ERROR"
            assert reply["data"]["factory_name"] == "BrokenFactoryEnv"
        assert server.server.config.app.state.openenv_server.active_sessions == 0


async def test_each_socket_is_its_own_session(counter_server):
    async with connect(ws_url(counter_server)) as a, connect(ws_url(counter_server)) as b:
        await ask(a, {"type": "reset", "data": {"start": 1}})
        await ask(b, {"type": "reset", "data": {"start": 5}})
        assert (await ask(a, {"type": "step", "data": {"delta": 1}}))["data"]["observation"]["value"] == 2
        assert (await ask(b, {"type": "step", "data": {"delta": 1}}))["data"]["observation"]["value"] == 6


async def test_pipelined_frames_are_answered_in_order(counter_server):
    async with connect(ws_url(counter_server)) as ws:
        await ws.send(json.dumps({"type": "reset"}))
        for _ in range(5):
            await ws.send(json.dumps({"type": "step", "data": {"delta": 1}}))
        replies = [json.loads(await ws.recv()) for _ in range(6)]
        assert [r["data"]["observation"]["value"] for r in replies] == [0, 1, 2, 3, 4, 5]


async def test_async_environment_runs_on_the_loop():
    with serve(counter_app(AsyncCounterEnv)) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset", "data": {"start": 2}})
            reply = await ask(ws, {"type": "step", "data": {"delta": 3}})
            assert reply["data"]["observation"]["value"] == 5
        assert TRACKER.threads == {"openenv-background-server"}  # the server's loop thread, no worker


async def test_step_timeout_answers_timeout_and_server_keeps_serving():
    with serve(counter_app(step_timeout_s=0.3)) as server:
        async with connect(ws_url(server)) as ws, connect(ws_url(server)) as other:
            await ask(ws, {"type": "reset", "data": {"start": 4}})
            started = time.monotonic()
            reply = await ask(ws, {"type": "step", "data": {"sleep_s": 2.0}})
            assert time.monotonic() - started < 1.5
            assert reply["data"]["code"] == "TIMEOUT"
            assert reply["data"]["timeout_s"] == 0.3
            # other sessions are served meanwhile
            assert (await ask(other, {"type": "reset"}))["type"] == "observation"
            # this session goes on with a fresh environment after reset
            assert (await ask(ws, {"type": "reset", "data": {"start": 1}}))["data"]["observation"]["value"] == 1
            assert (await ask(ws, {"type": "step", "data": {"delta": 1}}))["data"]["observation"]["value"] == 2
        # the abandoned environment is closed once its step returns
        await until(lambda: TRACKER.alive == 0, timeout=5)


async def test_async_step_timeout_cancels_the_step():
    with serve(counter_app(AsyncCounterEnv, step_timeout_s=0.2)) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset"})
            reply = await ask(ws, {"type": "step", "data": {"sleep_s": 5.0}})
            assert reply["data"]["code"] == "TIMEOUT"
            assert (await ask(ws, {"type": "reset"}))["type"] == "observation"


class _SyncOwnTimeout(CounterEnv):
    def step(self, action, timeout_s=None):
        raise TimeoutError("the backend did not answer")


class _AsyncOwnTimeout(AsyncCounterEnv):
    async def step_async(self, action, timeout_s=None):
        raise TimeoutError("the backend did not answer")


@pytest.mark.parametrize("env_cls", [_SyncOwnTimeout, _AsyncOwnTimeout], ids=["sync", "async"])
async def test_an_environments_own_timeout_error_is_not_the_step_timeout(env_cls):
    with serve(counter_app(env_cls, step_timeout_s=5.0)) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset"})
            reply = await ask(ws, {"type": "step", "data": {}})
            assert reply["data"]["code"] == "EXECUTION_ERROR"
            assert reply["data"]["exception"] == "TimeoutError"
            assert "the backend did not answer" in reply["data"]["message"]
            assert (await ask(ws, {"type": "reset"}))["type"] == "observation"


async def test_step_timeout_from_environment_variable(monkeypatch):
    monkeypatch.setenv("OPENENV_STEP_TIMEOUT_S", "0.2")
    with serve(counter_app()) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset"})
            assert (await ask(ws, {"type": "step", "data": {"sleep_s": 1.0}}))["data"]["code"] == "TIMEOUT"


async def test_client_dropping_mid_step_frees_its_slot_and_closes_the_env_after_the_step():
    with serve(counter_app(max_concurrent_envs=1)) as server:
        app_server = server.server.config.app.state.openenv_server
        ws = await connect(ws_url(server))
        await ask(ws, {"type": "reset"})
        await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 0.5}}))
        await asyncio.sleep(0.1)
        ws.transport.abort()  # abrupt: no close handshake
        await until(lambda: app_server.active_sessions == 0)
        assert TRACKER.alive == 1  # the step is still running in its worker
        await until(lambda: TRACKER.alive == 0, timeout=3)
        async with connect(ws_url(server)) as again:
            assert (await ask(again, {"type": "reset"}))["type"] == "observation"


def test_sync_env_is_served_from_the_worker_pool_not_one_thread_per_session():
    async def run() -> None:
        with serve(counter_app(CounterEnv, max_concurrent_envs=8, worker_threads=2)) as server:
            sockets = [await connect(ws_url(server)) for _ in range(8)]
            for ws in sockets:
                await ask(ws, {"type": "reset"})
            await asyncio.gather(*(ask(ws, {"type": "step", "data": {"sleep_s": 0.05}}) for ws in sockets))
            for ws in sockets:
                await ws.close()

    asyncio.run(run())
    assert 1 <= len(TRACKER.threads) <= 2
