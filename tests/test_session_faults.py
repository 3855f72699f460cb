"""Faults around sessions, on live servers: environments that raise what a future cannot carry,
calls whose callers went away while the environment keeps running, hung closes, timeouts while a
session is built, and the reaper's view of failing calls."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any, Optional

import httpx
import pytest
from fastmcp import FastMCP

from openenv.core.env_server import sessions as sessions_module
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.env_server.sessions import SessionKind, SessionManager, SessionState
from openenv.core.env_server.types import ConcurrencyConfig

from .conftest import connect, counter_app, serve, until
from .envs import TRACKER, CounterAction, CounterEnv, CounterObservation, CounterState

# Every test here runs twice: see conftest.compression_offer.
pytestmark = pytest.mark.usefixtures("compression_offer")


def ws_url(server: Any, query: str = "") -> str:
    return server.base_url.replace("http://", "ws://") + "/ws" + (f"?{query}" if query else "")


async def ask(ws: Any, message: Any) -> dict:
    await ws.send(json.dumps(message))
    return json.loads(await asyncio.wait_for(ws.recv(), 20))


def manager_of(server: Any) -> SessionManager:
    return server.server.config.app.state.openenv_server.manager


class FaultAction(CounterAction):
    fault: str = ""


class FaultEnv(CounterEnv):
    """A counter whose step can raise StopIteration or SystemExit, and that records how many
    steps run on one instance at once."""

    running = 0
    most_at_once = 0
    guard = threading.Lock()

    def step(self, action: FaultAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        cls = type(self)
        with cls.guard:
            cls.running += 1
            cls.most_at_once = max(cls.most_at_once, cls.running)
        try:
            if action.fault == "stop_iteration":
                next(iter(()))  # an exhausted iterator, as a dataset at its end
            if action.fault == "system_exit":
                sys.exit(3)  # a library calling sys.exit()
            return super().step(CounterAction(delta=action.delta, sleep_s=action.sleep_s))
        finally:
            with cls.guard:
                cls.running -= 1


class AsyncFaultEnv(FaultEnv):
    async def step_async(self, action: FaultAction, timeout_s: Optional[float] = None) -> CounterObservation:
        if action.fault == "system_exit":
            sys.exit(3)
        return self.step(action)


def fault_app(env: Any = FaultEnv, **kwargs: Any) -> Any:
    kwargs.setdefault("max_concurrent_envs", 4)
    return create_app(env, FaultAction, CounterObservation, env_name="faults", state_cls=CounterState, **kwargs)


@pytest.mark.parametrize("env", [FaultEnv, AsyncFaultEnv], ids=["sync", "async"])
@pytest.mark.parametrize("fault", ["stop_iteration", "system_exit"])
async def test_a_step_raising_stop_iteration_or_system_exit_gets_an_error_frame(env, fault):
    """A future refuses StopIteration (the step used to hang, holding the session), and SystemExit
    re-raised in a task stops the event loop: both are answered EXECUTION_ERROR naming the
    exception, and the connection and the server keep working."""
    if env is AsyncFaultEnv and fault == "stop_iteration":
        pytest.skip("in a coroutine, Python itself turns StopIteration into RuntimeError")
    with serve(fault_app(env)) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset"})
            reply = await ask(ws, {"type": "step", "data": {"fault": fault}})
            assert reply["type"] == "error"
            assert reply["data"]["code"] == "EXECUTION_ERROR"
            expected = "StopIteration" if fault == "stop_iteration" else "SystemExit"
            assert reply["data"]["exception"] == expected
            assert expected in reply["data"]["message"]
            reply = await ask(ws, {"type": "step", "data": {"delta": 2}})
            assert reply["data"]["observation"]["value"] == 2
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
        response = httpx.post(server.base_url + "/step", json={"action": {"fault": fault}}, timeout=20)
        assert response.status_code == 500 and expected in response.json()["detail"]


async def test_a_client_leaving_a_detached_session_mid_step_never_leaves_two_steps_on_its_env():
    """The dropped client's step keeps running in its worker; the next client on that detached
    session waits for it instead of stepping the same instance at the same time."""
    FaultEnv.most_at_once = 0
    with serve(fault_app()) as server:
        with httpx.Client(base_url=server.base_url, timeout=10) as http:
            created = http.post("/mcp", json={"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1})
        session_id = created.json()["result"]["session_id"]
        ws = await connect(ws_url(server, f"session_id={session_id}"))
        await ask(ws, {"type": "reset"})
        await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 1.0}}))
        await asyncio.sleep(0.4)  # past the point where the server watches the socket
        await ws.close()
        session = manager_of(server).sessions()[session_id]
        await until(lambda: not session.lock.locked())
        assert session.inflight is not None and not session.inflight.done  # the step still runs
        async with connect(ws_url(server, f"session_id={session_id}")) as again:
            began = time.monotonic()
            reply = await ask(again, {"type": "step", "data": {"delta": 1}})
            waited = time.monotonic() - began
        assert reply["data"]["observation"]["value"] == 2  # after the abandoned step's own +1
        assert FaultEnv.most_at_once == 1
        assert waited > 0.2


async def test_a_close_that_never_returns_does_not_take_the_pools_only_worker(monkeypatch):
    monkeypatch.setattr(sessions_module, "CLOSE_TIMEOUT_S", 0.3)
    release = threading.Event()

    class HangingClose(CounterEnv):
        def close(self) -> None:
            release.wait(30)
            super().close()

    app = counter_app(HangingClose, max_concurrent_envs=1)
    try:
        with serve(app) as server:
            manager = manager_of(server)
            async with connect(ws_url(server)) as ws:
                await ask(ws, {"type": "reset"})
            # the close runs past its timeout (one to two windows of CLOSE_TIMEOUT_S after it started)
            await until(lambda: manager.pool.stuck == 1, timeout=3)
            async with connect(ws_url(server)) as ws:  # served by a replacement worker
                assert (await ask(ws, {"type": "reset"}))["type"] == "observation"
                assert (await ask(ws, {"type": "step", "data": {}}))["data"]["observation"]["value"] == 1
            release.set()
            await until(lambda: manager.pool.stuck == 0)
    finally:
        release.set()


class ModeToolsEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("modes")

        @mcp.tool
        def nap(seconds: float) -> str:
            time.sleep(seconds)
            return "rested"

        super().__init__(mcp)

        @self.tool(mode="simulation")
        def peek() -> str:
            return "simulation only"

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CounterObservation:
        return CounterObservation(value=0)

    def _step_impl(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        return CounterObservation(value=0)

    @property
    def state(self) -> CounterState:
        return CounterState(episode_id="e", step_count=0)


async def test_an_environment_rebuilt_after_a_step_timeout_is_prepared_like_the_first():
    """Mode-specific tools (and the server's worker pool) are given to the fresh instance too."""
    app = create_app(ModeToolsEnv, CallToolAction, CallToolObservation, env_name="modes", step_timeout_s=0.3)
    with serve(app) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset"})
            peek = {"type": "call_tool", "tool_name": "peek", "arguments": {}}
            assert (await ask(ws, {"type": "step", "data": peek}))["data"]["observation"]["result"]["data"] == (
                "simulation only"
            )
            nap = {"type": "call_tool", "tool_name": "nap", "arguments": {"seconds": 0.8}}
            assert (await ask(ws, {"type": "step", "data": nap}))["data"]["code"] == "TIMEOUT"
            reply = await ask(ws, {"type": "step", "data": peek})
            assert reply["data"]["observation"]["result"]["data"] == "simulation only", reply
            session = next(iter(manager_of(server).sessions().values()))
            assert session.env.host.pool is manager_of(server).pool


@pytest.mark.internals("fastmcp")
async def test_an_abandoned_sync_tool_call_keeps_its_environment_busy():
    """A sync tool past its own deadline goes on in its worker; the next tool call on that
    environment waits for it rather than running beside it."""
    env = ModeToolsEnv()
    started = time.monotonic()
    first = await env.step_async(CallToolAction(tool_name="nap", arguments={"seconds": 0.6}), timeout_s=0.2)
    assert first.error is not None and first.error.error_type.value == "timeout"
    second = await env.step_async(CallToolAction(tool_name="nap", arguments={"seconds": 0.0}), timeout_s=5)
    assert second.error is None
    assert time.monotonic() - started >= 0.55  # it waited for the first nap to end


async def test_a_tools_own_timeout_error_is_an_execution_error_not_the_deadline():
    mcp = FastMCP("t")

    @mcp.tool
    def flaky() -> str:
        raise TimeoutError("the upstream API timed out")

    class Env(ModeToolsEnv):
        def __init__(self) -> None:
            MCPEnvironment.__init__(self, mcp)

    observation = await Env().step_async(CallToolAction(tool_name="flaky", arguments={}), timeout_s=5)
    assert observation.error is not None
    assert observation.error.error_type.value == "execution_error"
    assert "upstream API timed out" in observation.error.message


async def test_a_session_whose_calls_fail_is_not_reaped_as_idle():
    config = ConcurrencyConfig(max_concurrent_envs=2, session_timeout=0.5)
    with serve(fault_app(max_concurrent_envs=None, concurrency_config=config)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            created = await http.post("/mcp", json={"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1})
            session_id = created.json()["result"]["session_id"]
            for _ in range(8):  # 1.2 s of failing steps, each 0.15 s apart
                response = await http.post(
                    "/step", json={"action": {"fault": "stop_iteration"}, "session_id": session_id}
                )
                assert response.status_code == 500, response.text
                await asyncio.sleep(0.15)
            assert session_id in manager_of(server).sessions()


async def test_a_destroy_cancelled_while_it_waits_still_closes_the_environment():
    manager = SessionManager(CounterEnv, max_sessions=2)
    session = await manager.create(SessionKind.DETACHED)
    closed_before = TRACKER.closed
    busy = asyncio.ensure_future(manager.step(session, CounterAction(sleep_s=0.3)))
    await until(lambda: TRACKER.threads)  # the step runs in the environment
    destroying = asyncio.ensure_future(manager.destroy(session))
    await until(lambda: session.state is SessionState.CLOSING)  # destroy now waits for the step
    destroying.cancel()  # e.g. a shutdown cancelling the socket task that was closing its session
    with pytest.raises(asyncio.CancelledError):
        await destroying
    await busy
    await until(lambda: TRACKER.closed == closed_before + 1)
    assert session.state is SessionState.CLOSED
    await manager.shutdown()


async def test_a_single_thread_environment_stays_on_one_thread_after_a_step_timeout():
    from .envs import SingleThreadEnv

    with serve(counter_app(SingleThreadEnv, max_concurrent_envs=1, step_timeout_s=0.3)) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset"})
            assert (await ask(ws, {"type": "step", "data": {"sleep_s": 0.6}}))["data"]["code"] == "TIMEOUT"
            TRACKER.threads = set()
            # no replacement thread: while the stuck step runs, the next call waits for its thread
            # (within the step timeout: it may time out waiting, "not started", get its turn, or,
            # on a loaded machine, run out of time rebuilding the environment on that one thread)
            waited = await ask(ws, {"type": "step", "data": {}})
            assert waited["type"] == "observation" or waited["data"]["code"] == "TIMEOUT", waited
            await until(lambda: manager_of(server).pool.stuck == 0)  # the stuck step has returned
            for _ in range(30):
                await ask(ws, {"type": "step", "data": {}})
                await asyncio.sleep(0.005)
            assert len(TRACKER.threads) == 1, TRACKER.threads


@pytest.mark.parametrize("action_cls", [CallToolAction, None], ids=["mcp-actions", "typed-actions"])
async def test_an_action_whose_type_is_not_a_string_is_a_validation_error(action_cls):
    if action_cls is None:
        app = fault_app()
    else:
        app = create_app(ModeToolsEnv, CallToolAction, CallToolObservation, env_name="modes")
    with serve(app) as server:
        async with connect(ws_url(server)) as ws:
            reply = await ask(ws, {"type": "step", "data": {"type": [1]}})
            assert reply["data"]["code"] == "VALIDATION_ERROR", reply
        response = httpx.post(server.base_url + "/step", json={"action": {"type": [1]}}, timeout=10)
        assert response.status_code == 422


async def test_a_factory_past_the_step_timeout_is_answered_timeout_when_a_socket_connects():
    class SlowFactory(CounterEnv):
        def __init__(self) -> None:
            time.sleep(0.6)
            super().__init__()

    with serve(counter_app(SlowFactory, max_concurrent_envs=2, step_timeout_s=0.2)) as server:
        async with connect(ws_url(server)) as ws:
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert reply["data"]["code"] == "TIMEOUT", reply
            assert reply["data"]["timeout_s"] == 0.2
        await until(lambda: manager_of(server).active_sessions == 0)


async def test_an_app_served_again_after_a_shutdown_takes_sessions_again():
    """A second server (or a second TestClient block) on the same app object works like the first."""
    app = counter_app()
    for round_ in range(2):
        with serve(app) as server:
            async with connect(ws_url(server)) as ws:
                reply = await ask(ws, {"type": "reset"})
                assert reply["type"] == "observation", (round_, reply)
                assert (await ask(ws, {"type": "step", "data": {}}))["data"]["observation"]["value"] == 1
            response = httpx.post(server.base_url + "/step", json={"action": {}}, timeout=10)
            assert response.status_code == 200, (round_, response.text)


async def test_a_session_destroyed_while_its_environment_is_built_closes_that_environment():
    class SlowFactory(CounterEnv):
        def __init__(self) -> None:
            time.sleep(0.3)
            super().__init__()

    manager = SessionManager(SlowFactory, max_sessions=2)
    creating = asyncio.ensure_future(manager.create(SessionKind.DETACHED))
    await until(lambda: manager.active_sessions == 1)
    (session,) = manager.sessions().values()
    await manager.destroy(session)
    with pytest.raises(sessions_module.SessionCreationError, match="closed while it was being created"):
        await creating
    await until(lambda: TRACKER.created == 1 and TRACKER.closed == 1)
    assert manager.active_sessions == 0 and session.env is None
    await manager.shutdown()


async def test_an_environment_whose_step_still_runs_at_shutdown_is_closed_once_it_returns():
    server = BackgroundServer(counter_app()).start()
    try:
        ws = await connect(ws_url(server))
        await ask(ws, {"type": "reset"})
        await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 1.0}}))
        await until(lambda: TRACKER.threads)  # the step runs in the environment
        assert TRACKER.alive == 1
    finally:
        await asyncio.get_running_loop().run_in_executor(None, server.stop)
    ws.transport.abort()
    assert TRACKER.alive == 0  # closed before the server finished stopping
    assert TRACKER.created == 1


async def test_a_single_thread_environment_is_never_called_from_a_second_thread():
    """A stateless call that hangs past the timeout must not push another session's instance onto
    a replacement thread: that session's calls are refused until the hung call returns."""
    from .envs import SingleThreadEnv

    with serve(counter_app(SingleThreadEnv, max_concurrent_envs=1, step_timeout_s=0.3)) as server:
        async with connect(ws_url(server)) as ws, httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            await ask(ws, {"type": "reset"})
            await ask(ws, {"type": "step", "data": {}})
            (built_on,) = TRACKER.threads
            hung = await http.post("/step", json={"action": {"sleep_s": 0.8}})
            assert hung.status_code == 504
            refused = await ask(ws, {"type": "step", "data": {}})
            assert refused["data"]["code"] == "TIMEOUT" and "not started" in refused["data"]["message"]
            await until(lambda: manager_of(server).pool.stuck == 0)  # the hung call returned
            reply = await ask(ws, {"type": "step", "data": {}})
            assert reply["data"]["observation"]["value"] == 2  # the same instance, one step more
            assert TRACKER.threads == {built_on}
            pool = server.server.config.app.state.openenv_server.manager.pool
            assert pool.threads == 1 and pool.stuck == 0


async def test_hanging_calls_cost_a_bounded_number_of_threads_and_instances():
    """Each call past the step timeout leaves a thread inside the environment; replacements for
    them are capped, beyond which calls are refused at once, and all recovers when they return."""
    with serve(counter_app(max_concurrent_envs=1, worker_threads=2, step_timeout_s=0.2)) as server:
        manager = server.server.config.app.state.openenv_server.manager
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            replies = [await http.post("/step", json={"action": {"sleep_s": 2.0}}) for _ in range(8)]
            assert {r.status_code for r in replies} == {504}
            assert manager.pool.threads <= 4 and manager.pool.stuck <= 4
            assert TRACKER.alive <= 4
            assert any("not started" in r.json()["detail"] for r in replies)
            await until(lambda: manager.pool.stuck == 0, timeout=5)
            ok = await http.post("/step", json={"action": {"delta": 2}})
            assert ok.status_code == 200 and ok.json()["observation"]["value"] == 2
        await until(lambda: TRACKER.alive == 0, timeout=5)
        assert manager.pool.threads <= 2


class _PlainEnv:
    """A minimal environment for SessionManager tests: ``step(seconds)`` sleeps."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    closed: list = []
    started = 0  # steps begun, of every instance and subclass (tests compare it with an earlier value)

    def reset(self, **kwargs: Any) -> None:
        return None

    def step(self, seconds: float) -> None:
        _PlainEnv.started += 1
        time.sleep(seconds)

    @property
    def state(self) -> dict:
        return {}

    def close(self) -> None:
        type(self).closed.append(id(self))


class _SingleThreadPlainEnv(_PlainEnv):
    REQUIRES_SINGLE_THREAD_EXECUTOR = True
    closed: list = []


async def test_a_close_waiting_behind_stuck_workers_is_not_skipped(monkeypatch):
    monkeypatch.setattr(sessions_module, "CLOSE_TIMEOUT_S", 0.3)
    _SingleThreadPlainEnv.closed = []
    manager = SessionManager(_SingleThreadPlainEnv, max_sessions=2, step_timeout_s=0.2)
    a = await manager.create()
    b = await manager.create()
    with pytest.raises(sessions_module.StepTimeoutError):
        await manager.step(a, 1.2)  # its one thread is stuck for a second
    assert manager.pool.exhausted
    await manager.destroy(b)  # b's close waits for that thread, past CLOSE_TIMEOUT_S
    await until(lambda: len(_SingleThreadPlainEnv.closed) == 2, timeout=5)  # a's (discarded) and b's
    await manager.shutdown()


async def test_a_call_that_waited_for_a_worker_past_the_timeout_leaves_the_environment_alone():
    manager = SessionManager(_SingleThreadPlainEnv, max_sessions=2, step_timeout_s=0.2)
    a = await manager.create()
    b = await manager.create()
    env_b = b.env
    with pytest.raises(sessions_module.StepTimeoutError):
        await manager.step(a, 0.8)
    with pytest.raises(sessions_module.WorkersStuckError, match="not started"):
        await manager.step(b, 0.0)  # queued behind the stuck thread, never started
    assert b.env is env_b  # not discarded: nothing ran on it
    await until(lambda: manager.pool.stuck == 0, timeout=5)
    await manager.step(b, 0.0)
    assert b.env is env_b
    await manager.shutdown()


def test_a_manager_served_again_does_not_wait_at_shutdown_for_the_previous_loops_calls(monkeypatch):
    monkeypatch.setattr(sessions_module, "CLOSE_TIMEOUT_S", 2.0)
    manager = SessionManager(_PlainEnv, max_sessions=2)

    async def first() -> None:
        session = await manager.create()
        before = _PlainEnv.started
        step = asyncio.ensure_future(manager.step(session, 1.0))
        await until(lambda: _PlainEnv.started > before)
        step.cancel()  # the caller leaves mid-step
        await asyncio.gather(step, return_exceptions=True)
        await manager.destroy(session)
        assert manager._awaiting_return  # closed once that call returns
        manager._closed = True  # as if shut down without waiting (the loop is going away)

    async def second() -> float:
        manager.reopen()
        began = time.monotonic()
        await manager.shutdown()
        return time.monotonic() - began

    asyncio.run(first())
    assert asyncio.run(second()) < 1.0


async def test_an_async_call_interrupted_halfway_discards_the_sessions_environment():
    """A detached session's async step cancelled halfway (its socket dropped) may have left the
    instance inconsistent: it is discarded like a timed-out one, not reused."""
    from .envs import AsyncCounterEnv

    class TwoPhaseEnv(AsyncCounterEnv):
        async def step_async(self, action: CounterAction, timeout_s: Optional[float] = None) -> CounterObservation:  # type: ignore[override]
            self._state.value += 100
            await asyncio.sleep(action.sleep_s)
            self._state.value -= 100
            return self.step(action.model_copy(update={"sleep_s": 0.0}))

    manager = SessionManager(TwoPhaseEnv, max_sessions=1)
    session = await manager.create(SessionKind.DETACHED)
    await manager.reset(session, {})
    first_env = session.env
    step = asyncio.ensure_future(manager.step(session, CounterAction(sleep_s=1.0)))
    await until(lambda: first_env.state.value == 100)  # halfway: inside its await
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    assert session.env is None
    await until(lambda: first_env._closed)
    observation = await manager.step(session, CounterAction(delta=2))
    assert observation.value == 2  # a fresh instance, not 102
    await manager.shutdown()


async def test_a_close_that_starts_late_in_its_window_gets_a_full_one(monkeypatch, caplog):
    monkeypatch.setattr(sessions_module, "CLOSE_TIMEOUT_S", 0.3)

    class SlowClose(_SingleThreadPlainEnv):
        def close(self) -> None:
            time.sleep(0.2)
            super().close()

    SlowClose.closed = []
    manager = SessionManager(SlowClose, max_sessions=2)
    a = await manager.create()
    b = await manager.create()
    before = _PlainEnv.started
    busy = asyncio.ensure_future(manager.step(a, 0.25))  # the one thread is busy (not stuck)
    await until(lambda: _PlainEnv.started > before)
    await manager.destroy(b)  # its close starts at ~0.25 s and takes 0.2 s: past the first window
    await busy
    await until(lambda: len(SlowClose.closed) == 1, timeout=3)
    assert manager.pool.stuck == 0
    assert "did not return" not in caplog.text
    await manager.shutdown()
