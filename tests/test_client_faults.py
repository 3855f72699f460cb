"""Client faults, against live servers: calls racing to open the connection, a connection lost
between calls, a client closed while another thread's call runs, closing against a server that
ignores the close, replies that are not JSON, and exceptions that cross a process boundary."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import pickle
import socket
import threading
import time
from typing import Any

import pytest
from echo_env import EchoEnv
from echo_env.server.echo_environment import EchoEnvironment
from websockets.asyncio.server import serve as ws_serve

from openenv.core.client_errors import (
    CapacityReachedError,
    EnvClientError,
    SessionLostError,
    StepTimeoutError,
    ToolCallError,
)
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.generic_client import GenericEnvClient
from openenv.testing.faults import FaultProxy

from .conftest import counter_app, serve, until


def manager_of(server: Any) -> Any:
    return server.server.config.app.state.openenv_server.manager


async def test_calls_racing_to_connect_share_one_connection():
    with serve(counter_app(max_concurrent_envs=8)) as server:
        manager = manager_of(server)
        client = GenericEnvClient(base_url=server.base_url)
        await asyncio.gather(client.reset(), client.state(), client.state(), client.state())
        assert manager.active_sessions == 1
        await client.close()
        await until(lambda: manager.active_sessions == 0)


def test_sync_calls_from_threads_racing_to_connect_share_one_connection():
    with serve(counter_app(max_concurrent_envs=16)) as server:
        manager = manager_of(server)
        loops_before = {t.ident for t in threading.enumerate() if t.name == "openenv-sync-client-loop"}
        client = GenericEnvClient(base_url=server.base_url).sync()
        gate = threading.Barrier(8)

        def first_call() -> None:
            gate.wait()
            client.state()

        threads = [threading.Thread(target=first_call) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert manager.active_sessions == 1
        loops = {t.ident for t in threading.enumerate() if t.name == "openenv-sync-client-loop"} - loops_before
        assert len(loops) == 1, loops
        client.close()
        asyncio.run(until(lambda: manager.active_sessions == 0))


async def test_a_connection_lost_between_calls_is_reported_not_replaced_by_a_fresh_session():
    """A server that restarts (here: closes the socket after each reply) between two steps: the
    second step must not silently run on a new, never-reset environment."""

    async def one_reply_then_close(ws: Any) -> None:
        await ws.recv()
        await ws.send('{"type":"observation","data":{"observation":{},"reward":null,"done":false}}')
        await ws.close()

    async with ws_serve(one_reply_then_close, "127.0.0.1", 0) as bare:
        port = bare.sockets[0].getsockname()[1]
        client = GenericEnvClient(base_url=f"http://127.0.0.1:{port}")
        await client.reset()
        await until(lambda: client._ws is not None and client._ws.state.name == "CLOSED")
        with pytest.raises(SessionLostError, match="closed since the last call"):
            await client.step({"x": 1})
        await client.reset()  # starts a new episode on a new connection
        await client.close()


async def test_a_reply_that_is_not_json_raises_a_client_error():
    async def garbage(ws: Any) -> None:
        async for _ in ws:
            await ws.send("<html>a proxy's error page</html>")

    async with ws_serve(garbage, "127.0.0.1", 0) as bare:
        port = bare.sockets[0].getsockname()[1]
        async with GenericEnvClient(base_url=f"http://127.0.0.1:{port}") as client:
            with pytest.raises(EnvClientError, match="not a JSON object"):
                await client.reset()


def test_closing_a_sync_client_ends_another_threads_call_with_an_error():
    """A call in flight on another thread (here: connecting to a server that never answers the
    opening handshake) ends with SessionLostError when the client is closed, instead of waiting
    forever on a loop that was stopped under it."""
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel does), never answers
    port = listener.getsockname()[1]
    outcome: dict = {}
    client = GenericEnvClient(base_url=f"http://127.0.0.1:{port}", connect_timeout_s=60).sync()

    def call() -> None:
        try:
            client.reset()
        except BaseException as exc:  # what the call ended with is the point
            outcome["error"] = exc

    caller = threading.Thread(target=call, daemon=True)
    accepted = None
    try:
        caller.start()
        listener.settimeout(10)
        accepted, _ = listener.accept()  # the call has connected: it now waits for the handshake
        began = time.monotonic()
        client.close()
        caller.join(10)
        assert not caller.is_alive(), "the other thread's call never returned"
        assert isinstance(outcome.get("error"), SessionLostError), outcome
        assert time.monotonic() - began < 8
    finally:
        if accepted is not None:
            accepted.close()
        listener.close()


def _handshake_only_server(drain: bool = True) -> tuple:
    """A TCP server that completes the WebSocket opening handshake, then never answers (it drains
    what comes until EOF, or with ``drain=False`` reads nothing at all). Returns (port, an event
    set when the client hung up)."""
    listener = socket.create_server(("127.0.0.1", 0))
    state: dict = {"eof": threading.Event()}

    def run() -> None:
        conn, _ = listener.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(4096)
        key = next(
            line.split(b":", 1)[1].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key")
        )
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        time.sleep(0.5)
        if not drain:
            state["eof"].wait(30)
        conn.setblocking(False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # drain whatever comes, without answering, until EOF
            try:
                data = conn.recv(4096)
            except BlockingIOError:
                time.sleep(0.05)
                continue
            except OSError:
                data = b""
            if not data:
                state["eof"].set()
                break
        conn.close()
        listener.close()

    threading.Thread(target=run, daemon=True).start()
    return listener.getsockname()[1], state["eof"]


def test_closing_against_a_server_that_ignores_the_close_drops_the_tcp_connection():
    port, hung_up = _handshake_only_server()
    client = GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync()
    client.connect()
    began = time.monotonic()
    client.close()
    assert time.monotonic() - began < 8
    assert hung_up.wait(5), "the client left the TCP connection open after close()"


def test_a_send_to_a_server_that_stopped_reading_times_out():
    port, _ = _handshake_only_server(drain=False)
    client = GenericEnvClient(base_url=f"http://127.0.0.1:{port}", message_timeout_s=1, max_message_size_mb=64).sync()
    client.connect()
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        client.step({"blob": "x" * (48 << 20)})  # far more than the socket buffers hold
    assert time.monotonic() - began < 10
    client.close()


def test_client_exceptions_survive_pickling():
    error = StepTimeoutError("step ran too long", "TIMEOUT", {"timeout_s": 2.0})
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is StepTimeoutError
    assert (again.message, again.code, again.details, str(again)) == (
        error.message,
        error.code,
        error.details,
        str(error),
    )
    tool = pickle.loads(pickle.dumps(ToolCallError("echo", "bad input", -32602, {"field": "x"})))
    assert (tool.tool_name, tool.message, tool.code, tool.data) == ("echo", "bad input", -32602, {"field": "x"})
    assert str(tool) == "Tool 'echo' failed: bad input"


async def test_an_mcp_client_that_loses_its_session_closes_it_on_the_server():
    """Production mode: a cancelled call loses the session; the client asks the server to close
    it, so that on a one-session server its next reset is not refused for capacity."""
    app = create_app(EchoEnvironment, CallToolAction, CallToolObservation, env_name="echo", max_concurrent_envs=1)
    with serve(app) as server:
        manager = manager_of(server)
        async with EchoEnv(base_url=server.base_url) as env:
            await env.reset()
            call = asyncio.ensure_future(env.call_tool("echo_message", message="x"))
            await asyncio.sleep(0)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await until(lambda: manager.active_sessions == 0)
            try:
                await env.reset()
            except CapacityReachedError:  # pragma: no cover - the failure this test guards against
                pytest.fail("the lost session still held the server's only slot")
            assert env.session_id is not None


def test_closing_a_never_used_client_starts_no_thread():
    before = {t.ident for t in threading.enumerate()}
    GenericEnvClient(base_url="http://127.0.0.1:9").close()
    assert {t.ident for t in threading.enumerate()} - before == set()


class BackgroundProvider:
    """A provider that really serves the counter app (start/stop as a provider's), optionally
    slow to start or handing out a URL its WebSocket route is not under."""

    def __init__(self, start_delay_s: float = 0.0, path: str = "") -> None:
        self.start_delay_s = start_delay_s
        self.path = path
        self.server: Any = None
        self.started = self.stopped = 0
        self.starting = threading.Event()  # set as start() begins

    def start(self) -> str:
        self.starting.set()
        time.sleep(self.start_delay_s)
        self.server = serve(counter_app())
        running = self.server.__enter__()
        self.started += 1
        return running.base_url + self.path

    def wait_for_ready(self) -> None:
        pass

    def stop(self) -> None:
        if self.server is not None:
            self.server.__exit__(None, None, None)
            self.server = None
            self.stopped += 1


async def test_a_connect_cancelled_while_its_provider_starts_stops_what_it_started():
    provider = BackgroundProvider(start_delay_s=0.5)
    client = GenericEnvClient(provider=provider)
    connecting = asyncio.ensure_future(client.connect())
    await until(provider.starting.is_set)
    connecting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await connecting
    await until(lambda: provider.started == 1 and provider.stopped == 1)
    await client.close()


@pytest.mark.parametrize("sync", [False, True], ids=["async-with", "sync-with"])
async def test_a_failed_connect_inside_with_stops_the_server_its_provider_started(sync):
    provider = BackgroundProvider(path="/not-the-server")
    client = GenericEnvClient(provider=provider)
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(ConnectionError):
        if sync:
            await asyncio.to_thread(lambda: client.sync().__enter__())
        else:
            async with client:
                pass
    assert (provider.started, provider.stopped) == (1, 1)
    await until(lambda: {t.ident for t in threading.enumerate() if t.name.startswith("openenv-sync")} - before == set())


@pytest.mark.parametrize("reconnect_timeout_s", [0, 0.05, 30])
async def test_a_slow_handshake_gets_the_whole_connect_timeout(reconnect_timeout_s):
    """A far-away server (every chunk held 0.2 s each way: the opening handshake takes 0.4 s)
    connects within ``connect_timeout_s`` whatever ``reconnect_timeout_s`` is. The reconnect
    budget bounded the first try too: a client that never reconnects (0) gave up after 0.1 s."""
    with serve(counter_app()) as server, FaultProxy(server.port) as proxy:
        proxy.latency_s = 0.2
        client = GenericEnvClient(
            base_url=proxy.base_url, connect_timeout_s=10, reconnect_timeout_s=reconnect_timeout_s
        )
        async with client:
            result = await client.reset()
            assert result.done is False
        assert proxy.accepted == 1


async def test_a_handshake_past_connect_timeout_fails_naming_the_url_and_the_timeout():
    with serve(counter_app()) as server, FaultProxy(server.port) as proxy:
        proxy.latency_s = 1.0
        url = proxy.base_url.replace("http://", "ws://") + "/ws"
        began = time.monotonic()
        with pytest.raises(ConnectionError) as caught:
            async with GenericEnvClient(base_url=proxy.base_url, connect_timeout_s=0.5, reconnect_timeout_s=0):
                pass
        assert time.monotonic() - began < 5
        assert str(caught.value).startswith(f"{url} did not complete the connection in time"), caught.value
