"""The server's WebSocket protocol (openenv.core.env_server._compat.uvicorn) on a live server: it
serves the runners' WebSockets, stops reading while messages wait for the app (piled-up or large
ones alike) so that TCP backpressure holds, and answers frames in order."""

from __future__ import annotations

import asyncio
import fcntl
import json
import socket
import struct
import termios
import time

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

from openenv.core.env_server._compat import uvicorn as ws_protocol
from openenv.core.env_server._compat.uvicorn import OpenEnvWebSocketProtocol

from .conftest import connect, counter_app, serve, until

# Every test here runs twice: see conftest.compression_offer.
pytestmark = [pytest.mark.usefixtures("compression_offer"), pytest.mark.internals("uvicorn")]


def ws_url(server) -> str:
    return server.base_url.replace("http://", "ws://") + "/ws"


def unread_bytes(protocol) -> int:
    """Bytes the kernel holds for the server's end of the connection that it has not read."""
    sock = protocol.transport.get_extra_info("socket")
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def ws_connections(server) -> list:
    return [c for c in server.server.server_state.connections if isinstance(c, OpenEnvWebSocketProtocol)]


class PauseCounter:
    """Counts the real transport's pause_reading calls of every connection made while installed."""

    def __init__(self, monkeypatch) -> None:
        self.pauses = 0
        original = OpenEnvWebSocketProtocol.connection_made
        counter = self

        def connection_made(protocol, transport) -> None:
            pause = transport.pause_reading

            def counted() -> None:
                counter.pauses += 1
                pause()

            # uvloop transports do not take attributes: wrap the transport the protocol keeps
            protocol_transport = _Counting(transport, counted)
            original(protocol, protocol_transport)

        monkeypatch.setattr(OpenEnvWebSocketProtocol, "connection_made", connection_made)


class _Counting:
    def __init__(self, transport, pause) -> None:
        self._transport = transport
        self.pause_reading = pause

    def __getattr__(self, name):
        return getattr(self._transport, name)


def test_the_runners_serve_websockets_with_openenvs_protocol(counter_server):
    assert issubclass(counter_server.server.config.ws_protocol_class, OpenEnvWebSocketProtocol)


async def test_piled_up_frames_stop_reading_and_are_all_answered_in_order(monkeypatch):
    counter = PauseCounter(monkeypatch)
    frames = 120
    with serve(counter_app()) as server:
        async with connect(ws_url(server), max_queue=None) as ws:
            await ws.send(json.dumps({"type": "reset"}))
            await ws.recv()
            # The first step blocks the session; the rest pile up behind it.
            await ws.send(json.dumps({"type": "step", "data": {"delta": 1, "sleep_s": 0.6}}))
            for _ in range(frames - 1):  # one by one, so that each arrives in a read of its own
                await ws.send(json.dumps({"type": "step", "data": {"delta": 1}}))
                await asyncio.sleep(0.002)
            await asyncio.sleep(0.05)  # time enough to read the rest, if the server were reading
            (protocol,) = ws_connections(server)
            assert protocol.read_paused
            # The server stopped reading with frames still waiting in the kernel's buffer: TCP
            # backpressure, not an ever-growing queue in the server.
            assert unread_bytes(protocol) > 0
            assert protocol.queue.qsize() < frames - 1
            values = [json.loads(await ws.recv())["data"]["observation"]["value"] for _ in range(frames)]
            assert values == list(range(1, frames + 1))
            assert not protocol.read_paused  # reading resumed once the app caught up
    assert counter.pauses >= 1


async def test_a_large_frame_stops_reading_at_once(monkeypatch):
    counter = PauseCounter(monkeypatch)
    with serve(counter_app()) as server:
        async with connect(ws_url(server), max_size=None) as ws:
            await ws.send(json.dumps({"type": "reset"}))
            await ws.recv()
            await ws.send(json.dumps({"type": "step", "data": {"delta": 1, "sleep_s": 0.3}}))
            # A frame too large for the plain path goes through websockets' parser, and pauses too.
            big = json.dumps({"type": "step", "data": {"delta": 1, "pad": "x" * ws_protocol.PLAIN_MAX_BYTES}})
            await ws.send(big)
            (protocol,) = ws_connections(server)
            await until(lambda: counter.pauses >= 1, timeout=3)
            first = json.loads(await ws.recv())
            second = json.loads(await ws.recv())
            assert first["data"]["observation"]["value"] == 1
            # the big frame was read and answered too (CounterAction forbids the unknown field)
            assert second["type"] == "error" and second["data"]["code"] == "VALIDATION_ERROR"
            await ws.send(json.dumps({"type": "step", "data": {"delta": 1}}))
            assert json.loads(await ws.recv())["type"] == "observation"
            assert not protocol.read_paused


async def test_uvicorns_own_protocol_can_still_be_chosen():
    with serve(counter_app(), ws="websockets-sansio") as server:
        assert server.server.config.ws_protocol_class is not OpenEnvWebSocketProtocol
        async with connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"type": "reset"}))
            assert json.loads(await ws.recv())["type"] == "observation"


def test_a_large_frame_after_the_servers_close_does_not_stall_the_close_handshake(counter_server):
    # A raw client (websockets' sans-I/O protocol over a plain socket), because the frame must
    # arrive after the server's close frame and before the client's close reply.
    host, port = counter_server.host, counter_server.port
    client = ClientProtocol(parse_uri(f"ws://{host}:{port}/ws"))
    with socket.create_connection((host, port), timeout=15) as sock:

        def send_pending() -> None:
            sock.sendall(b"".join(client.data_to_send()))

        def next_event():
            while True:
                events = client.events_received()
                if events:
                    return events[0]
                client.receive_data(sock.recv(65536))

        client.send_request(client.connect())
        send_pending()
        next_event()  # the handshake's response
        client.send_text(b'{"type":"close"}')
        send_pending()
        assert next_event().opcode is Opcode.CLOSE  # the server's close frame; our reply waits
        big = Frame(Opcode.TEXT, b"x" * (2 * ws_protocol.PLAIN_MAX_BYTES))
        sock.sendall(big.serialize(mask=True))
        time.sleep(0.2)
        started = time.monotonic()
        send_pending()  # the close reply, which the server must still read
        while sock.recv(65536):
            pass
        # uvicorn would have stopped reading at the big frame and waited 10 s for the reply
        assert time.monotonic() - started < 3


def test_a_uvicorn_release_ci_does_not_test_keeps_its_own_default(monkeypatch):
    import uvicorn

    from openenv.core.env_server.serving.runner import uvicorn_config

    assert ws_protocol.tested()  # the installed uvicorn is a tested one

    monkeypatch.setattr(uvicorn, "__version__", "1.2.0")  # a future release, not yet tested
    assert not ws_protocol.tested()
    config = uvicorn_config(object())
    assert config.ws == "auto" and not issubclass(config.ws_protocol_class, ws_protocol.OpenEnvWebSocketProtocol)
