"""The client's explicit state (``ClientState``, ``Usage``) through connect, use, failure and
close, against live servers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from openenv.core.client_errors import SessionLostError
from openenv.core.env_client import ClientState, Usage
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from .conftest import counter_app, serve, until
from .envs import CounterAction, CounterClient
from .test_client_faults import BackgroundProvider, manager_of
from .test_mcp import tool_app


async def test_async_client_moves_new_open_closed_and_reopens_when_used_again(counter_server):
    env = CounterClient(base_url=counter_server.base_url)
    assert (env._state, env._usage) == (ClientState.NEW, Usage.UNDECIDED)
    async with env:
        assert (env._state, env._usage) == (ClientState.OPEN, Usage.ASYNC)
        await env.reset(start=1)
        assert (await env.step(CounterAction())).observation.value == 2
        assert env._state is ClientState.OPEN
    assert env._state is ClientState.CLOSED and env._ws is None
    await env.close()  # closing twice is fine
    assert env._state is ClientState.CLOSED
    # a closed client opens a new connection (a new session) when used again
    assert (await env.reset(start=7)).observation.value == 7
    assert env._state is ClientState.OPEN
    await env.close()
    assert env._state is ClientState.CLOSED
    await until(lambda: manager_of(counter_server).active_sessions == 0)


def test_sync_client_moves_through_the_same_states_and_reopens_on_a_new_loop(counter_server):
    env = CounterClient(base_url=counter_server.base_url)
    with env.sync() as blocking:
        assert (env._state, env._usage) == (ClientState.OPEN, Usage.SYNC)
        blocking.reset(start=3)
        assert blocking.step(CounterAction()).observation.value == 4
        runner = env._loop_thread
    assert env._state is ClientState.CLOSED
    assert runner is not None and runner.stopped and env._loop_thread is None
    blocking.close()  # twice is fine
    assert blocking.reset(start=5).observation.value == 5  # a new connection on a new loop thread
    assert env._state is ClientState.OPEN and env._loop_thread is not runner
    blocking.close()
    assert env._state is ClientState.CLOSED


async def test_disconnect_closes_only_the_socket_and_a_second_one_does_nothing(counter_server):
    env = CounterClient(base_url=counter_server.base_url)
    await env.reset(start=2)
    assert env._state is ClientState.OPEN
    await env.disconnect()
    assert env._state is ClientState.CLOSED and env._ws is None
    await env.disconnect()
    assert env._state is ClientState.CLOSED
    await env.connect()
    assert env._state is ClientState.OPEN
    await env.close()


async def test_a_lost_connection_is_lost_until_reset_and_close_ends_it():
    with serve(counter_app()) as server:
        env = CounterClient(base_url=server.base_url, message_timeout_s=0.2)
        await env.reset()
        with pytest.raises(TimeoutError):
            await env.step(CounterAction(sleep_s=1.0))
        assert env._state is ClientState.LOST and env._ws is None
        with pytest.raises(SessionLostError, match="lost earlier"):
            await env.state()
        assert env._state is ClientState.LOST
        await env.disconnect()  # no socket to close: still lost
        assert env._state is ClientState.LOST
        assert (await env.reset(start=4)).observation.value == 4
        assert env._state is ClientState.OPEN
        with pytest.raises(TimeoutError):
            await env.step(CounterAction(sleep_s=1.0))
        await env.close()
        assert env._state is ClientState.CLOSED


async def test_an_invalid_state_change_raises_naming_both_states(counter_server):
    env = CounterClient(base_url=counter_server.base_url)
    with pytest.raises(RuntimeError, match=r"CounterClient: invalid state change new -> lost"):
        env._transition(ClientState.LOST)
    await env.connect()
    await env.close()
    with pytest.raises(RuntimeError, match=r"invalid state change closed -> closed"):
        env._transition(ClientState.CLOSED)
    assert env._state is ClientState.CLOSED


class SlowStopProvider(BackgroundProvider):
    """Serves the counter app; its stop takes a while (the server keeps answering meanwhile)."""

    def stop(self) -> None:
        time.sleep(0.5)
        super().stop()


async def test_a_call_made_while_close_runs_is_refused():
    """It used to connect to the server that close() was about to stop, and then leave the client
    with an open socket to a stopped server (or restart the server on the next call)."""
    provider = SlowStopProvider()
    env = GenericEnvClient(provider=provider)
    await env.reset()
    closing = asyncio.ensure_future(env.close())
    await until(lambda: env._state is ClientState.CLOSING)
    await asyncio.sleep(0.1)  # close() is now stopping the server
    with pytest.raises(RuntimeError, match="GenericEnvClient is closing"):
        await env.reset()
    await closing
    assert env._state is ClientState.CLOSED and env._ws is None
    assert (provider.started, provider.stopped) == (1, 1)
    await env.reset()  # used again after close(): the provider starts a server again
    assert env._state is ClientState.OPEN and provider.started == 2
    await env.close()
    assert provider.stopped == 2


async def _call(method: Any, *args: Any, **kwargs: Any) -> Any:
    return await method(*args, **kwargs)


def test_a_step_on_another_event_loop_is_refused_not_run_on_a_fresh_session(counter_server):
    """It used to drop the socket opened on the first loop and step a new, never-reset
    environment; and close() on the second loop raised 'Event loop is closed'."""
    env = CounterClient(base_url=counter_server.base_url)
    assert asyncio.run(_call(env.reset, start=5)).observation.value == 5
    with pytest.raises(SessionLostError, match="another event loop"):
        asyncio.run(_call(env.step, CounterAction()))
    assert env._state is ClientState.LOST
    assert asyncio.run(_call(env.reset, start=1)).observation.value == 1  # reset starts over
    assert env._state is ClientState.OPEN
    asyncio.run(_call(env.close))  # closing from another loop is fine too
    assert env._state is ClientState.CLOSED and env._ws is None


def test_new_session_from_a_client_used_synchronously_without_sync(counter_server):
    """It used to return a child claimed for async use, whose calls from sync code raised."""
    with CounterClient(base_url=counter_server.base_url) as env:
        env.reset(start=1)
        child = env.new_session()
        assert (child._state, child._usage) == (ClientState.OPEN, Usage.SYNC)
        assert child.reset(start=7).observation.value == 7
        assert child.step(CounterAction()).observation.value == 8
        assert env.step(CounterAction()).observation.value == 2
        assert manager_of(counter_server).active_sessions == 2
    assert child._state is ClientState.CLOSED  # closed with its parent
    asyncio.run(until(lambda: manager_of(counter_server).active_sessions == 0))


async def test_usage_is_claimed_once(counter_server):
    env = CounterClient(base_url=counter_server.base_url)
    blocking = env.sync()
    assert env._usage is Usage.SYNC
    with pytest.raises(RuntimeError, match="already being used in sync mode"):
        async with env:
            pass
    assert env._state is ClientState.NEW  # the refused `async with` opened nothing
    blocking.close()


async def test_mcp_client_states_and_its_server_session():
    with serve(tool_app(max_concurrent_envs=1)) as server:
        env = MCPToolClient(base_url=server.base_url)
        async with env:
            assert env._state is ClientState.OPEN and env.session_id is not None
            await env.reset()
            assert await env.call_tool("add", a=1, b=2) == 3
        assert env._state is ClientState.CLOSED and env.session_id is None
        await env.close()
        assert env._state is ClientState.CLOSED
        async with env:  # reopened: its old server session was closed, so the one slot is free
            assert env._state is ClientState.OPEN
            assert await env.call_tool("add", a=2, b=2) == 4
        assert env._state is ClientState.CLOSED
