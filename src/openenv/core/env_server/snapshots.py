"""Sealed session snapshots: what ``snapshot`` answers and ``restore`` accepts.

A snapshot is data this server made: the environment's ``snapshot_state()`` in the exact format
of :mod:`.snapshot_data`, compressed, behind a header that says what it is, and signed with the
server's key (HMAC-SHA256 over everything after the signature). Restoring one checks, in this
order and before anything is decoded or loaded: its size against the limit, the signature (a
changed byte, or another key, is refused), then that it was made of the same environment class
at the same ``SNAPSHOT_VERSION``. So a client can hold, save and hand back a snapshot, but it
cannot make one, change one or move one to another environment; and no client bytes are ever
unpickled: the format is JSON.

Servers that must accept each other's snapshots (the processes behind one ``--workers`` URL, the
replicas of a Ray pool, a server restarted) share a key: ``OPENENV_SNAPSHOT_KEY``, or the
``snapshot_key`` setting. Without one, each server draws its own at start, and only it can
restore what it made.

Layout: ``MAGIC``, 32 bytes of signature, 4 bytes of header length (big-endian), the header
(JSON: ``env``, ``class``, ``version``, ``made``, ``size`` of the state's JSON), then the state's
JSON compressed with zlib.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import hmac
import json
import secrets
import struct
import time
import zlib
from typing import Any, Dict, Optional, Tuple

import pydantic

from .exceptions import SnapshotRefusedError, SnapshotUnsupportedError
from .snapshot_data import CorruptSnapshotError, UnsavableError, class_name, decode, encode

MAGIC = b"OPENENV-SNAPSHOT/1\n"
_SIG = 32
_LEN = struct.Struct(">I")
DEFAULT_MAX_SNAPSHOT_BYTES = 16 * 1024 * 1024


class SnapshotSeal:
    """Seals an environment's state into a snapshot and opens one again, with one key."""

    def __init__(
        self, key: Optional[bytes] = None, max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES, env_name: str = ""
    ) -> None:
        self._key = key if key else secrets.token_bytes(32)
        self.max_bytes = max_bytes
        self.env_name = env_name

    def __repr__(self) -> str:  # never the key
        return f"SnapshotSeal(env_name={self.env_name!r}, max_bytes={self.max_bytes})"

    def _sign(self, signed: bytes) -> bytes:
        return hmac.new(self._key, signed, hashlib.sha256).digest()

    def seal(self, env: Any) -> bytes:
        """A snapshot of ``env``'s session (:class:`SnapshotUnsupportedError` when it cannot)."""
        cls = type(env)
        if not getattr(cls, "SUPPORTS_SNAPSHOT", False):
            raise SnapshotUnsupportedError(
                f"{cls.__name__} does not support snapshots (its class does not set SUPPORTS_SNAPSHOT = True; "
                "see Environment.snapshot_state for what it takes)"
            )
        try:
            data = env.snapshot_state()
        except UnsavableError as exc:  # the environment's own refusal: its words are the reason
            raise SnapshotUnsupportedError(f"Cannot snapshot {cls.__name__}: {exc}") from None
        try:
            tree = encode(data)
        except UnsavableError as exc:
            raise SnapshotUnsupportedError(
                f"Cannot snapshot {cls.__name__}: {exc}. Leave it out (SNAPSHOT_EXCLUDE) if the constructor "
                "rebuilds it, or override snapshot_state/restore_state to save what it holds"
            ) from None
        state = json.dumps(tree, separators=(",", ":"), allow_nan=False).encode()
        body = zlib.compress(state, 6)
        header = json.dumps(
            {
                "env": self.env_name,
                "class": class_name(cls),
                "version": int(getattr(cls, "SNAPSHOT_VERSION", 1)),
                "made": time.time(),
                "size": len(state),
            },
            separators=(",", ":"),
        ).encode()
        signed = _LEN.pack(len(header)) + header + body
        size = len(MAGIC) + _SIG + len(signed)
        if size > self.max_bytes:
            raise _too_large(size, self.max_bytes, "made")
        return MAGIC + self._sign(signed) + signed

    def check_size(self, blob: Any) -> None:
        """Refuse what is no snapshot's bytes, or more of them than the limit."""
        if not isinstance(blob, (bytes, bytearray)):
            raise SnapshotRefusedError("malformed", "A snapshot is bytes, as snapshot() returned them")
        if len(blob) > self.max_bytes:
            raise _too_large(len(blob), self.max_bytes, "given")

    def open(self, blob: bytes, env: Any) -> Any:
        """The state in ``blob``, for ``env`` (its class's): :class:`SnapshotRefusedError` unless
        this server's key signed it, of ``env``'s class and version, within the size limit."""
        self.check_size(blob)
        prefix = len(MAGIC) + _SIG
        if not blob.startswith(MAGIC) or len(blob) < prefix + _LEN.size:
            raise SnapshotRefusedError("malformed", "Not an OpenEnv snapshot (it lacks the snapshot header)")
        signed = bytes(blob[prefix:])
        if not hmac.compare_digest(self._sign(signed), bytes(blob[len(MAGIC) : prefix])):
            raise SnapshotRefusedError(
                "forged",
                "The snapshot's signature does not match: it was changed, or made by a server with another "
                "key (servers that restore each other's snapshots share OPENENV_SNAPSHOT_KEY); nothing was loaded",
            )
        header, body = _split(signed)
        cls = type(env)
        if header.get("class") != class_name(cls):
            raise SnapshotRefusedError(
                "environment",
                f"The snapshot is of {header.get('class')} ({header.get('env') or 'unnamed'}); this session runs "
                f"{class_name(cls)}: restore it on a server of that environment",
            )
        version = int(getattr(cls, "SNAPSHOT_VERSION", 1))
        if header.get("version") != version:
            raise SnapshotRefusedError(
                "version",
                f"The snapshot was made by {cls.__name__} at SNAPSHOT_VERSION {header.get('version')}; this "
                f"server's is {version}: restore it where that version runs",
            )
        size = header.get("size")
        inflate = zlib.decompressobj()
        try:
            state = inflate.decompress(body, (size or 0) + 1)
            tree = json.loads(state) if isinstance(size, int) and len(state) == size and inflate.eof else None
        except (zlib.error, ValueError):
            tree = None
        if tree is None:
            raise SnapshotRefusedError("malformed", "The snapshot's data does not match its header")
        try:
            return decode(tree)
        except CorruptSnapshotError as exc:
            raise SnapshotRefusedError("malformed", f"The snapshot does not load here: {exc}") from None

    def restore(self, env: Any, blob: bytes) -> Any:
        """Open ``blob`` and load it into ``env``; returns ``env.state``. Raises
        :class:`SnapshotRefusedError` before anything is loaded, :class:`RestoreFailedError`
        when the environment's ``restore_state`` fails (the instance is then in no known state)."""
        data = self.open(blob, env)
        try:
            env.restore_state(data)
            state = env.state
            # a copy: the answer may be kept (a numbered call's record) while the session goes on
            return state.model_copy(deep=True) if isinstance(state, pydantic.BaseModel) else copy.deepcopy(state)
        except Exception as exc:
            raise RestoreFailedError(exc) from exc


class RestoreFailedError(RuntimeError):
    """An environment's ``restore_state`` raised (see :meth:`SnapshotSeal.restore`)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"restore_state failed: {type(cause).__name__}: {cause}")


def _split(signed: bytes) -> Tuple[Dict[str, Any], bytes]:
    try:
        (length,) = _LEN.unpack_from(signed, 0)
        header = json.loads(signed[_LEN.size : _LEN.size + length])
    except (struct.error, ValueError):
        header = None
    if not isinstance(header, dict):
        raise SnapshotRefusedError("malformed", "The snapshot's header does not read")
    return header, signed[_LEN.size + length :]


def _too_large(size: int, limit: int, what: str) -> SnapshotRefusedError:
    return SnapshotRefusedError(
        "too_large",
        f"The snapshot {what} is {size} bytes, over this server's limit of {limit} bytes (OPENENV_MAX_SNAPSHOT_MB)",
    )


def snapshot_text(blob: bytes) -> str:
    """A snapshot as the wire carries it (base64)."""
    return base64.b64encode(blob).decode("ascii")


def snapshot_bytes(text: Any) -> bytes:
    """The snapshot in a message's ``snapshot`` field (base64): :class:`SnapshotRefusedError` when
    it is none."""
    if not isinstance(text, str):
        raise SnapshotRefusedError("malformed", "'snapshot' must be a string (base64), as snapshot() gave it")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SnapshotRefusedError("malformed", "'snapshot' is not base64, as snapshot() gave it") from None
