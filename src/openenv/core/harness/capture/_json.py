"""JSON on the proxy's hot path: orjson when installed (``openenv[capture]``), else the standard
library. Each model call decodes the agent's request and the engine's answer (thousands of token
ids) and encodes the engine request, the journal record and the reply: with orjson that is a
fraction of the standard library's time."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - the extra is not installed
    orjson = None  # type: ignore[assignment]


def loads(data: Any) -> Any:
    """Decode JSON text or bytes (``ValueError`` when it is not JSON)."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(str(exc)) from None
    return json.loads(data)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON bytes (orjson writes non-finite floats as null; the standard library,
    asked here not to write them, raises ``ValueError``)."""
    if orjson is not None:
        return orjson.dumps(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
