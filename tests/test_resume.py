"""Resumable sessions (docs/resume.md), with real faults: a real server, a real client, and the
fault-injecting proxy of :mod:`openenv.testing.faults` between them. After each test no session
slot is left, and the environment counted exactly the steps the client made."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from openenv.core.client_errors import CapacityReachedError, SessionLostError
from openenv.core.env_server.runner import BackgroundServer
from openenv.core.env_server.settings import ServerLimits
from openenv.core.generic_client import GenericEnvClient
from openenv.testing.faults import FaultProxy

from .conftest import counter_app, serve, until
from .envs import AsyncCounterEnv, CounterEnv

FAST_PINGS = dict(websocket_ping_interval_s=0.2, websocket_ping_timeout_s=0.3)


def manager_of(server: Any) -> Any:
    return server.server.config.app.state.openenv_server.manager


async def run_episode(client: GenericEnvClient, steps: int) -> None:
    """Reset, then ``steps`` steps of growing deltas: each answer must be the running sum (a
    step lost or applied twice shows at once), and the state must count ``steps``."""
    await client.reset()
    total = 0
    for delta in range(1, steps + 1):
        total += delta
        result = await client.step({"delta": delta})
        assert result.observation["value"] == total, (delta, result.observation)
    state = await client.state()
    assert state["step_count"] == steps and state["value"] == total


@pytest.mark.parametrize("faults", [("reset",), ("cut",), ("after_request",), ("half_close",)])
async def test_episodes_carry_on_through_connection_faults(faults):
    with serve(counter_app(max_concurrent_envs=2)) as server, FaultProxy(server.port, seed=7) as proxy:
        manager = manager_of(server)
        proxy.chaos(0.01, faults)
        deadline = time.monotonic() + 20
        try:
            while sum(proxy.injected.values()) < 12:  # episodes until a dozen faults hit them
                assert time.monotonic() < deadline
                async with GenericEnvClient(base_url=proxy.base_url) as client:
                    await run_episode(client, 15)
        finally:
            proxy.calm()
        await until(lambda: manager.active_sessions == 0)


@pytest.mark.parametrize("env", [CounterEnv, AsyncCounterEnv], ids=["sync", "async"])
async def test_a_call_running_when_its_connection_drops_is_answered_after_the_resume(env):
    with serve(counter_app(env)) as server, FaultProxy(server.port) as proxy:
        manager = manager_of(server)
        async with GenericEnvClient(base_url=proxy.base_url) as client:
            await client.reset()
            step = asyncio.ensure_future(client.step({"delta": 3, "sleep_s": 0.6}))
            await until(lambda: any(s.lock.locked() for s in manager.sessions().values()))
            await asyncio.sleep(0.2)  # past WATCH_AFTER_S: a watcher reads the socket for the step
            assert proxy.fault("reset")
            result = await step
            assert result.observation["value"] == 3
            assert proxy.accepted == 2  # one resume
            assert (await client.state())["step_count"] == 1
        await until(lambda: manager.active_sessions == 0)


async def test_a_stalled_connection_is_replaced_and_the_session_taken_over():
    """Nothing flows and neither end is told: the client's pings notice, it resumes on a new
    connection while the server still holds the old one, which the resume supersedes."""
    with serve(counter_app()) as server, FaultProxy(server.port) as proxy:
        manager = manager_of(server)
        proxy.stall_s = 3.0
        async with GenericEnvClient(base_url=proxy.base_url, **FAST_PINGS) as client:
            await client.reset()
            await client.step({"delta": 1})
            assert proxy.fault("stall")
            started = time.monotonic()
            result = await client.step({"delta": 2})
            assert result.observation["value"] == 3
            assert time.monotonic() - started < 2.5  # resumed before the stall ended
            assert (await client.state())["step_count"] == 2
        await until(lambda: manager.active_sessions == 0)


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "unwatched"])
async def test_a_client_that_closes_while_its_call_runs_ends_the_session_at_once(watched, monkeypatch):
    """close() while a step runs: the close message and close frame arrive before the step's
    answer, which then cannot be sent. The session ends now; it does not sit out the resume
    grace period (60 s) holding its slot for a resume that will never come. With the step past
    WATCH_AFTER_S a watcher reads the close; without one the server reads it after the failed send."""
    if not watched:
        monkeypatch.setattr("openenv.core.env_server.ws_endpoint.WATCH_AFTER_S", 30.0)
    with serve(counter_app()) as server:
        manager = manager_of(server)
        assert manager.resume_grace_s == 60
        client = GenericEnvClient(base_url=server.base_url)
        await client.reset()
        step = asyncio.ensure_future(client.step({"delta": 1, "sleep_s": 0.4}))
        await until(lambda: any(s.lock.locked() for s in manager.sessions().values()))
        await client.close()
        await asyncio.gather(step, return_exceptions=True)
        await until(lambda: manager.active_sessions == 0)  # (not the 60 s of a grace period)


async def test_a_server_restarted_mid_episode_loses_the_session_and_says_why():
    app = counter_app()
    first = BackgroundServer(app).start()
    port = first.port
    client = GenericEnvClient(base_url=first.base_url, reconnect_timeout_s=5)
    try:
        await client.reset()
        await client.step({"delta": 1})
        first.stop()
        second = BackgroundServer(counter_app(), port=port).start()
        try:
            with pytest.raises(SessionLostError, match=r"not on this server.*restarted"):
                await client.step({"delta": 1})
            await run_episode(client, 3)  # reset() starts a new episode on the new server
        finally:
            await client.close()
            await until(lambda: manager_of(second).active_sessions == 0)
            second.stop()
    finally:
        first.stop()


async def test_a_session_not_resumed_within_its_grace_period_is_closed_and_the_client_told():
    limits = ServerLimits(resume_grace_s=0.3)
    with serve(counter_app(limits=limits)) as server, FaultProxy(server.port) as proxy:
        manager = manager_of(server)
        async with GenericEnvClient(base_url=proxy.base_url) as client:
            await client.reset()
            await client.step({"delta": 1})
            assert proxy.fault("reset")
            await until(lambda: manager.active_sessions == 0)  # the grace ran out
            with pytest.raises(SessionLostError, match=r"no client resumed it within 0.3 s"):
                await client.step({"delta": 1})


async def test_a_resume_with_a_wrong_token_is_refused_and_leaves_the_session_alone():
    with serve(counter_app()) as server, FaultProxy(server.port) as proxy:
        manager = manager_of(server)
        async with GenericEnvClient(base_url=proxy.base_url) as client:
            await client.reset()
            await client.step({"delta": 1})
            session_id = client._resume[0]
            for token in ("not-the-token", client._resume[1][:-1] + "x", ""):
                headers = {"X-OpenEnv-Session": session_id, "X-OpenEnv-Resume-Token": token}
                try:
                    async with ws_connect(
                        server.base_url.replace("http", "ws") + "/ws", additional_headers=headers
                    ) as ws:
                        # an empty token is no resume at all: a session of its own
                        assert token == "" and "x-openenv-session" not in ws.response.headers
                except InvalidStatus as exc:
                    assert exc.response.status_code == 403
                    assert b"cannot be resumed with this resume token" in exc.response.body
            assert proxy.fault("reset")  # the real client still resumes it
            assert (await client.step({"delta": 1})).observation["value"] == 2
            assert (await client.state())["step_count"] == 2
        await until(lambda: manager.active_sessions == 0)


async def test_a_session_waiting_for_its_resume_cannot_be_taken_by_its_id_alone():
    """Session ids are shown (handshake headers, logs, errors): while a socket's session waits for
    its resume, attaching ``/ws?session_id=`` or numbering HTTP calls on it must not hand it
    over (nor its token), nor disturb the numbers of its own calls."""
    with serve(counter_app()) as server, FaultProxy(server.port) as proxy:
        manager = manager_of(server)
        async with GenericEnvClient(base_url=proxy.base_url) as client:
            await client.reset()
            await client.step({"delta": 1})
            session_id = client._resume[0]
            assert proxy.fault("reset")
            await until(lambda: not manager.sessions()[session_id].attached)
            url = server.base_url.replace("http", "ws") + f"/ws?session_id={session_id}"
            async with ws_connect(url, additional_headers={"X-OpenEnv-Resume": "1"}) as ws:
                assert "x-openenv-resume-token" not in ws.response.headers
                frame = await ws.recv()
                assert "belongs to a WebSocket connection" in frame
            async with httpx.AsyncClient(base_url=server.base_url) as http:
                body = {"action": {"delta": 100}, "session_id": session_id}
                await http.post("/step", json=body, headers={"X-OpenEnv-Seq": "999999999"})
            assert (await client.step({"delta": 1})).observation["value"] in (2, 102)
            assert (await client.step({"delta": 1})).observation["value"] in (3, 103)  # not refused as stale
        await until(lambda: manager.active_sessions == 0)


async def test_sessions_waiting_for_a_resume_hold_their_slot():
    with serve(counter_app(max_concurrent_envs=1)) as server, FaultProxy(server.port) as proxy:
        manager = manager_of(server)
        async with GenericEnvClient(base_url=proxy.base_url) as client:
            await client.reset()
            await client.step({"delta": 1})
            assert proxy.fault("reset")
            await until(lambda: not next(iter(manager.sessions().values())).attached)
            with pytest.raises(CapacityReachedError):
                async with GenericEnvClient(base_url=server.base_url) as other:
                    await other.reset()
            assert (await client.step({"delta": 1})).observation["value"] == 2
        await until(lambda: manager.active_sessions == 0)


async def test_a_client_that_does_not_opt_in_gets_todays_sessions():
    """An upstream client sends no resume header: no headers back, frames without numbers, and
    its session ends with its connection."""
    with serve(counter_app()) as server:
        manager = manager_of(server)
        async with ws_connect(server.base_url.replace("http", "ws") + "/ws") as ws:
            assert "x-openenv-session" not in ws.response.headers
            await ws.send('{"type":"reset","data":{}}')
            await ws.recv()
            await ws.send('{"type":"step","data":{"delta":1},"seq":1}')
            assert '"VALIDATION_ERROR"' in await ws.recv()  # upstream's models refuse the key too
            ws.transport.abort()
        await until(lambda: manager.active_sessions == 0)


async def test_against_a_server_that_does_not_resume_the_client_behaves_as_before():
    """A server without resume (as upstream's): no sequence numbers are sent, and a dropped
    connection ends the episode with SessionLostError."""
    with serve(counter_app(limits=ServerLimits(resume_grace_s=0))) as server, FaultProxy(server.port) as proxy:
        async with GenericEnvClient(base_url=proxy.base_url) as client:
            await run_episode(client, 3)  # the server would refuse a frame with "seq"
            assert client._resume is None
            assert proxy.fault("reset")
            with pytest.raises(SessionLostError):
                await client.step({"delta": 1})
        await until(lambda: manager_of(server).active_sessions == 0)


async def test_a_sequence_number_makes_a_retried_http_step_on_a_named_session_run_once():
    with serve(counter_app()) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            created = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"})
            session_id = created.json()["result"]["session_id"]
            body = {"action": {"delta": 5}, "session_id": session_id}
            answers = [(await http.post("/step", json=body, headers={"X-OpenEnv-Seq": "1"})).json() for _ in range(3)]
            assert answers[0] == answers[1] == answers[2] and answers[0]["observation"]["value"] == 5
            step = await http.post("/step", json=body, headers={"X-OpenEnv-Seq": "2"})
            assert step.json()["observation"]["value"] == 10
            stale = await http.post("/step", json=body, headers={"X-OpenEnv-Seq": "1"})
            assert stale.status_code == 409 and "older than this session's last call" in stale.text
            for bad in (b"\xb2", b"x", b"9" * 40):  # "²" (isdigit), not a number, too long: the caller's error
                refused = await http.post("/step", json=body, headers={"X-OpenEnv-Seq": bad})
                assert 400 <= refused.status_code < 500, (bad, refused.status_code, refused.text)
            state = await http.get("/state", params={"session_id": session_id})
            assert state.json()["step_count"] == 2
            await http.post(
                "/mcp",
                json={
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "openenv/session/close",
                    "params": {"session_id": session_id},
                },
            )
        await until(lambda: manager_of(server).active_sessions == 0)


async def test_a_close_cut_off_on_its_way_still_ends_the_session():
    """The close message is cut mid-frame: the server sees a drop (and would keep the session for
    its grace period), so the client resumes the session to close it."""
    with serve(counter_app()) as server, FaultProxy(server.port) as proxy:
        manager = manager_of(server)
        client = GenericEnvClient(base_url=proxy.base_url)
        await run_episode(client, 2)
        assert proxy.fault("cut")
        await client.close()
        assert proxy.accepted == 2
        await until(lambda: manager.active_sessions == 0, timeout=2)  # not the 60 s grace period


async def test_a_connection_that_drops_before_its_first_call_does_not_hold_its_slot():
    with serve(counter_app()) as server:
        manager = manager_of(server)
        headers = {"X-OpenEnv-Resume": "1"}
        async with ws_connect(server.base_url.replace("http", "ws") + "/ws", additional_headers=headers) as ws:
            session_id = ws.response.headers["x-openenv-session"]
            await until(lambda: session_id in manager.sessions())  # (built after the handshake)
            ws.transport.abort()
        await until(lambda: manager.active_sessions == 0, timeout=2)


async def test_an_http_session_create_sent_again_with_its_key_answers_the_same_session():
    with serve(counter_app(max_concurrent_envs=2)) as server:
        manager = manager_of(server)
        async with httpx.AsyncClient(base_url=server.base_url) as http:

            async def create(key: str) -> str:
                body = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}
                answer = await http.post("/mcp", json=body, headers={"X-OpenEnv-Create-Key": key})
                return answer.json()["result"]["session_id"]

            first = await create("key-1")
            assert await create("key-1") == first and manager.active_sessions == 1
            assert await create("key-2") != first and manager.active_sessions == 2
        await manager.request_close(first)
        assert manager.active_sessions == 1


async def test_an_mcp_client_in_production_mode_carries_on_through_resets():
    """Production mode: the session is made over HTTP and the WebSocket attaches to it; resets hit
    the HTTP calls and the socket alike."""
    from echo_env import EchoEnv
    from echo_env.server.echo_environment import EchoEnvironment

    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    app = create_app(EchoEnvironment, CallToolAction, CallToolObservation, env_name="echo", max_concurrent_envs=4)
    with serve(app) as server, FaultProxy(server.port, seed=3) as proxy:
        manager = manager_of(server)
        proxy.chaos(0.01, ("reset",))
        deadline = time.monotonic() + 20
        try:
            while proxy.injected["reset"] < 12:
                assert time.monotonic() < deadline
                async with EchoEnv(base_url=proxy.base_url) as env:
                    await env.reset()
                    for i in range(10):
                        action = CallToolAction(tool_name="echo_message", arguments={"message": f"m{i}"})
                        assert (await env.step(action)).observation.result == f"m{i}"
                    assert (await env.state()).step_count == 10
        finally:
            proxy.calm()
        await until(lambda: manager.active_sessions == 0)
