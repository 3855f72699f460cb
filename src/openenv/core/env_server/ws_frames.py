"""WebSocket frames built and read without websockets' frame machinery, for the common case: a
request/response client's messages are small text frames, each arriving whole in one read, and
reading them (masked, unfragmented) and framing the answers (unmasked) directly costs a fraction of
the general parser's work. Anything else is left to websockets' parser: these answer None for it.
"""

from __future__ import annotations

import struct
from typing import Optional, Tuple

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - the C speed-up is not built for this platform
    from websockets.utils import apply_mask

_TEXT_FIN = 0x81  # FIN, no RSV bits, opcode 1 (text)


def frame_header(buf: bytes) -> Optional[Tuple[bool, int, int, int]]:
    """``(fin, opcode, header_length, payload_length)`` of the WebSocket frame header at the start
    of ``buf`` (RFC 6455 section 5.2; a mask key counts in the header), or None while ``buf``
    holds less than the whole header."""
    size = len(buf)
    if size < 2:
        return None
    first, second = buf[0], buf[1]
    length = second & 0x7F
    header = 2
    if length == 126:
        if size < 4:
            return None
        length = (buf[2] << 8) | buf[3]
        header = 4
    elif length == 127:
        if size < 10:
            return None
        length = int.from_bytes(buf[2:10], "big")
        header = 10
    if second & 0x80:
        header += 4
    if size < header:
        return None
    return bool(first & 0x80), first & 0x0F, header, length


def text_frame(text: str) -> bytes:
    """A server's WebSocket text frame (unmasked, unfragmented) carrying ``text``."""
    payload = text.encode()
    size = len(payload)
    if size < 126:
        return bytes((_TEXT_FIN, size)) + payload
    if size < 65536:
        return struct.pack("!BBH", _TEXT_FIN, 126, size) + payload
    return struct.pack("!BBQ", _TEXT_FIN, 127, size) + payload


def client_text(data: bytes, max_chars: int, max_bytes: Optional[int] = None) -> Optional[str]:
    """The text of ``data`` when it is exactly one whole, unfragmented, masked client text frame of
    at most ``max_chars`` characters (and ``max_bytes`` bytes of payload, websockets' ``max_size``),
    else None. Only for where websockets' parser is between frames (see :mod:`._compat.uvicorn`)."""
    size = len(data)
    if size < 6 or data[0] != _TEXT_FIN or not data[1] & 0x80:
        return None
    length = data[1] & 0x7F
    start = 2
    if length == 126:
        if size < 8:
            return None
        length = (data[2] << 8) | data[3]
        start = 4
    elif length == 127:  # 64 KiB or more: never a whole frame in one read
        return None
    if size != start + 4 + length or (max_bytes is not None and length > max_bytes):
        return None
    try:
        text = apply_mask(data[start + 4 :], data[start : start + 4]).decode()
    except UnicodeDecodeError:
        return None
    return text if len(text) <= max_chars else None
