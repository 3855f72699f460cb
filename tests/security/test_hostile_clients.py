"""Server limits that hold under hostile clients (see ``openenv.core.env_server.limits``).

Each attack runs against a real server on 127.0.0.1 (or a Unix socket), scaled down (a cap of 8
rather than 256, a 2 MiB frame limit rather than 32): once with the limit, showing it holds, and
where it is cheap once with the limit off, showing the attack works there.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import time
from typing import Any, Optional

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from openenv.core.client_errors import ServerBusyError
from openenv.core.env_server.limits import ServerLimits
from openenv.core.generic_client import GenericEnvClient

from ..conftest import connect, counter_app, serve, until

MIB = 1024 * 1024
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ws_url(server: Any) -> str:
    return server.base_url.replace("http://", "ws://") + "/ws"


async def ask(ws: Any, message: Any) -> dict:
    await ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


def app_server(server: Any) -> Any:
    return server.server.config.app.state.openenv_server


def on_server_loop(server: Any, coro: Any, timeout: float = 5) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, server.loop).result(timeout)


async def open_raw(server: Any) -> Any:
    if server.base_url.startswith("unix://"):
        return await asyncio.open_unix_connection(server.base_url[len("unix://") :])
    return await asyncio.open_connection(server.host, server.port)


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bytes:
    """What the server sent before it closed the connection (TimeoutError: it did not)."""
    try:
        return await asyncio.wait_for(reader.read(), within)
    except ConnectionResetError:
        return b""


def masked_frame(opcode: int, payload: bytes, fin: bool = True, declared: Optional[int] = None) -> bytes:
    """A client frame (masked with a zero key, so the payload goes as it is) of ``payload``, its
    header declaring ``declared`` bytes when given."""
    length = len(payload) if declared is None else declared
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        header = struct.pack("!BB", first, 0x80 | length)
    elif length < 65536:
        header = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", first, 0x80 | 127, length)
    return header + b"\0\0\0\0" + payload


def test_limits_are_read_from_the_environment_and_bad_values_name_their_setting():
    limits = ServerLimits.from_env({"OPENENV_MAX_MESSAGE_MB": "2", "OPENENV_HEADER_TIMEOUT_S": "0"})
    assert limits.max_message_bytes == 2 * MIB
    assert limits.max_inflight_bytes == 8 * MIB  # 4 x the message limit unless set
    assert limits.header_timeout_s == 0
    assert limits.max_connections_per_client == 256 and limits.max_local_connections == 0
    assert limits.session_idle_timeout_s == 600
    for name, value in [("OPENENV_HEADER_TIMEOUT_S", "soon"), ("OPENENV_MAX_CONNECTIONS_PER_CLIENT", "2.5")]:
        with pytest.raises(ValueError, match=name):
            ServerLimits.from_env({name: value})
    with pytest.raises(ValueError, match="OPENENV_MAX_INFLIGHT_MB"):
        ServerLimits.from_env({"OPENENV_MAX_INFLIGHT_MB": "-1"})
    with pytest.raises(ValueError, match="max_message_mb"):
        ServerLimits(max_message_mb=0)


# --- 1. idle sockets holding every session slot -----------------------------------------------


async def test_idle_sockets_lose_their_sessions_and_are_told_why_on_their_next_call():
    limits = ServerLimits(session_idle_timeout_s=0.3)
    with serve(counter_app(max_concurrent_envs=4, limits=limits)) as server:
        idle = [await connect(ws_url(server)).__aenter__() for _ in range(4)]
        try:
            for ws in idle:
                await ask(ws, {"type": "reset"})
            async with connect(ws_url(server)) as late:
                assert json.loads(await asyncio.wait_for(late.recv(), 10))["data"]["code"] == "CAPACITY_REACHED"
            await until(lambda: app_server(server).active_sessions == 0)
            async with connect(ws_url(server)) as fresh:  # a slot is free again
                assert (await ask(fresh, {"type": "reset"}))["type"] == "observation"
            reply = await ask(idle[0], {"type": "step", "data": {"delta": 1}})
            assert reply["data"]["code"] == "SESSION_ERROR"
            assert "0.3 s without a call" in reply["data"]["message"]
            assert "OPENENV_SESSION_IDLE_TIMEOUT_S" in reply["data"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(idle[0].recv(), 10)
            assert closed.value.rcvd.code == 1008
        finally:
            for ws in idle:
                await ws.close()


async def test_without_an_idle_timeout_idle_sockets_keep_every_slot():
    with serve(counter_app(max_concurrent_envs=2, limits=ServerLimits(session_idle_timeout_s=0))) as server:
        async with connect(ws_url(server)) as a, connect(ws_url(server)) as b:
            await ask(a, {"type": "reset"})
            await ask(b, {"type": "reset"})
            manager = app_server(server).manager
            for session in manager.sessions().values():
                session.last_activity_at -= 3600  # idle for an hour
            assert on_server_loop(server, manager.reap_idle()) == 0
            assert manager.active_sessions == 2


async def test_a_reaped_detached_session_says_why_over_http():
    limits = ServerLimits()
    with serve(counter_app(limits=limits)) as server:
        manager = app_server(server).manager
        session = on_server_loop(server, manager.create())
        session.last_activity_at -= 3600
        assert on_server_loop(server, manager.reap_idle()) == 1
        response = httpx.post(server.base_url + "/step", json={"action": {"delta": 1}, "session_id": session.id})
        assert response.status_code == 404
        assert "without a call" in response.json()["detail"]


# --- 2. slow request heads (slowloris) --------------------------------------------------------


async def slow_heads(server: Any, count: int, within: float) -> int:
    """Open ``count`` connections that trickle a request head (HTTP, and a WebSocket handshake)
    one header line every 0.1 s; how many the server closed within ``within`` seconds."""

    async def one(i: int) -> bool:
        reader, writer = await open_raw(server)
        path = b"/ws" if i % 2 else b"/health"
        writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n")
        deadline = time.monotonic() + within
        try:
            while time.monotonic() < deadline:
                try:
                    data = await asyncio.wait_for(reader.read(1024), 0.1)
                except asyncio.TimeoutError:
                    writer.write(b"X-Slow: %d\r\n" % i)
                    continue
                except ConnectionError:
                    return True
                if not data:
                    return True
            return False
        finally:
            writer.close()

    results = await asyncio.gather(*(one(i) for i in range(count)))
    return sum(results)


@pytest.mark.internals("uvicorn-guard")
async def test_a_request_head_that_does_not_complete_in_time_is_closed():
    limits = ServerLimits(header_timeout_s=0.5, max_connections_per_client=0)
    with serve(counter_app(limits=limits)) as server:
        started = time.monotonic()
        assert await slow_heads(server, 12, within=3) == 12
        assert time.monotonic() - started < 3
        assert server.server.config.openenv_connections.timed_out == 12
        assert httpx.get(server.base_url + "/health").status_code == 200


@pytest.mark.internals("uvicorn-guard")
async def test_a_keep_alive_connection_must_start_its_next_request_in_time_too():
    limits = ServerLimits(header_timeout_s=0.5, max_connections_per_client=0)
    with serve(counter_app(limits=limits), timeout_keep_alive=60) as server:
        reader, writer = await open_raw(server)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200 OK" in await reader.readuntil(b'"healthy"}')
        writer.write(b"GET /health HTTP/1.1\r\n")  # and nothing more
        assert await closed_by_server(reader, 3) == b""
        writer.close()


async def test_without_a_header_timeout_slow_heads_are_kept():
    limits = ServerLimits(header_timeout_s=0, max_connections_per_client=0)
    with serve(counter_app(limits=limits)) as server:
        assert await slow_heads(server, 4, within=1.5) == 0


# --- 3. connections per client address -----------------------------------------------------


@pytest.mark.internals("uvicorn-guard")
@pytest.mark.parametrize("uds", [False, True], ids=["loopback", "unix-socket"])
async def test_connections_past_the_per_client_cap_are_refused(uds):
    # Every peer on this machine is the one address "local", which has a cap of its own.
    limits = ServerLimits(max_local_connections=8, header_timeout_s=0)
    with serve(counter_app(limits=limits), uds=uds) as server:
        attackers = [await open_raw(server) for _ in range(12)]
        try:
            table = server.server.config.openenv_connections
            await until(lambda: table.refused == 4)
            refused = [await closed_by_server(r, 0.5) for r, _ in attackers[8:]]
            for answer in refused:
                assert answer.startswith(b"HTTP/1.1 503")
                assert b"OPENENV_MAX_CONNECTIONS_PER_CLIENT" in answer
            assert table.open == {"local": 8}  # loopback and Unix-socket peers are one address
        finally:
            for _, writer in attackers:
                writer.close()
        await until(lambda: table.open == {})
        transport = httpx.HTTPTransport(uds=server.base_url[len("unix://") :]) if uds else None
        base = "http://localhost" if uds else server.base_url
        with httpx.Client(transport=transport, base_url=base) as client:
            assert client.get("/health").status_code == 200


async def test_local_clients_have_no_cap_by_default_so_every_connection_is_kept():
    limits = ServerLimits(max_connections_per_client=8, header_timeout_s=0)  # local: the default, none
    with serve(counter_app(limits=limits)) as server:
        attackers = [await open_raw(server) for _ in range(12)]
        try:
            assert httpx.get(server.base_url + "/health").status_code == 200
            kept = await asyncio.gather(*(closed_by_server(r, 0.3) for r, _ in attackers), return_exceptions=True)
            assert all(isinstance(outcome, asyncio.TimeoutError) for outcome in kept)  # none answered or closed
        finally:
            for _, writer in attackers:
                writer.close()


# --- 4. frames over the limit, compressed or not ---------------------------------------------


@pytest.mark.internals("uvicorn")
async def test_a_frame_over_the_limit_is_refused_from_its_header_and_the_connection_goes_on():
    with serve(counter_app(max_message_size_mb=2)) as server:
        async with connect(ws_url(server), compression=None, max_size=None) as ws:
            await ask(ws, {"type": "reset"})
            # A frame declaring 64 MiB, of which 1 MiB is sent: the answer comes before the rest.
            ws.transport.write(masked_frame(1, b"x" * MIB, declared=64 * MIB))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert reply["data"]["code"] == "MESSAGE_TOO_LARGE"
            assert reply["data"]["limit"] == 2 * MIB
            chunk = b"x" * (9 * MIB)
            for _ in range(7):  # the other 63 MiB, dropped as they come
                ws.transport.write(chunk)
            assert (await ask(ws, {"type": "step", "data": {"delta": 1}}))["data"]["observation"]["value"] == 1
            assert app_server(server).budget.used == 0


async def test_with_uvicorns_own_protocol_and_a_high_transport_limit_the_frame_is_buffered_first():
    """What the server did before: the transport buffered the whole frame, then the app refused it."""
    app = counter_app(max_message_size_mb=2)
    with serve(app, ws="websockets-sansio", ws_max_size=256 * MIB) as server:
        async with connect(ws_url(server), compression=None, max_size=None) as ws:
            await ask(ws, {"type": "reset"})
            ws.transport.write(masked_frame(1, b"x" * MIB, declared=8 * MIB))
            with pytest.raises(asyncio.TimeoutError):  # no answer until all 8 MiB are in
                await asyncio.wait_for(ws.recv(), 0.5)
            ws.transport.abort()


@pytest.mark.internals("uvicorn")
async def test_a_compressed_message_inflating_past_the_limit_is_refused_at_the_limit():
    """A deflate bomb: 8 MiB that compress to a few KiB. websockets stops inflating at the
    limit; the client is told why and the connection is closed with 1009."""
    with serve(counter_app(max_message_size_mb=2)) as server:
        async with connect(ws_url(server), compression="deflate", max_size=None) as ws:
            await ask(ws, {"type": "reset"})
            await ws.send('{"type":"step","data":{"metadata":{"blob":"' + "x" * (8 * MIB) + '"}}}')
            reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert reply["data"]["code"] == "MESSAGE_TOO_LARGE"
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd.code == 1009
        assert httpx.get(server.base_url + "/health").status_code == 200


async def test_with_a_high_transport_limit_the_bomb_is_inflated_whole():
    app = counter_app(max_message_size_mb=2)
    with serve(app, ws="websockets-sansio", ws_max_size=256 * MIB) as server:
        async with connect(ws_url(server), compression="deflate", max_size=None) as ws:
            await ask(ws, {"type": "reset"})
            reply = await ask(ws, '{"type":"step","data":{"metadata":{"blob":"' + "x" * (8 * MIB) + '"}}}')
            assert reply["data"]["code"] == "MESSAGE_TOO_LARGE"
            inflated = int(reply["data"]["message"].split()[2])  # "Message of N characters ..."
            assert inflated > 8 * MIB  # the app was handed all of it, inflated


# --- 5. the budget of bytes in flight --------------------------------------------------------

STALL = 1536 * 1024  # 1.5 MiB declared; with a 4 MiB budget two fit


async def stalled_frames(server: Any, count: int) -> list:
    """``count`` sockets, each sending the header and 64 KiB of a 1.5 MiB frame, then stalling;
    returns (socket, error frame or None, close code or None) once each has settled."""
    sockets = [await connect(ws_url(server), compression=None).__aenter__() for _ in range(count)]
    for ws in sockets:
        ws.transport.write(masked_frame(1, b"x" * 65536, declared=STALL))

    async def settled(ws: Any) -> tuple:
        try:
            return ws, json.loads(await asyncio.wait_for(ws.recv(), 0.5))
        except asyncio.TimeoutError:
            return ws, None
        except ConnectionClosed:
            return ws, "closed"

    return list(await asyncio.gather(*(settled(ws) for ws in sockets)))


@pytest.mark.internals("uvicorn")
async def test_stalled_large_frames_past_the_budget_are_refused_and_free_their_slots():
    limits = ServerLimits(max_message_mb=2, max_inflight_mb=4)
    with serve(counter_app(max_concurrent_envs=8, limits=limits)) as server:
        env_server = app_server(server)
        outcomes = await stalled_frames(server, 8)
        try:
            busy = [reply for _, reply in outcomes if isinstance(reply, dict)]
            assert len(busy) == 6 and all(reply["data"]["code"] == "SERVER_BUSY" for reply in busy)
            assert "OPENENV_MAX_INFLIGHT_MB" in busy[0]["data"]["message"]
            await until(lambda: env_server.active_sessions == 2)  # the refused ones' slots are free
            assert env_server.budget.used == 2 * STALL
            # A large HTTP body meets the same budget, a small request does not.
            response = httpx.post(
                server.base_url + "/step", content=b'{"action":{"delta":1},"pad":"' + b" " * STALL + b'"}'
            )
            assert response.status_code == 503 and response.json()["code"] == "SERVER_BUSY"
            assert httpx.post(server.base_url + "/step", json={"action": {"delta": 1}}).status_code == 200
            # And so does a compressed message, by its inflated size.
            async with connect(ws_url(server), compression="deflate") as ws:
                await ws.send('{"type":"reset","data":{"pad":"' + " " * STALL + '"}}')
                assert json.loads(await asyncio.wait_for(ws.recv(), 5))["data"]["code"] == "SERVER_BUSY"
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
                assert closed.value.rcvd.code == 1013
            # Our client names it.
            async with GenericEnvClient(base_url=server.base_url) as client:
                with pytest.raises(ServerBusyError, match="OPENENV_MAX_INFLIGHT_MB"):
                    await client.reset(pad=" " * STALL)
        finally:
            for ws, _ in outcomes:
                ws.transport.abort()
        await until(lambda: env_server.budget.used == 0 and env_server.active_sessions == 0)


async def test_without_a_budget_every_stalled_frame_keeps_its_slot():
    limits = ServerLimits(max_message_mb=2, max_inflight_mb=0)
    with serve(counter_app(max_concurrent_envs=8, limits=limits)) as server:
        outcomes = await stalled_frames(server, 8)
        try:
            assert [reply for _, reply in outcomes] == [None] * 8
            assert app_server(server).active_sessions == 8
        finally:
            for ws, _ in outcomes:
                ws.transport.abort()


async def test_concurrent_large_bodies_past_the_budget_get_503():
    limits = ServerLimits(max_message_mb=2, max_inflight_mb=4)
    with serve(counter_app(limits=limits)) as server:
        head = b"POST /step HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        streams = []
        for _ in range(6):  # each declares 1.5 MiB and sends 64 KiB of it
            reader, writer = await open_raw(server)
            writer.write(head % STALL + b"x" * 65536)
            streams.append((reader, writer))
        try:

            async def answer(reader: asyncio.StreamReader) -> Optional[bytes]:
                try:
                    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.5)
                except asyncio.TimeoutError:
                    return None

            answers = await asyncio.gather(*(answer(reader) for reader, _ in streams))
            assert sum(1 for a in answers if a is not None and a.startswith(b"HTTP/1.1 503")) == 4
            assert answers.count(None) == 2
        finally:
            for _, writer in streams:
                writer.transport.abort()
        budget = app_server(server).budget
        await until(lambda: budget.used == 0)  # the stalled bodies' share returns once they are gone


# --- 6. a client that does not read ----------------------------------------------------------

SERVE_SCRIPT = """
import sys
from openenv.core.env_server.limits import ServerLimits
from openenv.core.env_server.serving.runner import run_server
from tests.conftest import counter_app
run_server(counter_app(limits=ServerLimits(max_unsent_mb=float(sys.argv[2]))), port=int(sys.argv[1]), log_level="error")
"""


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def ping_flood(port: int, megabytes: int) -> tuple:
    """Open /ws, send ``megabytes`` MiB of pings and never read; returns the MiB sent before the
    server dropped the connection (``megabytes`` when it did not) and the socket, still open."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head
    batch = masked_frame(9, b"p" * 125) * (MIB // 131)
    sent = 0
    try:
        while sent < megabytes:
            sock.sendall(batch)
            sent += 1
    except OSError:
        pass
    return sent, sock


def eventually(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def subprocess_server():
    servers = []

    def start(max_unsent_mb: float) -> subprocess.Popen:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        process = subprocess.Popen([sys.executable, "-c", SERVE_SCRIPT, str(port), str(max_unsent_mb)], cwd=REPO)
        servers.append(process)
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.05)
        process.port = port  # type: ignore[attr-defined]
        return process

    yield start
    for process in servers:
        process.terminate()
        process.wait(10)


@pytest.mark.internals("uvicorn")
def test_a_client_that_floods_pings_and_never_reads_is_dropped_and_its_memory_returns(subprocess_server):
    server = subprocess_server(max_unsent_mb=4)
    before = rss_kib(server.pid)
    sent, sock = ping_flood(server.port, 64)
    try:
        assert sent < 64  # dropped partway
        assert httpx.get(f"http://127.0.0.1:{server.port}/health").status_code == 200
        after = rss_kib(server.pid)
    finally:
        sock.close()
    print(f"ping flood, max_unsent_mb=4: dropped after {sent} MiB sent; RSS {before} -> {after} KiB")
    assert after - before < 16 * 1024


def test_without_the_bound_a_ping_flood_grows_the_server(subprocess_server):
    server = subprocess_server(max_unsent_mb=0)
    before = rss_kib(server.pid)
    sent, sock = ping_flood(server.port, 48)
    try:
        assert sent == 48
        assert eventually(lambda: rss_kib(server.pid) - before > 24 * 1024)
        grown = rss_kib(server.pid)
    finally:
        sock.close()
    print(f"ping flood, no bound: RSS {before} -> {grown} KiB while the client is connected")


# --- the forwarder of `openenv serve` -----------------------------------------------------------


async def test_the_forwarder_caps_connections_per_client_address_itself(tmp_path):
    # Behind the forwarder every client is one Unix-socket peer of the server: the cap must be
    # applied in front. (Remote addresses are what it counts; here cap_local counts loopback too.)
    from openenv.core.containers.runtime.forward import UnixForwarder

    with serve(counter_app(), uds=True) as server:
        forwarder = UnixForwarder(server.base_url, port=0, max_per_client=2, cap_local=True)
        host, port = await forwarder.start()
        clients = []
        try:
            for _ in range(2):
                clients.append(await asyncio.open_connection(host, port))
            await until(lambda: sum(forwarder.open.values()) == 2)
            reader, writer = await asyncio.open_connection(host, port)
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 503") and b"TOO_MANY_CONNECTIONS" in answer
            for _, w in clients:
                w.close()
            await until(lambda: forwarder.open == {})
            reader, writer = await asyncio.open_connection(host, port)  # room again
            writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200")
            writer.close()
        finally:
            await forwarder.close()


async def test_the_forwarder_does_not_cap_clients_on_this_machine(tmp_path):
    from openenv.core.containers.runtime.forward import UnixForwarder

    with serve(counter_app(), uds=True) as server:
        forwarder = UnixForwarder(server.base_url, port=0, max_per_client=2)
        host, port = await forwarder.start()
        try:
            clients = [await asyncio.open_connection(host, port) for _ in range(4)]
            reader, writer = clients[-1]
            writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200")
            for _, w in clients:
                w.close()
        finally:
            await forwarder.close()
