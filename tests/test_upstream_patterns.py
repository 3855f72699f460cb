"""Code written for upstream OpenEnv 0.10 that reaches past its public API, and runs here
unchanged: a package whose ``HTTPEnvServer`` subclass reads the attributes upstream's
``__init__`` sets, an ``MCPEnvironment`` that overrides both ``step`` and ``step_async``, clients
that call ``EnvClient._send_and_receive`` or read ``_ws``, ``_ws_url`` and ``_base_url``, and
``create_app`` given an instance (refused with upstream's words). Real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx
import pytest
from fastmcp import FastMCP
from websockets.protocol import State as SocketState

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from .conftest import counter_app, serve, until
from .envs import CounterAction, CounterClient, CounterEnv, CounterObservation, ToolsOnlyEnv

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def stateful_package() -> Iterator[Any]:
    """``tests/fixtures/stateful_http_env``, imported as its package (its modules use relative imports)."""
    sys.path.insert(0, str(FIXTURES))
    try:
        yield importlib.import_module("stateful_http_env.server.app")
    finally:
        sys.path.remove(str(FIXTURES))
        for name in [m for m in sys.modules if m.split(".")[0] == "stateful_http_env"]:
            del sys.modules[name]


# --- an HTTPEnvServer subclass that reads upstream's private attributes --------------------------


def test_a_server_subclass_built_on_upstreams_attributes_serves_its_own_routes(stateful_package: Any) -> None:
    """The package builds its one environment from ``self._env_factory``, runs calls in
    ``self._executor`` and reports ``self._max_concurrent_envs``: its routes answer, and its
    HTTP episode keeps its state between calls."""
    with serve(stateful_package.app) as server, httpx.Client(base_url=server.base_url, timeout=10) as http:
        assert http.post("/reset", json={"start": 10}).json()["observation"]["total"] == 10
        assert http.post("/step", json={"action": {"add": 5}}).json()["observation"]["total"] == 15
        assert http.post("/step", json={"action": {"add": 1}}).json()["reward"] == 1.0
        assert http.get("/state").json() == {"episode_id": None, "step_count": 2}
        assert http.get("/health").json() == {"status": "healthy", "max_sessions": 1}


def test_upstreams_private_server_attributes_say_what_they_say_there() -> None:
    app = counter_app(max_concurrent_envs=3)
    server = app.state.openenv_server
    assert server._env_factory is CounterEnv
    assert server._max_concurrent_envs == 3 == server._concurrency_config.max_concurrent_envs
    assert server._session_idle_timeout_s is None
    assert server._requires_single_thread_executor is False
    assert isinstance(server._executor, concurrent.futures.ThreadPoolExecutor)
    assert server._executor is server._executor  # one pool, made on first use
    assert isinstance(server._session_lock, asyncio.Lock)
    with serve(app) as running:
        assert server._sessions == {}
        with GenericEnvClient(base_url=running.base_url).sync() as env:
            env.reset()
            ((session_id, instance),) = server._sessions.items()
            assert isinstance(instance, CounterEnv)
            assert server._session_websocket_attachments == {session_id}
            assert server._session_info[session_id].environment_type == "CounterEnv"
            assert server._session_pending_closes == set()
        deadline = time.monotonic() + 5
        while server._sessions and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server._sessions == {}


# --- create_app given an instance -----------------------------------------------------------------


def test_an_environment_instance_instead_of_a_factory_is_refused_with_upstreams_message() -> None:
    with pytest.raises(TypeError) as refused:
        create_app(CounterEnv(), CounterAction, CounterObservation, env_name="counter")
    text = str(refused.value)
    assert text.startswith(
        f"env must be a callable (class or factory function), got {CounterEnv!r}. Pass the environment "
        "class (e.g., CounterEnv) not an instance (e.g., CounterEnv())"
    ), text


# --- an MCPEnvironment that overrides both step and step_async ------------------------------------


class CountingToolEnv(ToolsOnlyEnv):
    """Counts its own steps in ``step`` and in ``step_async``, as upstream MCP packages do."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        tools = FastMCP("counting")

        @tools.tool
        def echo(text: str) -> str:
            return text

        super().__init__(tools)
        self._state = State(episode_id="counting", step_count=0)

    def step(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return super().step(action, timeout_s=timeout_s, **kwargs)

    async def step_async(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    @property
    def state(self) -> State:
        return self._state


def test_overriding_step_and_step_async_counts_each_step_once() -> None:
    env = CountingToolEnv()
    observation = env.step(CallToolAction(tool_name="echo", arguments={"text": "hi"}))
    assert observation.result.data == "hi"
    assert env.state.step_count == 1  # sync step: our step_async (overridden) is not called under it
    asyncio.run(env.step_async(CallToolAction(tool_name="echo", arguments={"text": "again"})))
    assert env.state.step_count == 2


async def test_a_served_environment_overriding_both_counts_each_step_once() -> None:
    app = create_app(CountingToolEnv, CallToolAction, CallToolObservation, env_name="counting", max_concurrent_envs=2)
    with serve(app) as server:
        client = MCPToolClient(base_url=server.base_url)
        client.use_production_mode = False  # tool calls as steps
        async with client:
            await client.reset()
            assert await client.call_tool("echo", text="one") == "one"
            step = await client.step(CallToolAction(tool_name="echo", arguments={"text": "two"}))
            assert step.observation.result == "two"
            assert (await client.state()).step_count == 2


# --- clients that use upstream's private client names ---------------------------------------------


class PeekingClient(CounterClient):
    """A typed client with a call of its own, as clients of upstream packages write them."""

    async def peek(self) -> dict:
        return (await self._send_and_receive({"type": "state"}))["data"]


async def test_send_and_receive_sends_a_frame_and_returns_the_reply(counter_server: Any) -> None:
    async with PeekingClient(base_url=counter_server.base_url) as env:
        await env.reset(seed=1)
        await env.step(CounterAction(delta=2))
        assert (await env.peek())["value"] == 3
        reply = await env._send_and_receive({"type": "step", "data": {"delta": 4}})
        assert reply["type"] == "observation" and reply["data"]["observation"]["value"] == 7
        with pytest.raises(RuntimeError, match=r"^Server error: Unknown message type: bogus \(code: UNKNOWN_TYPE\)$"):
            await env._send_and_receive({"type": "bogus"})
        assert (await env.state()).step_count == 2  # the frames went to the episode's session


def test_send_and_receive_runs_through_the_sync_view(counter_server: Any) -> None:
    with PeekingClient(base_url=counter_server.base_url).sync() as env:
        env.reset(start=6)
        assert env.peek()["value"] == 6
        assert env._send_and_receive({"type": "state"})["data"]["value"] == 6


async def test_ws_ws_url_and_base_url_read_as_upstreams(counter_server: Any) -> None:
    base = counter_server.base_url
    env = GenericEnvClient(base_url=base + "/")
    assert env._base_url == base  # normalized, without the trailing slash (verifiers reads it)
    assert env._ws_url == base.replace("http://", "ws://") + "/ws"
    assert env._ws is None  # not connected yet
    async with env:
        assert env._ws is not None and env._ws.state is SocketState.OPEN
    assert GenericEnvClient(provider=object())._base_url is None  # (until the provider starts a server)
    assert GenericEnvClient(provider=object())._ws_url is None


async def test_an_mcp_clients_ws_url_is_the_plain_one_while_it_is_attached_to_its_session() -> None:
    app = create_app(CountingToolEnv, CallToolAction, CallToolObservation, env_name="counting", max_concurrent_envs=2)
    with serve(app) as server:
        async with MCPToolClient(base_url=server.base_url) as client:
            assert client.session_id is not None  # the WebSocket is attached to it (?session_id=...)
            assert client._ws_url == server.base_url.replace("http://", "ws://") + "/ws"
            assert client._base_url == server.base_url
        await until(lambda: app.state.openenv_server.manager.active_sessions == 0)


def test_the_old_import_name_openenv_core_still_works_and_warns() -> None:
    """OpenEnv 0.10 keeps ``openenv_core`` as a deprecated name of ``openenv.core``; code still
    importing it gets the same objects (in a fresh interpreter: the warning is at import)."""
    script = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import openenv_core\n"
        "    from openenv_core.env_server import create_app\n"
        "    from openenv_core.env_client import EnvClient\n"
        "import openenv.core.env_client, openenv.core.env_server\n"
        "assert EnvClient is openenv.core.env_client.EnvClient and create_app is openenv.core.env_server.create_app\n"
        "assert openenv_core.GenericEnvClient is openenv.core.GenericEnvClient\n"
        "print([w.category.__name__ for w in seen if 'openenv_core' in str(w.message)])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['DeprecationWarning']"
