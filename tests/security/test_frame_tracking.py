"""The plain-frame path of OpenEnv's WebSocket protocol reads a whole small frame itself only
while websockets' parser is between frames, which it knows from its own tracking of every frame
byte since the handshake. A client that sends frame bytes in the same read as its handshake
(RFC 6455 forbids it: a client waits for the server's answer) might desynchronise the two
parsers, so that bytes websockets counts as another frame's payload are read as a message of
their own. Attacked here on a live server: uvicorn hands the WebSocket protocol the request head
it rebuilt and drops what came after it, so neither parser sees those bytes, the frames that
follow are whole frames to both, and the connection stays in step. (Should a uvicorn release pass
those bytes on, the protocol keeps the plain path off for that connection.)"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any

import pytest

from openenv.core.env_server._compat.uvicorn import OpenEnvWebSocketProtocol

from ..conftest import counter_app, serve

pytestmark = pytest.mark.internals("uvicorn")


def _masked_text_frame(text: bytes, mask: bytes) -> bytes:
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(text))
    return bytes([0x81, 0x80 | len(text)]) + mask + payload


def _attack(server: Any) -> Any:
    """Handshake plus the start of a 200-byte frame in one write; then, in a read of its own, a
    whole small frame holding a reset: to websockets, the first bytes of that frame's payload."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake = (
            f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        start_of_long_frame = bytes([0x81, 0x80 | 126]) + struct.pack("!H", 200) + os.urandom(4)
        sock.sendall(handshake + start_of_long_frame)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 101"), answer[:200]
        received = answer.split(b"\r\n\r\n", 1)[1]
        time.sleep(0.2)  # the session is open; the smuggled frame arrives in a read of its own
        sock.sendall(_masked_text_frame(b'{"type":"reset","data":{}}', os.urandom(4)))
        sock.settimeout(2.0)
        received += _until(sock, b'"observation"')
        sock.sendall(_masked_text_frame(b'{"type":"step","data":{"delta":1}}', os.urandom(4)))
        received += _until(sock, b'"value":1')
        protocols = _protocols(server)
        return received, protocols


def _until(sock: socket.socket, marker: bytes) -> bytes:
    got = b""
    try:
        while marker not in got:
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
    except TimeoutError:
        pass
    return got


def _protocols(server: Any) -> list:
    return [
        getattr(s, "inner", s)
        for s in server.server.server_state.connections
        if isinstance(getattr(s, "inner", s), OpenEnvWebSocketProtocol)
    ]


def test_frame_bytes_sent_with_the_handshake_leave_both_parsers_in_step() -> None:
    with serve(counter_app()) as server:
        received, protocols = _attack(server)
    # the frame after the handshake is a whole frame to websockets too: answering it is right ...
    assert b'"observation"' in received
    # ... and the next frame is read alike by both: it is answered, not taken as payload
    assert b'"value":1' in received
    assert protocols and all(p._between_frames() or p.transport.is_closing() for p in protocols)
