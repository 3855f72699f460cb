"""A server that stops on purpose tells its clients: they fail at once with
:class:`ServerStoppedError`, saying the server was stopped, instead of trying to resume a session
that ended with it for ``reconnect_timeout_s`` (30 s). Real servers on 127.0.0.1, real clients;
connection faults (which are resumed) are tests/test_resume.py's."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from openenv.core.client_errors import ServerStoppedError, SessionLostError
from openenv.core.env_server._compat import uvicorn as uvicorn_compat
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.generic_client import GenericEnvClient

from .conftest import counter_app, until

FAST = 3.0
"""Seconds within which a client must fail: far below reconnect_timeout_s (30 s), well above a
loaded machine's scheduling delays."""


def _check_stop_message(error: BaseException, url: str) -> None:
    text = str(error)
    assert isinstance(error, SessionLostError)  # (what code catching dropped sessions already catches)
    assert f"the server at {url} was stopped" in text and "call reset()" in text, text
    if uvicorn_compat.tested():  # our WebSocket protocol says why; uvicorn's own sends 1012 alone
        assert "code 1001: the server is stopping" in text, text


async def test_an_idle_client_fails_at_once_when_the_server_is_stopped() -> None:
    server = BackgroundServer(counter_app()).start()
    client = GenericEnvClient(base_url=server.base_url)
    try:
        await client.reset()
        await client.step({"delta": 1})
        server.stop()  # as Ctrl-C on `openenv serve` does: uvicorn shuts down
        started = time.monotonic()
        with pytest.raises(ServerStoppedError) as stopped:
            await client.step({"delta": 1})
        assert time.monotonic() - started < FAST
        _check_stop_message(stopped.value, server.base_url)
        with pytest.raises(ConnectionError, match="No server answers"):  # reset: a new session, none there
            await client.reset()
    finally:
        await client.close()
        server.stop()


async def test_a_call_under_way_fails_at_once_when_the_server_is_stopped() -> None:
    server = BackgroundServer(counter_app()).start()
    client = GenericEnvClient(base_url=server.base_url)
    stopper = threading.Thread(target=server.stop)  # (it returns once the step below has ended)
    try:
        await client.reset()
        step = asyncio.ensure_future(client.step({"delta": 1, "sleep_s": 2 * FAST}))
        manager = server.server.config.app.state.openenv_server.manager
        await until(lambda: any(s.lock.locked() for s in manager.sessions().values()))
        started = time.monotonic()
        stopper.start()
        with pytest.raises(ServerStoppedError) as stopped:
            await step
        assert time.monotonic() - started < FAST  # before the step has returned
        _check_stop_message(stopped.value, server.base_url)
    finally:
        if stopper.is_alive():
            await asyncio.to_thread(stopper.join)
        await client.close()
        server.stop()


async def test_an_mcp_client_fails_at_once_when_the_server_is_stopped() -> None:
    from echo_env import EchoEnv
    from echo_env.server.app import app

    server = BackgroundServer(app).start()
    client = EchoEnv(base_url=server.base_url)
    try:
        await client.reset()
        assert await client.call_tool("echo_message", message="hi") == "hi"
        server.stop()
        started = time.monotonic()
        with pytest.raises(ServerStoppedError) as stopped:
            await client.call_tool("echo_message", message="again")
        assert time.monotonic() - started < FAST
        _check_stop_message(stopped.value, server.base_url)
    finally:
        await client.close()
        server.stop()


async def test_the_apps_lifespan_ending_tells_its_connected_clients() -> None:
    """Servers other than uvicorn may end the app's lifespan with WebSockets still open: the app
    then closes them itself, saying the server stops, and their sessions end at once (not after
    the resume grace period, 60 s). Here the lifespan's closing step runs on a live uvicorn."""
    app = counter_app()
    server = BackgroundServer(app).start()
    client = GenericEnvClient(base_url=server.base_url)
    try:
        await client.reset()
        await client.step({"delta": 1})
        openenv_server = app.state.openenv_server
        stopping = asyncio.run_coroutine_threadsafe(openenv_server.ws_context.stopping(), server.loop)
        await asyncio.wrap_future(stopping)
        await until(lambda: openenv_server.manager.active_sessions == 0, timeout=FAST)
        started = time.monotonic()
        with pytest.raises(ServerStoppedError) as stopped:
            await client.step({"delta": 1})
        assert time.monotonic() - started < FAST
        assert "code 1001: the server is stopping" in str(stopped.value)
    finally:
        await client.close()
        server.stop()
