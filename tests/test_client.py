"""EnvClient, SyncEnvClient and GenericEnvClient against live servers."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import pytest
from websockets.asyncio.server import serve as ws_serve

from openenv.core.client_errors import (
    ActionValidationError,
    CapacityReachedError,
    EnvironmentExecutionError,
    ServerError,
    SessionLostError,
    StepTimeoutError,
)
from openenv.core.generic_client import GenericAction, GenericEnvClient

from .conftest import counter_app, serve, until
from .envs import TRACKER, CounterAction, CounterClient, CounterState


async def test_async_client_runs_an_episode(counter_server):
    async with CounterClient(base_url=counter_server.base_url) as env:
        result = await env.reset(seed=3)
        assert result.observation.value == 3
        assert result.metadata == {"seed": 3}
        result = await env.step(CounterAction(delta=2))
        assert (result.observation.value, result.reward, result.done) == (5, 2, False)
        result = await env.step(CounterAction(delta=9))
        assert result.done is True
        assert await env.state() == CounterState(episode_id="episode", step_count=2, value=14)


def test_sync_wrapper_from_a_plain_script(counter_server):
    with CounterClient(base_url=counter_server.base_url).sync() as env:
        assert env.reset(start=2).observation.value == 2
        assert env.step(CounterAction(delta=1)).observation.value == 3
        assert env.state().value == 3


def test_client_used_synchronously_without_sync(counter_server):
    with CounterClient(base_url=counter_server.base_url) as env:
        assert env.reset(start=4).observation.value == 4
        assert env.step(CounterAction()).observation.value == 5


async def test_sync_wrapper_inside_a_running_event_loop_does_not_deadlock(counter_server):
    # what a Jupyter cell does: sync calls while the notebook's loop is running in this thread
    env = CounterClient(base_url=counter_server.base_url).sync()
    try:
        assert env.reset(start=1).observation.value == 1
        assert env.step(CounterAction(delta=2)).observation.value == 3
    finally:
        env.close()


def test_sync_wrapper_shared_by_worker_threads(counter_server):
    env = CounterClient(base_url=counter_server.base_url).sync()
    env.reset()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: env.step(CounterAction(delta=1)), range(40)))
    assert env.state().value == 40
    env.close()


def test_one_sync_client_per_thread(counter_server):
    errors = []

    def run(start: int) -> None:
        try:
            with CounterClient(base_url=counter_server.base_url).sync() as env:
                env.reset(start=start)
                assert env.step(CounterAction(delta=1)).observation.value == start + 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


async def test_error_frames_raise_typed_exceptions_carrying_the_code(counter_server):
    async with CounterClient(base_url=counter_server.base_url) as env:
        await env.reset()
        with pytest.raises(EnvironmentExecutionError) as failure:
            await env.step(CounterAction(fail=True))
        assert failure.value.code == "EXECUTION_ERROR"
        assert isinstance(failure.value, RuntimeError)
        assert "the step failed on purpose" in str(failure.value)
        with pytest.raises(ActionValidationError) as invalid:
            await env._request({"type": "step", "data": {"delta": "many"}})
        assert invalid.value.errors[0]["loc"] == ["delta"]
        # the session is intact after errors
        assert (await env.step(CounterAction(delta=1))).observation.value == 1


async def test_capacity_refusal_raises_capacity_reached():
    with serve(counter_app(max_concurrent_envs=1)) as server:
        async with CounterClient(base_url=server.base_url) as first:
            await first.reset()
            second = CounterClient(base_url=server.base_url)
            with pytest.raises(CapacityReachedError) as refused:
                await second.reset()
            assert refused.value.details == {"active_sessions": 1, "max_sessions": 1}
            await second.close()


async def test_server_step_timeout_raises_step_timeout_error():
    with serve(counter_app(step_timeout_s=0.2)) as server:
        async with CounterClient(base_url=server.base_url) as env:
            await env.reset()
            with pytest.raises(StepTimeoutError) as timed_out:
                await env.step(CounterAction(sleep_s=1.0))
            assert isinstance(timed_out.value, TimeoutError) and isinstance(timed_out.value, ServerError)
            assert (await env.reset(start=2)).observation.value == 2


async def test_client_timeout_drops_the_session_and_says_so(counter_server):
    async with CounterClient(base_url=counter_server.base_url, message_timeout_s=0.2) as env:
        await env.reset(start=5)
        with pytest.raises(TimeoutError, match="message_timeout_s"):
            await env.step(CounterAction(sleep_s=1.0))
        with pytest.raises(SessionLostError, match="reset"):
            await env.step(CounterAction())
        result = await env.reset(start=1)  # a new connection, a new episode
        assert result.observation.value == 1
        assert (await env.step(CounterAction())).observation.value == 2


async def test_unix_socket_base_url():
    with serve(counter_app(), uds=True) as server:
        assert server.base_url.startswith("unix:///")
        async with CounterClient(base_url=server.base_url) as env:
            assert (await env.reset(start=3)).observation.value == 3
            assert (await env.step(CounterAction())).observation.value == 4


async def test_generic_client_speaks_dicts(counter_server):
    async with GenericEnvClient(base_url=counter_server.base_url) as env:
        result = await env.reset(start=1)
        assert result.observation == {"metadata": {}, "value": 1}
        result = await env.step(GenericAction(delta=4))
        assert result.observation["value"] == 5
        assert result.reward == 4
        assert (await env.state())["value"] == 5
    assert repr(GenericAction(delta=4)) == "GenericAction(delta=4)"


async def test_generic_client_connects_when_its_context_is_entered():
    """``async with`` (and ``with``) opens the session before any call, as upstream's does."""
    with serve(counter_app()) as server:
        manager = server.server.config.app.state.openenv_server.manager
        async with GenericEnvClient(base_url=server.base_url) as env:
            assert env._ws is not None
            await until(lambda: manager.active_sessions == 1)  # no call made: the socket's session
        await until(lambda: manager.active_sessions == 0)
        with GenericEnvClient(base_url=server.base_url) as blocking:
            assert blocking._ws is not None
            await until(lambda: manager.active_sessions == 1)
        await until(lambda: manager.active_sessions == 0)


_LEFT_OPEN = {
    "a sync client kept to the end": """
env = EchoEnv(base_url=URL).sync()
env.reset(); env.call_tool("echo_message", message="hi")
""",
    "a sync client dropped in a function": """
def episode():
    env = EchoEnv(base_url=URL).sync()
    env.reset(); env.call_tool("echo_message", message="hi")
episode(); gc.collect()
""",
    "an async client on a loop never closed": """
env = EchoEnv(base_url=URL)
async def episode():
    await env.reset(); await env.call_tool("echo_message", message="hi")
loop = asyncio.new_event_loop()
loop.run_until_complete(episode())
""",
    "an async client whose asyncio.run ended": """
async def episode():
    global env
    env = EchoEnv(base_url=URL)
    await env.reset(); await env.call_tool("echo_message", message="hi")
asyncio.run(episode())
""",
}


@pytest.mark.parametrize("case", sorted(_LEFT_OPEN))
def test_a_client_never_closed_leaves_nothing_on_stderr_at_exit(case):
    """Before: "Task was destroyed but it is pending! ... keepalive" at interpreter exit."""
    import subprocess
    import sys

    from echo_env.server.app import app

    with serve(app) as server:
        script = "import asyncio, gc\nfrom echo_env import EchoEnv\n"
        script += f"URL = {server.base_url!r}\n" + _LEFT_OPEN[case]
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stderr) == (0, ""), case


async def test_a_client_left_open_at_exit_ends_its_session_then():
    """Closed at exit, the session ends at once instead of waiting out the resume grace period."""
    import subprocess
    import sys

    with serve(counter_app()) as server:
        manager = server.server.config.app.state.openenv_server.manager
        assert manager.resume_grace_s == 60
        script = "from openenv.core.generic_client import GenericEnvClient\n"
        script += f"env = GenericEnvClient(base_url={server.base_url!r}).sync()\nenv.reset()\n"
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        await until(lambda: manager.active_sessions == 0)


async def test_new_session_is_independent_and_closed_with_its_parent():
    with serve(counter_app()) as server:
        app_server = server.server.config.app.state.openenv_server
        env = CounterClient(base_url=server.base_url)
        async with env:
            await env.reset(start=1)
            child = await env.new_session()
            await child.reset(start=7)
            assert (await env.step(CounterAction())).observation.value == 2
            assert (await child.step(CounterAction())).observation.value == 8
            assert app_server.active_sessions == 2
        await until(lambda: app_server.active_sessions == 0 and TRACKER.alive == 0)


def test_a_sync_client_opens_sync_child_sessions_on_its_own_loop():
    with serve(counter_app()) as server:
        app_server = server.server.config.app.state.openenv_server
        with CounterClient(base_url=server.base_url).sync() as env:
            env.reset(start=1)
            child = env.new_session()
            other = env.new_session()
            child.reset(start=7)
            other.reset(start=20)
            assert env.step(CounterAction()).observation.value == 2
            assert child.step(CounterAction()).observation.value == 8
            assert other.step(CounterAction()).observation.value == 21
            assert app_server.active_sessions == 3
            child.close()  # closing a child leaves its parent (and the shared loop) working
            assert env.step(CounterAction()).observation.value == 3
            assert other.step(CounterAction()).observation.value == 22
        deadline = time.monotonic() + 5
        while app_server.active_sessions and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app_server.active_sessions == 0  # the parent closed the child it still had


async def test_headers_are_sent_on_the_websocket_handshake():
    seen = {}

    async def handler(ws):
        seen.update(ws.request.headers)
        await ws.recv()
        await ws.send(
            json.dumps(
                {
                    "type": "observation",
                    "data": {"observation": {"value": 0, "metadata": {}}, "reward": None, "done": False},
                }
            )
        )

    async with ws_serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with CounterClient(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer t0ken"}) as env:
            await env.reset()
    assert seen["authorization"] == "Bearer t0ken"


async def test_connection_failure_names_the_url():
    env = CounterClient(base_url="http://127.0.0.1:9", connect_timeout_s=2)
    with pytest.raises(ConnectionError, match=r"ws://127\.0\.0\.1:9/ws"):
        await env.reset()


def test_base_url_forms():
    assert CounterClient(base_url="http://localhost:8000/").base_url == "http://localhost:8000"
    assert CounterClient(base_url="localhost:8000").base_url == "http://localhost:8000"
    assert CounterClient(base_url="unix:///tmp/x.sock").base_url == "unix:///tmp/x.sock"
    with pytest.raises(ValueError, match="base_url"):
        CounterClient()
    with pytest.raises(ValueError, match="scheme"):
        CounterClient(base_url="ftp://x")


def test_mode_is_validated_and_immutable(monkeypatch):
    with pytest.raises(ValueError):
        CounterClient(base_url="http://x", mode="staging")
    monkeypatch.setenv("OPENENV_CLIENT_MODE", "PRODUCTION")
    env = CounterClient(base_url="http://x")
    assert env.mode == "production"
    with pytest.raises(AttributeError):
        env.mode = "simulation"


async def test_mixing_async_then_sync_use_is_refused(counter_server):
    env = CounterClient(base_url=counter_server.base_url)
    async with env:
        await env.reset()
        with pytest.raises(RuntimeError, match="already being used in async mode"):
            env.sync()
