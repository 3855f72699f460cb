"""The one place that reads websockets' private parser state (its sans-I/O ``Protocol``).

The plain framing of :mod:`..ws_protocol` may read a whole small text frame itself only while
websockets' parser waits for the first byte of a frame. websockets exposes no public way to ask
that, so :func:`between_frames` walks the parser's generator chain (``ServerProtocol.parse`` ->
``Protocol.parse`` -> ``StreamReader.at_eof``) and reads ``conn.current_size`` and
``conn.reader.buffer``. It does so only on the websockets majors CI tests (:data:`TESTED_MAJORS`);
on any other release, or with ``OPENENV_WS_PLAIN_FRAMES=0``, it answers False and every frame
goes through websockets' own parser (slower, never wrong).
"""

from __future__ import annotations

import os
from typing import Any

import websockets
from websockets.streams import StreamReader

TESTED_MAJORS = (15, 16, 17)
_AT_EOF = StreamReader.at_eof.__code__


def enabled() -> bool:
    """Whether the parser state may be read: a tested websockets, and not switched off."""
    if os.environ.get("OPENENV_WS_PLAIN_FRAMES", "1").strip() == "0":
        return False
    try:
        major = int(str(websockets.__version__).split(".")[0])
    except ValueError:
        return False
    return major in TESTED_MAJORS


_ENABLED = enabled()


def parser_readable(conn: Any) -> bool:
    """Whether ``conn`` has the parser state :func:`between_frames` reads."""
    return (
        _ENABLED
        and hasattr(conn.reader, "buffer")
        and hasattr(conn, "current_size")
        and hasattr(conn, "expect_continuation_frame")
        and hasattr(conn, "max_message_size")
        and hasattr(conn.parser, "gi_yieldfrom")
    )


def between_frames(conn: Any) -> bool:
    """Whether websockets' parser of ``conn`` waits for the first byte of a frame: no frame half
    read, no fragmented message under way. (An empty read buffer alone does not say it: the parser
    takes a frame's header, mask and payload out of the buffer as each arrives.) False for any
    parser state it cannot tell."""
    if not _ENABLED or conn.current_size is not None:  # off, or a fragmented message under way
        return False
    generator = getattr(conn, "parser", None)
    for _ in range(4):
        generator = getattr(generator, "gi_yieldfrom", None)
        if generator is None:
            return False
        if getattr(generator, "gi_code", None) is _AT_EOF:
            return not conn.reader.buffer
    return False
