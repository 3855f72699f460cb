"""A directory tree as one byte string, packed and unpacked without ever following a link.

Standard library only: the sandbox's launcher imports it too (it packs the work directory a
command left behind, and unpacks the one it is given). The format is this module's own, so that
nothing in it can mean more than it says (no tar: no hard links, devices or absolute names to
filter out). A tree is a sequence of records, parents before their children, then an end record::

    kind (1 byte: d, f or l) | mode (u32) | mtime_ns (i64) | size (u64) | name length (u32)
    | name (relative, '/'-separated) | size bytes (a file's content, a link's target)

Sizes are *apparent* sizes (``st_size``): a sparse file counts for what it would take to read,
and the whole tree for the sum of its files and link targets. Both :func:`pack` and
:func:`unpack` stop at ``max_bytes`` (and ``max_entries``) with :class:`TreeTooLarge`, before
reading or writing what is over.
"""

from __future__ import annotations

import os
import posixpath
import stat
import struct
from typing import List, Optional, Tuple

_HEADER = struct.Struct(">cIqQI")
_END = b"."
_MAX_NAME = 4096
_MAX_COMPONENT = 255
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeError(ValueError):
    """A packed tree that cannot be trusted or applied (the message says why)."""


class TreeTooLarge(TreeError):
    """The tree is over its size or entry limit."""


def link_stays_inside(name: str, target: str) -> bool:
    """Whether the symbolic link ``name`` (relative to the tree's root) names a path inside the
    tree, read lexically: relative, and never climbing above the root."""
    if not target or target.startswith("/") or "\x00" in target or len(target) > _MAX_NAME:
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    return resolved != ".." and not resolved.startswith("../")


def _check_name(name: str) -> List[str]:
    parts = name.split("/")
    if (
        not name
        or len(name) > _MAX_NAME
        or "\x00" in name
        or any(part in ("", ".", "..") or len(part) > _MAX_COMPONENT for part in parts)
    ):
        raise TreeError(f"refused the entry {name!r}: not a plain relative name")
    return parts


class _Budget:
    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.bytes = self.entries = 0

    def take(self, name: str, size: int) -> None:
        self.entries += 1
        self.bytes += size
        if self.entries > self.max_entries:
            raise TreeTooLarge(f"the work directory has more than {self.max_entries} entries")
        if self.bytes > self.max_bytes:
            raise TreeTooLarge(
                f"the work directory grew past {_mib(self.max_bytes)} (apparent size of its files, "
                f"sparse ones included; {name!r} passed it)"
            )


def _mib(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def _record(kind: bytes, mode: int, mtime_ns: int, name: str, payload: bytes) -> bytes:
    encoded = name.encode("utf-8", "surrogateescape")
    return _HEADER.pack(kind, mode & 0o777, mtime_ns, len(payload), len(encoded)) + encoded + payload


# --- packing -----------------------------------------------------------------------------------


def pack(root: str, max_bytes: int, max_entries: int = 100_000) -> Tuple[bytes, List[str]]:
    """The tree under the directory ``root``, and the names left out of it.

    Left out (never followed): symbolic links leaving the tree, and anything that is not a
    directory, a regular file or a link (devices, fifos, sockets). Raises :class:`TreeTooLarge`.
    """
    out = bytearray()
    skipped: List[str] = []
    budget = _Budget(max_bytes, max_entries)
    fd = os.open(root, _OPEN_DIR)
    try:
        _pack_dir(fd, "", out, skipped, budget)
    finally:
        os.close(fd)
    out += _HEADER.pack(_END, 0, 0, 0, 0)
    return bytes(out), skipped


def _pack_dir(dir_fd: int, prefix: str, out: bytearray, skipped: List[str], budget: _Budget) -> None:
    for entry in sorted(os.listdir(dir_fd)):
        name = prefix + entry
        info = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            budget.take(name, 0)
            out += _record(b"d", info.st_mode, info.st_mtime_ns, name, b"")
            child = os.open(entry, _OPEN_DIR, dir_fd=dir_fd)
            try:
                _pack_dir(child, name + "/", out, skipped, budget)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode):
            budget.take(name, info.st_size)  # before reading: a sparse file is refused unread
            out += _record(b"f", info.st_mode, info.st_mtime_ns, name, _read_file(dir_fd, entry, info))
        elif stat.S_ISLNK(info.st_mode):
            target = os.readlink(entry, dir_fd=dir_fd)
            if link_stays_inside(name, target):
                budget.take(name, len(target))
                out += _record(b"l", 0o777, info.st_mtime_ns, name, target.encode("utf-8", "surrogateescape"))
            else:
                skipped.append(name)
        else:
            skipped.append(name)


def _read_file(dir_fd: int, entry: str, info: os.stat_result) -> bytes:
    fd = os.open(entry, _OPEN_FILE, dir_fd=dir_fd)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            raise TreeError(f"{entry!r} changed while the work directory was packed")
        chunks, left = [], info.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise TreeError(f"{entry!r} changed while the work directory was packed")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# --- unpacking ---------------------------------------------------------------------------------


def unpack(data: bytes, root: str, max_bytes: int, max_entries: int = 100_000, uid: Optional[int] = None) -> None:
    """Create the tree ``data`` holds inside the (empty) directory ``root``.

    Every entry is created under a descriptor of its parent, which this tree itself made: names
    must be plain relative paths, no entry may exist twice or sit under a link, links must stay
    inside the tree, and the apparent sizes must stay within ``max_bytes``. Anything else raises
    :class:`TreeError` (part of the tree may then be written: unpack into a fresh directory).
    With ``uid``, entries are given to that user.
    """
    view = memoryview(data)
    offset = 0
    budget = _Budget(max_bytes, max_entries)
    dirs: List[Tuple[str, int]] = []  # (name, mtime_ns), to set once their contents are written
    root_fd = os.open(root, _OPEN_DIR)
    try:
        while True:
            if offset + _HEADER.size > len(view):
                raise TreeError("the packed work directory is cut short")
            kind, mode, mtime_ns, size, name_len = _HEADER.unpack_from(view, offset)
            offset += _HEADER.size
            if kind == _END:
                if offset != len(view):
                    raise TreeError("the packed work directory has data after its end")
                break
            if name_len > _MAX_NAME or offset + name_len + size > len(view):
                raise TreeError("the packed work directory is cut short")
            name = bytes(view[offset : offset + name_len]).decode("utf-8", "surrogateescape")
            offset += name_len
            parts = _check_name(name)
            budget.take(name, size if kind != b"d" else 0)
            payload = view[offset : offset + size]
            offset += size
            parent = _open_parent(root_fd, parts[:-1], name)
            try:
                _create(parent, parts[-1], name, kind, mode, mtime_ns, payload, uid)
            finally:
                if parent != root_fd:
                    os.close(parent)
            if kind == b"d":
                dirs.append((name, mtime_ns))
        for name, mtime_ns in reversed(dirs):
            parts = name.split("/")
            parent = _open_parent(root_fd, parts[:-1], name)
            try:
                os.utime(parts[-1], ns=(mtime_ns, mtime_ns), dir_fd=parent, follow_symlinks=False)
            finally:
                if parent != root_fd:
                    os.close(parent)
    finally:
        os.close(root_fd)


def _open_parent(root_fd: int, parts: List[str], name: str) -> int:
    fd = root_fd
    for part in parts:
        try:
            child = os.open(part, _OPEN_DIR, dir_fd=fd)
        except OSError as exc:
            raise TreeError(f"refused {name!r}: its parent is not a directory of the tree ({exc.strerror})") from None
        finally:
            if fd != root_fd:
                os.close(fd)
        fd = child
    return fd


def _create(
    parent: int, entry: str, name: str, kind: bytes, mode: int, mtime_ns: int, payload: memoryview, uid: Optional[int]
) -> None:
    try:
        if kind == b"d":
            if payload:
                raise TreeError(f"refused the directory {name!r}: it carries data")
            os.mkdir(entry, (mode & 0o777) | 0o700, dir_fd=parent)
        elif kind == b"f":
            fd = os.open(entry, _CREATE_FILE, 0o600, dir_fd=parent)
            try:
                view = payload
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, (mode & 0o777) | 0o600)
                if uid is not None:
                    os.fchown(fd, uid, uid)
            finally:
                os.close(fd)
        elif kind == b"l":
            target = bytes(payload).decode("utf-8", "surrogateescape")
            if not link_stays_inside(name, target):
                raise TreeError(f"refused the link {name!r} -> {target!r}: it leads outside the work directory")
            os.symlink(target, entry, dir_fd=parent)
        else:
            raise TreeError(f"refused {name!r}: entries of kind {kind!r} are not allowed")
        if uid is not None and kind != b"f":
            os.chown(entry, uid, uid, dir_fd=parent, follow_symlinks=False)
        if kind != b"d":
            os.utime(entry, ns=(mtime_ns, mtime_ns), dir_fd=parent, follow_symlinks=False)
    except FileExistsError:
        raise TreeError(f"refused {name!r}: it appears twice") from None
