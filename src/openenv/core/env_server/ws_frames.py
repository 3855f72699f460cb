"""WebSocket text frames built and read without websockets' frame machinery, for the common case.

A request/response client's messages are small text frames, each arriving whole in one read. For
those, building the server's answer frame (unmasked, unfragmented) and reading the client's
(masked, unfragmented) directly costs a fraction of the general parser's work. Anything else is
left to websockets' own parser: these functions answer None for it.
"""

from __future__ import annotations

import struct
from typing import Optional

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - the C speed-up is not built for this platform
    from websockets.utils import apply_mask

_TEXT_FIN = 0x81  # FIN, no RSV bits, opcode 1 (text)


def text_frame(text: str) -> bytes:
    """A server's WebSocket text frame (unmasked, unfragmented) carrying ``text``."""
    payload = text.encode()
    size = len(payload)
    if size < 126:
        return bytes((_TEXT_FIN, size)) + payload
    if size < 65536:
        return struct.pack("!BBH", _TEXT_FIN, 126, size) + payload
    return struct.pack("!BBQ", _TEXT_FIN, 127, size) + payload


def client_text(data: bytes, max_chars: int) -> Optional[str]:
    """The text of ``data`` when it is exactly one complete, unfragmented, masked client text
    frame of at most ``max_chars`` characters; else None (websockets' parser reads it then)."""
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
    if size != start + 4 + length:
        return None
    try:
        text = apply_mask(data[start + 4 :], data[start : start + 4]).decode()
    except UnicodeDecodeError:
        return None
    return text if len(text) <= max_chars else None
