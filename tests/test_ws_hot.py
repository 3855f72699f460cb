"""Hot connections (openenv.core.env_server.ws_hot) on live servers: a client stepping back to back
is answered by the worker that ran its step, and everything else on such a connection is handled
by the event loop exactly as on any other. Also the server's own framing of plain connections
(openenv.core.env_server.ws_frames)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import threading
import time
from typing import Any, List, Optional

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State
from openenv.core.env_server.workers import Waker, WorkerPool
from openenv.core.env_server.ws_frames import client_text, text_frame
from openenv.core.env_server.ws_protocol import OpenEnvWebSocketProtocol

from .conftest import counter_app, serve, until
from .envs import TRACKER, CounterAction, CounterEnv, CounterObservation, SingleThreadEnv

STEP = json.dumps({"type": "step", "data": {"delta": 1}})


@pytest.fixture(autouse=True)
def _long_linger(monkeypatch):
    # A test client in this process shares the GIL with the server's thread: give it time enough
    # to count as stepping back to back. Tests that mean otherwise set their own.
    monkeypatch.setenv("OPENENV_WS_LINGER_MS", "300")


def ws_url(server) -> str:
    return server.base_url.replace("http://", "ws://") + "/ws"


def env_server(app) -> Any:
    return app.state.openenv_server


def open_fds(kind: str) -> int:
    """This process's open file descriptors of one kind ("socket", "anon_inode:[eventfd]")."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(kind)
        except OSError:  # the listing's own descriptor, closed meanwhile
            pass
    return count


def protocols(server) -> list:
    return [c for c in server.server.server_state.connections if isinstance(c, OpenEnvWebSocketProtocol)]


async def step_values(ws, count: int) -> List[int]:
    values = []
    for _ in range(count):
        await ws.send(STEP)
        reply = json.loads(await ws.recv())
        assert reply["type"] == "observation", reply
        values.append(reply["data"]["observation"]["value"])
    return values


class RawClient:
    """A WebSocket client over a plain socket (websockets' sans-I/O protocol), so a test decides
    exactly which bytes reach the server in which write."""

    def __init__(self, server) -> None:
        self.protocol = ClientProtocol(parse_uri(ws_url(server)), max_size=None)
        if server.base_url.startswith("unix://"):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(server.base_url[len("unix://") :])
        else:
            self.sock = socket.create_connection((server.host, server.port))
        self.sock.settimeout(10)
        self.pending: List[Any] = []
        self.protocol.send_request(self.protocol.connect())
        self.flush()
        assert self.next_event().status_code == 101

    def flush(self) -> None:
        self.sock.sendall(b"".join(self.protocol.data_to_send()))

    def next_event(self) -> Any:
        while True:
            self.pending.extend(self.protocol.events_received())
            if self.pending:
                return self.pending.pop(0)
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.protocol.receive_data(data)

    def reply(self) -> dict:
        """The next text message from the server, decoded (pongs are skipped)."""
        while True:
            event = self.next_event()
            if event.opcode is Opcode.TEXT:
                return json.loads(event.data)
            assert event.opcode is Opcode.PONG, event

    def send_text(self, text: str) -> None:
        self.protocol.send_text(text.encode())
        self.flush()

    def step(self) -> dict:
        self.send_text(STEP)
        return self.reply()

    def close(self) -> None:
        self.sock.close()


def frame(text: str, opcode: Opcode = Opcode.TEXT, fin: bool = True) -> bytes:
    return Frame(opcode, text.encode(), fin=fin).serialize(mask=True)


# --- the frame codec ------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 200_000])
def test_answer_frames_parse_as_websockets_parses_them(size):
    from websockets.protocol import State as WSState

    text = "é" * (size // 2) + "x" * (size % 2)
    client = ClientProtocol(parse_uri("ws://x/"), state=WSState.OPEN, max_size=None)
    client.receive_data(text_frame(text))
    (event,) = client.events_received()
    assert event.opcode is Opcode.TEXT and event.fin and event.data.decode() == text


@pytest.mark.parametrize("size", [0, 5, 125, 126, 1000, 65535 - 14])
def test_a_whole_masked_text_frame_is_read(size):
    text = "a" * size
    assert client_text(frame(text), max_chars=1 << 20) == text


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(frame('{"a":1}', fin=False), id="first fragment"),
        pytest.param(frame('{"a":1}', Opcode.CONT), id="continuation"),
        pytest.param(frame('{"a":1}', Opcode.BINARY), id="binary"),
        pytest.param(frame("", Opcode.PING), id="ping"),
        pytest.param(frame('{"a":1}')[:-1], id="cut short"),
        pytest.param(frame('{"a":1}') + frame('{"a":1}'), id="two frames"),
        pytest.param(Frame(Opcode.TEXT, b'{"a":1}').serialize(mask=False), id="unmasked"),
        pytest.param(bytes([0xC1]) + frame('{"a":1}')[1:], id="rsv1 set"),
        pytest.param(Frame(Opcode.TEXT, b"\xff\xfe").serialize(mask=True), id="not utf-8"),
        pytest.param(frame("x" * 70_000), id="64-bit length"),
    ],
)
def test_anything_but_one_whole_text_frame_is_left_to_the_loop(data):
    assert client_text(data, max_chars=1 << 20) is None


def test_a_frame_over_the_message_limit_is_left_to_the_loop():
    assert client_text(frame("x" * 100), max_chars=99) is None
    assert client_text(frame("x" * 99), max_chars=99) == "x" * 99


# --- lending on a live server -----------------------------------------------------------------


@pytest.mark.parametrize("uds", [False, True], ids=["tcp", "unix"])
async def test_a_client_stepping_back_to_back_is_answered_by_the_worker(uds):
    app = counter_app()
    with serve(app, uds=uds) as server:
        url = ws_url(server) if not uds else "ws://localhost/ws"
        kwargs = {"unix": True, "path": server.base_url[len("unix://") :]} if uds else {}
        opener = connect(url, compression=None, **kwargs) if not uds else _unix_connect(url, kwargs["path"])
        async with opener as ws:
            await ws.send(json.dumps({"type": "reset"}))
            await ws.recv()
            assert await step_values(ws, 60) == list(range(1, 61))
            await ws.send(json.dumps({"type": "state"}))
            state = json.loads(await ws.recv())["data"]
            assert state["step_count"] == 60 and state["value"] == 60
            (session_id,) = env_server(app).manager.sessions()
            assert env_server(app).manager.session_info(session_id).step_count == 60
        # The first step (no answer before it) is the loop's; most of the rest are the worker's.
        assert env_server(app).lent_answers >= 40
        await until(lambda: env_server(app).active_sessions == 0)


def _unix_connect(url: str, path: str) -> Any:
    from websockets.asyncio.client import unix_connect

    return unix_connect(path, url, compression=None)


async def test_an_mcp_environments_tool_calls_are_never_lent():
    # MCP actions of an MCP environment run on the event loop (its tools are async), however
    # closely the client steps: the worker must never take them.
    from echo_env.server.echo_environment import EchoEnvironment

    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    app = create_app(EchoEnvironment, CallToolAction, CallToolObservation, env_name="echo_env")
    with serve(app) as server:
        async with connect(ws_url(server), compression=None) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(await ws.recv())["type"] == "observation"
            for number in range(30):
                call = {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": f"m{number}"}}
                await ws.send(json.dumps({"type": "step", "data": call}))
                reply = json.loads(await ws.recv())
                assert reply["type"] == "observation", reply
                assert reply["data"]["observation"]["result"]["data"] == f"m{number}"
    assert env_server(app).lent_answers == 0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_lending_works_on_either_event_loop(loop):
    app = counter_app()
    with serve(app, loop=loop) as server:
        async with connect(ws_url(server), compression=None) as ws:
            assert await step_values(ws, 30) == list(range(1, 31))
    assert env_server(app).lent_answers >= 20


async def test_a_linger_of_zero_turns_lending_off(monkeypatch):
    monkeypatch.setenv("OPENENV_WS_LINGER_MS", "0")
    app = counter_app()
    with serve(app) as server:
        async with connect(ws_url(server), compression=None) as ws:
            assert await step_values(ws, 30) == list(range(1, 31))
    assert env_server(app).lent_answers == 0


def test_a_linger_that_is_not_a_number_is_refused(monkeypatch):
    monkeypatch.setenv("OPENENV_WS_LINGER_MS", "soon")
    with pytest.raises(ValueError, match="OPENENV_WS_LINGER_MS"):
        counter_app()


async def test_a_client_that_pauses_between_steps_is_served_by_the_loop(monkeypatch):
    monkeypatch.setenv("OPENENV_WS_LINGER_MS", "1")
    app = counter_app()
    with serve(app) as server:
        async with connect(ws_url(server), compression=None) as ws:
            for expected in range(1, 11):
                await asyncio.sleep(0.02)  # far longer than the linger
                assert await step_values(ws, 1) == [expected]
    assert env_server(app).lent_answers == 0


async def test_a_compressed_connection_is_never_lent():
    app = counter_app()
    with serve(app) as server:
        async with connect(ws_url(server)) as ws:  # offers permessage-deflate, which uvicorn takes
            assert await step_values(ws, 30) == list(range(1, 31))
    assert env_server(app).lent_answers == 0


async def test_an_async_environment_is_never_lent():
    from .envs import AsyncCounterEnv

    app = counter_app(AsyncCounterEnv)
    with serve(app) as server:
        async with connect(ws_url(server), compression=None) as ws:
            assert await step_values(ws, 20) == list(range(1, 21))
    assert env_server(app).lent_answers == 0


STEP_FRAME = frame(STEP)

# Each is sent while the connection is lent (right after a step the worker answered); the loop
# must answer it as it answers it on any connection, and the connection must go on working.
ODD_INPUT = [
    pytest.param([frame("{not json")], "INVALID_JSON", id="not json"),
    pytest.param([frame("[1,2]")], "VALIDATION_ERROR", id="json array"),
    pytest.param([frame("abc", Opcode.BINARY)], "UNSUPPORTED_FRAME", id="binary"),
    pytest.param([frame('{"type":"dance"}')], "UNKNOWN_TYPE", id="unknown type"),
    pytest.param([frame('{"type":"step","data":{"delta":"x"}}')], "VALIDATION_ERROR", id="invalid action"),
    pytest.param([frame('{"type":"step","data":{"delta":1},"extra":1}')], "VALIDATION_ERROR", id="extra key"),
    pytest.param([frame('{"type":"step","data":[]}')], "VALIDATION_ERROR", id="data not an object"),
    pytest.param([frame('{"type":"state"}')], "state", id="state"),
    pytest.param([frame('{"type":"reset","data":{"start":5}}')], "reset", id="reset"),
    pytest.param([frame("", Opcode.PING), frame(STEP)], "pong", id="ping"),
    pytest.param([frame('{"type":"st', fin=False), frame('ep","data":{}}', Opcode.CONT)], "step", id="fragments"),
    pytest.param([STEP_FRAME[:5], STEP_FRAME[5:]], "step", id="split across writes"),
    pytest.param([frame(STEP) + frame(STEP)], "two steps", id="two frames in one write"),
    pytest.param([frame("x" * 2000)], "MESSAGE_TOO_LARGE", id="over the limit"),
]


@pytest.mark.parametrize("writes,expect", ODD_INPUT)
def test_anything_but_a_plain_step_is_answered_by_the_loop_as_usual(writes, expect):
    app = counter_app(max_message_size_mb=1000 / (1024 * 1024))
    with serve(app) as server:
        client = RawClient(server)
        try:
            assert client.step()["data"]["observation"]["value"] == 1
            assert client.step()["data"]["observation"]["value"] == 2  # the worker's answer
            lent_before = env_server(app).lent_answers
            assert lent_before >= 1
            for data in writes:
                client.sock.sendall(data)
                time.sleep(0.05)
            value = 2
            if expect == "pong":
                assert client.next_event().opcode is Opcode.PONG
                expect = "step"
            if expect == "step":
                value += 1
                assert client.reply()["data"]["observation"]["value"] == value
            elif expect == "two steps":
                value += 2
                assert [client.reply()["data"]["observation"]["value"] for _ in range(2)] == [value - 1, value]
            elif expect == "state":
                assert client.reply()["data"]["value"] == 2
            elif expect == "reset":
                assert client.reply()["data"]["observation"]["value"] == 5
                value = 5
            else:
                reply = client.reply()
                assert reply["type"] == "error" and reply["data"]["code"] == expect, reply
            for _ in range(5):  # the connection works, and is lent again
                value += 1
                assert client.step()["data"]["observation"]["value"] == value
            assert env_server(app).lent_answers > lent_before
        finally:
            client.close()


def test_a_close_frame_sent_to_a_lent_connection_ends_it_cleanly():
    app = counter_app()
    with serve(app) as server:
        client = RawClient(server)
        client.step()
        client.step()
        client.protocol.send_close(1000)
        client.flush()
        event = client.next_event()
        assert event.opcode is Opcode.CLOSE
        client.close()
        assert env_server(app).lent_answers >= 1
    asyncio.run(until(lambda: env_server(app).active_sessions == 0))


async def test_a_step_error_on_a_lent_connection_is_an_error_frame_and_lending_goes_on():
    app = counter_app()
    with serve(app) as server:
        async with connect(ws_url(server), compression=None) as ws:
            assert await step_values(ws, 3) == [1, 2, 3]
            await ws.send(json.dumps({"type": "step", "data": {"fail": True}}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error" and reply["data"]["code"] == "EXECUTION_ERROR"
            assert "failed on purpose" in reply["data"]["message"]
            before = env_server(app).lent_answers
            assert await step_values(ws, 5) == [4, 5, 6, 7, 8]
            assert env_server(app).lent_answers > before


async def test_pipelined_steps_on_a_lent_connection_are_answered_in_order():
    app = counter_app()
    with serve(app) as server:
        async with connect(ws_url(server), compression=None) as ws:
            await step_values(ws, 2)
            for _ in range(40):
                await ws.send(STEP)
            values = [json.loads(await ws.recv())["data"]["observation"]["value"] for _ in range(40)]
            assert values == list(range(3, 43))
            assert await step_values(ws, 3) == [43, 44, 45]


async def test_a_long_step_on_a_lent_connection_times_out_as_any_step():
    app = counter_app(step_timeout_s=0.3)
    with serve(app) as server:
        async with connect(ws_url(server), compression=None) as ws:
            await step_values(ws, 3)
            assert env_server(app).lent_answers >= 1
            started = time.monotonic()
            await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 3}}))
            reply = json.loads(await ws.recv())
            elapsed = time.monotonic() - started
            assert reply["type"] == "error" and reply["data"]["code"] == "TIMEOUT"
            assert reply["data"]["timeout_s"] == 0.3  # the limit, not what was left of it when recalled
            assert 0.28 <= elapsed < 1.0
            # the environment was discarded and a fresh one serves the next step
            assert await step_values(ws, 2) == [1, 2]


async def test_a_long_step_on_a_lent_connection_is_answered_by_the_loop():
    app = counter_app()
    with serve(app) as server:
        async with connect(ws_url(server), compression=None) as ws:
            await step_values(ws, 3)
            await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 0.3}}))
            reply = json.loads(await ws.recv())
            assert reply["data"]["observation"]["value"] == 4
            assert await step_values(ws, 3) == [5, 6, 7]


async def test_a_client_leaving_during_a_long_lent_step_frees_its_slot_before_the_step_ends():
    app = counter_app()
    with serve(app) as server:
        ws = await connect(ws_url(server), compression=None)
        await step_values(ws, 3)
        await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 2}}))
        await asyncio.sleep(0.2)  # recalled from the worker by now, and watched
        ws.transport.abort()
        started = time.monotonic()
        await until(lambda: env_server(app).active_sessions == 0, timeout=5)
        assert time.monotonic() - started < 1.5  # noticed while the step still ran
        await until(lambda: TRACKER.alive == 0, timeout=5)  # closed once the step returned


async def test_clients_vanishing_from_lent_connections_leak_no_slot_fd_or_thread():
    app = counter_app(max_concurrent_envs=2)
    with serve(app) as server:
        async with connect(ws_url(server), compression=None) as ws:  # warms the server up
            await step_values(ws, 3)
        await until(lambda: env_server(app).active_sessions == 0)
        sockets, eventfds = open_fds("socket"), open_fds("anon_inode:[eventfd]")
        for cycle in range(30):
            client = RawClient(server)
            for _ in range(4):  # the first is the loop's; a previous session's close may delay lending
                client.step()
            if cycle % 2:
                client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")  # RST
            client.close()
        await until(lambda: env_server(app).active_sessions == 0, timeout=10)
        await until(lambda: TRACKER.alive == 0, timeout=10)
        await until(lambda: open_fds("socket") <= sockets, timeout=10)  # no connection's, no duplicate
        assert open_fds("anon_inode:[eventfd]") <= eventfds + env_server(app).manager.pool.threads  # one per worker
        assert env_server(app).lent_answers >= 30
        assert env_server(app).manager.pool.stuck == 0
        # and the server still serves
        async with connect(ws_url(server), compression=None) as ws:
            assert await step_values(ws, 3) == [1, 2, 3]


async def test_a_call_waiting_for_the_session_is_not_starved_by_a_hot_client():
    app = counter_app()
    with serve(app) as server:
        manager = env_server(app).manager
        async with connect(ws_url(server), compression=None) as ws:
            await step_values(ws, 3)
            (session,) = manager.sessions().values()
            stop = False

            async def hammer() -> int:
                count = 0
                while not stop:
                    await step_values(ws, 1)
                    count += 1
                return count

            task = asyncio.create_task(hammer())
            await asyncio.sleep(0.2)
            started = time.monotonic()
            server_loop = server.loop
            state = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(manager.state(session), server_loop))
            waited = time.monotonic() - started
            stop = True
            count = await task
            assert state.step_count >= 3
            assert waited < 0.5, f"the state call waited {waited:.2f} s behind the hot client"
            assert count > 10


def test_a_call_needing_the_only_worker_is_not_kept_waiting_by_a_lingering_one(monkeypatch):
    monkeypatch.setenv("OPENENV_WS_LINGER_MS", "4000")
    app = counter_app(SingleThreadEnv, max_concurrent_envs=2)
    with serve(app) as server:
        client = RawClient(server)
        try:
            for expected in (1, 2, 3):
                assert client.step()["data"]["observation"]["value"] == expected
            # The pool's one thread now waits (up to 4 s) for this client's next frame; a
            # stateless HTTP reset needs that thread to build an environment and reset it.
            started = time.monotonic()
            response = httpx.post(f"{server.base_url}/reset", json={}, timeout=10)
            waited = time.monotonic() - started
            assert response.status_code == 200
            assert waited < 2, f"the reset waited {waited:.2f} s for the lingering worker"
            assert client.step()["data"]["observation"]["value"] == 4
            assert len(TRACKER.threads) == 1
        finally:
            client.close()


def test_a_lingering_worker_gives_way_to_a_call_submitted_to_its_pool():
    async def scenario() -> float:
        pool = WorkerPool(1, max_stuck=0)
        read_fd, write_fd = os.pipe()
        try:
            lingering = pool.submit(_linger_on, pool, read_fd)
            await asyncio.sleep(0.1)  # the only worker now lingers on the pipe
            started = time.monotonic()
            assert await pool.submit(lambda: "ran").future == "ran"
            waited = time.monotonic() - started
            readable, lingered = await lingering.future
            assert not readable and lingered < 1.0
            return waited
        finally:
            pool.shutdown()
            os.close(read_fd)
            os.close(write_fd)

    assert asyncio.run(scenario()) < 2.5  # not the 5 s linger


def _linger_on(pool: WorkerPool, fd: int) -> tuple:
    started = time.monotonic()
    readable = pool.linger(fd, 5000)
    return readable, time.monotonic() - started


def test_two_hot_clients_of_a_single_thread_environment_both_progress():
    app = counter_app(SingleThreadEnv, max_concurrent_envs=2)
    with serve(app) as server:
        clients = [RawClient(server), RawClient(server)]
        try:
            counts = [0, 0]
            deadline = time.monotonic() + 1.0
            # Alternate so that both are always hot; each must be answered every time.
            while time.monotonic() < deadline:
                for i, client in enumerate(clients):
                    counts[i] += 1
                    assert client.step()["data"]["observation"]["value"] == counts[i]
            assert min(counts) > 20
            assert len(TRACKER.threads) == 1
        finally:
            for client in clients:
                client.close()


class BlobAction(CounterAction):
    size: int = 0


class BlobObservation(CounterObservation):
    blob: str = ""


class BlobEnv(Environment[BlobAction, BlobObservation, State]):
    """Answers each step with ``size`` characters."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> BlobObservation:
        self._state = State(step_count=0)
        return BlobObservation()

    def step(self, action: BlobAction, timeout_s: Optional[float] = None, **kwargs: Any) -> BlobObservation:
        self._state.step_count += 1
        return BlobObservation(value=self._state.step_count, blob="b" * action.size)

    @property
    def state(self) -> State:
        return self._state


def test_an_answer_too_large_for_one_write_is_finished_by_the_loop():
    app = create_app(BlobEnv, BlobAction, BlobObservation, max_concurrent_envs=2)
    with serve(app) as server:
        client = RawClient(server)
        try:
            small = json.dumps({"type": "step", "data": {"size": 10}})
            big = json.dumps({"type": "step", "data": {"size": 1024 * 1024}})
            client.send_text(small)
            assert client.reply()["data"]["observation"]["value"] == 1
            # Small socket buffers on both ends: the kernel cannot take the big answer in one write.
            (protocol,) = protocols(server)
            protocol.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
            client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            client.send_text(small)
            assert client.reply()["data"]["observation"]["value"] == 2
            client.send_text(big)
            time.sleep(0.1)  # the buffers fill while this client reads nothing
            reply = client.reply()
            assert reply["data"]["observation"]["value"] == 3
            assert len(reply["data"]["observation"]["blob"]) == 1024 * 1024
            for expected in (4, 5, 6):
                client.send_text(small)
                assert client.reply()["data"]["observation"]["value"] == expected
            assert env_server(app).lent_answers >= 2
        finally:
            client.close()


async def test_keepalive_pings_recall_a_lent_connection_and_are_answered():
    app = counter_app()
    with serve(app, ws_ping_interval=0.05, ws_ping_timeout=2) as server:
        async with connect(ws_url(server), compression=None) as ws:
            deadline = time.monotonic() + 0.8
            value = 0
            while time.monotonic() < deadline:
                value += 1
                assert await step_values(ws, 1) == [value]
            (protocol,) = protocols(server)
            assert protocol.last_ping_rtt > 0  # pings went out and their pongs came back
        assert env_server(app).lent_answers > 10


def test_a_server_stopping_while_a_connection_is_lent_closes_it_promptly():
    app = counter_app()
    server = serve(app)
    running = server.__enter__()
    client = RawClient(running)
    try:
        client.step()
        client.step()
        started = time.monotonic()
        server.__exit__(None, None, None)
        assert time.monotonic() - started < 4
        event = client.next_event()
        assert event.opcode is Opcode.CLOSE
    finally:
        client.close()


def test_random_traffic_on_lent_connections_is_answered_message_by_message():
    """Steps, odd frames, pings and fragments, in random writes: every message gets its answer,
    in order, whoever reads it."""
    rng = random.Random(7)
    app = counter_app(max_message_size_mb=4000 / (1024 * 1024))
    with serve(app) as server:
        client = RawClient(server)
        try:
            value = 0
            for _ in range(300):
                kind = rng.choice(["step", "step", "step", "bad", "state", "ping", "fragments", "burst"])
                if kind == "step":
                    value += 1
                    reply = client.step()
                    assert reply["data"]["observation"]["value"] == value
                elif kind == "bad":
                    client.sock.sendall(frame(rng.choice(["{", "[]", '{"type":1}', "x" * 5000])))
                    assert client.reply()["type"] == "error"
                elif kind == "state":
                    client.sock.sendall(frame('{"type":"state"}'))
                    assert client.reply()["data"]["value"] == value
                elif kind == "ping":
                    client.sock.sendall(frame("", Opcode.PING))
                    assert client.next_event().opcode is Opcode.PONG
                elif kind == "fragments":
                    value += 1
                    client.sock.sendall(frame('{"type":"step",', fin=False))
                    client.sock.sendall(frame('"data":{}}', Opcode.CONT))
                    assert client.reply()["data"]["observation"]["value"] == value
                else:
                    n = rng.randint(2, 5)
                    data = b"".join(frame(STEP) for _ in range(n))
                    cut = rng.randint(1, len(data) - 1)
                    client.sock.sendall(data[:cut])
                    client.sock.sendall(data[cut:])
                    got = [client.reply()["data"]["observation"]["value"] for _ in range(n)]
                    assert got == list(range(value + 1, value + n + 1))
                    value += n
            assert env_server(app).lent_answers > 50
        finally:
            client.close()


# --- the server's own framing of plain connections (ws_frames, used by ws_protocol) -----------


async def test_uvicorns_frame_size_limit_still_applies_to_small_frames():
    app = counter_app()
    with serve(app, ws_max_size=100) as server:
        async with connect(ws_url(server), compression=None, max_size=None) as ws:
            await ws.send(json.dumps({"type": "step", "data": {"delta": 1}}))
            assert json.loads(await ws.recv())["type"] == "observation"
            await ws.send(json.dumps({"type": "step", "data": {"delta": 1, "pad": "x" * 150}}))
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd.code == 1009  # message too big, as uvicorn's parser decides


async def test_answers_a_slow_reader_holds_up_wait_for_the_transport_in_order():
    app = create_app(BlobEnv, BlobAction, BlobObservation, max_concurrent_envs=2)
    with serve(app) as server:
        async with connect(ws_url(server), compression=None, max_size=None, max_queue=1) as ws:
            for _ in range(30):  # 30 answers of 1 MiB, far more than the socket buffers take
                await ws.send(json.dumps({"type": "step", "data": {"size": 1024 * 1024}}))
            await asyncio.sleep(0.5)  # the client reads no further: the server's transport fills up
            (protocol,) = protocols(server)
            assert not protocol.writable.is_set()  # uvicorn's flow control holds the writer
            assert protocol.transport.get_write_buffer_size() < 4 * 1024 * 1024  # not all 30 MiB
            values = []
            for _ in range(30):
                reply = json.loads(await ws.recv())
                assert len(reply["data"]["observation"]["blob"]) == 1024 * 1024
                values.append(reply["data"]["observation"]["value"])
            assert values == list(range(1, 31))


async def test_closed_connections_are_not_kept_alive_by_the_servers_bookkeeping():
    import gc

    from openenv.core.env_server.ws_endpoint import WSConnection

    app = counter_app()
    with serve(app) as server:
        for _ in range(20):
            async with connect(ws_url(server), compression=None) as ws:
                await step_values(ws, 3)

        def none_alive() -> bool:
            gc.collect()
            return not any(isinstance(obj, WSConnection) for obj in gc.get_objects())

        await until(none_alive, timeout=5)  # once the last one's task has ended


# --- races and limits found in review, each reproduced (a narrow window widened by a delay) -----


def test_uvicorns_frame_size_limit_applies_to_lent_steps_too():
    app = counter_app()
    with serve(app, ws_max_size=100) as server:
        client = RawClient(server)
        try:
            assert client.step()["data"]["observation"]["value"] == 1
            assert client.step()["data"]["observation"]["value"] == 2  # the worker's: now lent
            assert env_server(app).lent_answers >= 1
            client.send_text('{"type": "step", "data": {"delta": 1}' + " " * 150 + "}")  # 190 bytes
            assert client.next_event().opcode is Opcode.CLOSE  # 1009, as for any frame too large
        finally:
            client.close()


@pytest.mark.parametrize("ws", [None, "websockets-sansio"], ids=["ours", "uvicorns"])
def test_a_frame_split_after_its_header_is_read_as_sent(ws, monkeypatch):
    """websockets' parser takes a frame's header out of its buffer before the mask arrives: an
    empty buffer is no frame boundary. Here the rest of the frame (mask first) happens to look
    like a whole frame of its own."""
    monkeypatch.setenv("OPENENV_WS_LINGER_MS", "0")
    payload = STEP.encode()
    mask = bytes([0x81, 0x80 | (len(payload) - 2), 0x11, 0x22])
    head = bytes([0x81, 0x80 | len(payload)])
    rest = mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    with serve(counter_app(), **({"ws": ws} if ws else {})) as server:
        client = RawClient(server)
        try:
            assert client.step()["data"]["observation"]["value"] == 1
            client.sock.sendall(head)
            time.sleep(0.1)
            client.sock.sendall(rest)
            assert client.reply()["data"]["observation"]["value"] == 2
            assert client.step()["data"]["observation"]["value"] == 3
        finally:
            client.close()


def test_a_wake_up_just_before_a_worker_waits_is_not_lost(monkeypatch):
    original = Waker.wait

    def late(self, fd, timeout_ms):
        time.sleep(0.2)  # the worker, past linger's check of the queue, not yet waiting
        return original(self, fd, timeout_ms)

    monkeypatch.setattr(Waker, "wait", late)

    async def scenario() -> float:
        pool = WorkerPool(1, max_stuck=0)
        read_fd, write_fd = os.pipe()
        try:
            lingering = pool.submit(_linger_on, pool, read_fd)
            await asyncio.sleep(0.1)
            started = time.monotonic()
            assert await pool.submit(lambda: "ran").future == "ran"
            await lingering.future
            return time.monotonic() - started
        finally:
            pool.shutdown()
            os.close(read_fd)
            os.close(write_fd)

    assert asyncio.run(scenario()) < 2.5  # not the 5 s linger


def test_a_recall_just_after_a_workers_answer_answers_nothing_twice(monkeypatch):
    from openenv.core.env_server.ws_endpoint import ConnectionWatch

    def get(self):
        if threading.current_thread().name.startswith("openenv-env"):
            time.sleep(0.15)  # the worker, between its answer and its wait for the next frame
        return self.__dict__.get("_last")

    def set_(self, value):
        self.__dict__["_last"] = value

    monkeypatch.setattr(ConnectionWatch, "last_active", property(get, set_), raising=False)
    app = counter_app()
    with serve(app, ws_ping_interval=0.05, ws_ping_timeout=5) as server:  # pings recall it
        client = RawClient(server)
        try:
            assert client.step()["data"]["observation"]["value"] == 1
            assert client.step()["data"]["observation"]["value"] == 2
            assert env_server(app).lent_answers >= 1
            client.sock.settimeout(0.2)
            stray = []
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # nothing asked from here: no text may come
                try:
                    event = client.next_event()
                except TimeoutError:
                    continue
                if event.opcode is Opcode.PING:
                    client.flush()  # the pong
                elif event.opcode is Opcode.TEXT:
                    stray.append(json.loads(event.data))
            assert stray == []
        finally:
            client.close()


def test_a_ping_never_lands_inside_a_half_written_answer(monkeypatch):
    from openenv.core.env_server.sessions import SessionManager

    original = SessionManager.call_lent

    async def late_take_back(self, session, lending):
        handback = await original(self, session, lending)
        await asyncio.sleep(0.2)  # the loop busy elsewhere before it takes the connection back
        return handback

    monkeypatch.setattr(SessionManager, "call_lent", late_take_back)
    app = create_app(BlobEnv, BlobAction, BlobObservation, max_concurrent_envs=2)
    with serve(app, ws_ping_interval=0.05, ws_ping_timeout=5) as server:
        client = RawClient(server)
        try:
            small = json.dumps({"type": "step", "data": {"size": 10}})
            client.send_text(small)
            assert client.reply()["data"]["observation"]["value"] == 1
            (protocol,) = protocols(server)
            protocol.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
            client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            client.send_text(small)
            assert client.reply()["data"]["observation"]["value"] == 2  # lent from here
            client.send_text(json.dumps({"type": "step", "data": {"size": 1024 * 1024}}))
            time.sleep(0.5)  # the answer fills the buffers; pings fall due meanwhile
            reply = client.reply()  # a ping inside the text frame would garble it
            assert reply["data"]["observation"]["value"] == 3
            assert len(reply["data"]["observation"]["blob"]) == 1024 * 1024
        finally:
            client.close()


def test_the_sessions_step_count_follows_a_hot_client():
    app = counter_app()
    with serve(app) as server:
        client = RawClient(server)
        try:
            manager = env_server(app).manager
            for expected in range(1, 51):
                assert client.step()["data"]["observation"]["value"] == expected
            (session_id,) = manager.sessions()

            async def info() -> Any:
                return manager.session_info(session_id)

            assert asyncio.run_coroutine_threadsafe(info(), server.loop).result(5).step_count == 50
            assert env_server(app).lent_answers >= 40  # still lent: counted as they happen
        finally:
            client.close()


class SlowRebuildEnv(CounterEnv):
    built = 0

    def __init__(self) -> None:
        type(self).built += 1
        if type(self).built > 1:
            time.sleep(0.3)  # a rebuild, after a timeout discarded the first
        super().__init__()


@pytest.mark.parametrize("compression", [None, "deflate"], ids=["plain", "deflate"])
async def test_the_step_timeout_counts_from_the_step_not_from_the_rebuild_before_it(compression):
    SlowRebuildEnv.built = 0
    app = counter_app(SlowRebuildEnv, step_timeout_s=0.5)
    with serve(app) as server:
        async with connect(ws_url(server), compression=compression) as ws:
            await step_values(ws, 3)
            await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 0.7}}))
            assert json.loads(await ws.recv())["data"]["code"] == "TIMEOUT"
            # At once: the environment is rebuilt (0.3 s), then a 0.35 s step within the 0.5 s.
            await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 0.35}}))
            assert json.loads(await ws.recv())["type"] == "observation"


@pytest.mark.parametrize("value", ["inf", "nan", "1e10", "-1"])
def test_a_linger_out_of_bounds_is_refused(monkeypatch, value):
    monkeypatch.setenv("OPENENV_WS_LINGER_MS", value)
    with pytest.raises(ValueError, match="between 0 and 60000 milliseconds"):
        counter_app()


def test_a_fault_in_a_lending_worker_after_its_answer_does_not_answer_twice(monkeypatch):
    def broken(self, fd, timeout_ms):
        raise RuntimeError("a fault of the worker's own")

    monkeypatch.setattr(WorkerPool, "linger", broken)
    app = counter_app()
    with serve(app) as server:
        client = RawClient(server)
        try:
            for expected in range(1, 6):  # each lent, each handed back after its answer
                assert client.step()["data"]["observation"]["value"] == expected
            assert env_server(app).lent_answers >= 3
            client.sock.settimeout(0.3)
            with pytest.raises((socket.timeout, TimeoutError)):  # no second answer to any of them
                client.next_event()
        finally:
            client.close()


class CountingMiddleware:
    """Counts the messages the app receives, wrapping only ``receive``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def counted() -> Any:
            message = await receive()
            self.seen += message["type"] == "websocket.receive"
            return message

        await self.app(scope, counted, send)


def test_a_middleware_wrapping_receive_sees_every_message():
    counting = CountingMiddleware(counter_app())
    with serve(counting) as server:
        client = RawClient(server)
        try:
            for expected in range(1, 51):
                assert client.step()["data"]["observation"]["value"] == expected
        finally:
            client.close()
    assert counting.seen == 50
    assert env_server(counting.app).lent_answers == 0  # such a connection is never lent


@pytest.mark.parametrize("linger", ["0", "300"], ids=["not lent", "lent"])
def test_a_step_that_timed_out_is_not_counted_on_the_session(monkeypatch, linger):
    monkeypatch.setenv("OPENENV_WS_LINGER_MS", linger)
    app = counter_app(step_timeout_s=0.3)
    with serve(app) as server:
        client = RawClient(server)
        try:
            for _ in range(3):
                client.step()
            client.send_text(json.dumps({"type": "step", "data": {"sleep_s": 0.6}}))
            assert client.reply()["data"]["code"] == "TIMEOUT"
            time.sleep(0.6)  # the step has returned in its worker by now
            (session,) = env_server(app).manager.sessions().values()
            assert session.step_count == 3
        finally:
            client.close()
