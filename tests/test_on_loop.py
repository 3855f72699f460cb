"""``RUNS_ON_EVENT_LOOP``: a sync environment that opts in is called on the server's event loop,
on live servers. Where each call runs, what it costs (a blocked step stalls every session), and
that its failures are answered like any other call's."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Optional

import pytest

from .conftest import connect, serve
from .envs import TRACKER, CounterAction, CounterEnv, CounterObservation

RELEASE = threading.Event()  # lets a step that blocks on purpose return
STARTED = threading.Event()  # set by a step that blocks, once it runs


class BlockingAction(CounterAction):
    block: bool = False
    exit: bool = False


class PoolEnv(CounterEnv):
    """Records the thread of every reset, step and state read; a step can block until RELEASE."""

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, start: int = 0) -> CounterObservation:
        with TRACKER.lock:
            TRACKER.threads.add("reset:" + threading.current_thread().name)
        return super().reset(seed=seed, episode_id=episode_id, start=start)

    def step(self, action: BlockingAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        if action.block:
            STARTED.set()
            RELEASE.wait(10)
        if action.exit:
            raise SystemExit(3)
        return super().step(action)

    @property
    def state(self) -> Any:
        with TRACKER.lock:
            TRACKER.threads.add("state:" + threading.current_thread().name)
        return super().state


class LoopEnv(PoolEnv):
    RUNS_ON_EVENT_LOOP = True


def app_of(env: type) -> Any:
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.types import State

    return create_app(
        env, BlockingAction, CounterObservation, env_name="counter", state_cls=State, max_concurrent_envs=4
    )


def ws_url(server: Any) -> str:
    return server.base_url.replace("http://", "ws://") + "/ws"


async def ask(ws: Any, message: Any, timeout: float = 10) -> dict:
    await ws.send(json.dumps(message))
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


@pytest.mark.parametrize("env", [PoolEnv, LoopEnv], ids=["pool", "loop"])
async def test_calls_run_on_the_loop_only_when_the_environment_opts_in(env: type) -> None:
    with serve(app_of(env)) as server:
        async with connect(ws_url(server)) as ws:
            assert (await ask(ws, {"type": "reset", "data": {}}))["type"] == "observation"
            assert (await ask(ws, {"type": "step", "data": {"delta": 2}}))["data"]["observation"]["value"] == 2
            assert (await ask(ws, {"type": "state"}))["type"] == "state"
    names = set(TRACKER.threads)
    in_pool = {name for name in names if "openenv-env" in name}
    assert len(names) == 3, names  # reset, step and state, each seen on one thread
    if env is LoopEnv:
        assert not in_pool, f"an opted-in environment was called in the worker pool: {names}"
        assert len({name.split(":")[-1] for name in names}) == 1  # all on one thread, the loop's
    else:
        assert in_pool == names, f"a sync environment was called outside the worker pool: {names}"


@pytest.mark.parametrize("env", [PoolEnv, LoopEnv], ids=["pool", "loop"])
async def test_a_blocked_step_stalls_other_sessions_only_on_the_loop(env: type) -> None:
    """The documented cost of the opt-in: while one session's step blocks, no other session is
    answered (in the pool, the other session goes on)."""
    RELEASE.clear()
    STARTED.clear()
    with serve(app_of(env)) as server:
        async with connect(ws_url(server)) as blocked, connect(ws_url(server)) as other:
            await ask(blocked, {"type": "reset", "data": {}})
            await ask(other, {"type": "reset", "data": {}})
            await blocked.send(json.dumps({"type": "step", "data": {"block": True}}))
            assert await asyncio.get_running_loop().run_in_executor(None, STARTED.wait, 10)
            await other.send(json.dumps({"type": "step", "data": {}}))
            try:
                reply = json.loads(await asyncio.wait_for(other.recv(), 1.0))
            except asyncio.TimeoutError:
                reply = None
            RELEASE.set()
            assert (json.loads(await asyncio.wait_for(blocked.recv(), 10)))["data"]["observation"]["value"] == 1
            if env is LoopEnv:
                assert reply is None, "the other session was answered while the loop was blocked"
                reply = json.loads(await asyncio.wait_for(other.recv(), 10))
            assert reply is not None and reply["data"]["observation"]["value"] == 1


async def test_failures_of_calls_on_the_loop_are_answered_and_the_server_goes_on() -> None:
    with serve(app_of(LoopEnv)) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset", "data": {}})
            failed = await ask(ws, {"type": "step", "data": {"fail": True}})
            assert failed["type"] == "error" and failed["data"]["code"] == "EXECUTION_ERROR"
            exited = await ask(ws, {"type": "step", "data": {"exit": True}})  # SystemExit: not the loop's end
            assert exited["type"] == "error" and exited["data"]["code"] == "EXECUTION_ERROR"
            assert (await ask(ws, {"type": "step", "data": {}}))["data"]["observation"]["value"] == 1
        async with connect(ws_url(server)) as ws:  # the server still serves new connections
            assert (await ask(ws, {"type": "reset", "data": {}}))["type"] == "observation"
