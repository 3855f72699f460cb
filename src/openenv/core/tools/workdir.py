"""Shell commands on a directory of the host that persists from one command to the next.

:func:`run_shell_in_directory` runs a command in a fresh sandbox (that of :func:`.run_shell`) on a
copy of a host directory, and, if asked, replaces the directory with what the command left. The
copy travels in and out as a packed tree (:mod:`._tree`: a format of our own, no tar), and both
ends are careful: the host packs without following a link, and the tree coming back — untrusted —
is unpacked into a fresh directory under directory descriptors (never through a link; no
absolute or ``..`` names, hard links, devices, fifos or sockets; links must stay inside), with
apparent sizes (sparse files included) counted against ``max_bytes``.

Inside the sandbox the launcher does the carrying: it unpacks the tree into ``/workspace``,
forks the command, waits for it, kills every process left, packs ``/workspace`` and sends the
result over a pipe that only it holds. The command (same uid or, as root, another one) cannot
reach that pipe: the launcher is not dumpable, the command never inherits the pipe, and the
command's stdout and stderr are only ever output text.

:func:`pack_directory` and :func:`unpack_directory` carry such a directory in the same format
on the host (a session snapshot's work directory), as carefully.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Union

from openenv.core.containers.runtime.isolation import Limits

from . import _tree
from ._tree import TreeError, TreeTooLarge
from .executor import (
    DEFAULT_MAX_OUTPUT_BYTES,
    TIMEOUT_EXIT_CODE,
    Isolation,
    _check_isolation,
    _execute,
    _names,
    _one_shot_limits,
    _shell,
)
from .sandbox import SandboxSpec

DEFAULT_MAX_DIRECTORY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_ENTRIES = 100_000
_MAX_REFUSED_NAMES = 100


@dataclass
class DirectoryResult:
    """How a command on a directory ended, and what became of the directory.

    ``kept_changes`` is True when the directory now holds what the command left; otherwise
    ``error`` says why it is unchanged (None when changes were not asked to be kept).
    ``skipped`` names what was left out of the directory (links leading outside it, special
    files) when it was kept."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    kept_changes: bool = False
    error: Optional[str] = None
    skipped: List[str] = field(default_factory=list)


def run_shell_in_directory(
    command: str,
    directory: Union[str, Path],
    *,
    timeout_s: float = 10.0,
    keep_changes: bool = True,
    max_bytes: int = DEFAULT_MAX_DIRECTORY_BYTES,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    limits: Optional[Limits] = None,
    env: Optional[Mapping[str, str]] = None,
    isolation: Isolation = "sandbox",
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    python: Optional[str] = None,
    packages: Sequence[str] = (),
    margin_s: float = 15.0,
) -> DirectoryResult:
    """Run a bash ``command`` in a fresh sandbox whose ``/workspace`` starts as a copy of
    ``directory``; with ``keep_changes``, the directory then becomes what the command left.

    The command gets ``timeout_s`` seconds; then it and every process it started are killed and
    ``exit_code`` is 124 (``timed_out``). The directory is packed and unpacked within
    ``max_bytes`` (apparent sizes) and ``max_entries``: a directory that is already larger
    raises :class:`TreeTooLarge`; one that the command made larger is not kept (``error``).
    ``margin_s`` is the time allowed for carrying the directory in and out. Other arguments are
    those of :func:`.run_shell`. Raises :class:`IsolationError` if the sandbox cannot be set up.
    """
    _check_isolation(isolation)
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, not {timeout_s}")
    root = os.path.realpath(directory)
    packed, _skipped = _tree.pack(root, max_bytes, max_entries)
    spec = SandboxSpec(
        argv=[_shell(), "{control}/main.sh"],
        isolation=isolation,
        limits=_one_shot_limits(limits, timeout_s),
        python=python,
        script=command,
        script_name="main.sh",
        env=dict(env or {}),
        packages=_names(packages),
        tree=packed,
        tree_timeout_s=timeout_s,
        max_tree_bytes=max_bytes,
        max_tree_entries=max_entries,
    )
    del packed
    # Room for the tree's headers and names as well as its contents.
    room = max_bytes + max_entries * 64 + 2 * 1024 * 1024
    raw, sent = _execute(
        spec, stdin=None, timeout_s=timeout_s + margin_s, max_output_bytes=max_output_bytes, max_result_bytes=room
    )
    header, tree = _read_result(sent)
    if header is None:
        error = f"the command's sandbox failed (exit code {raw.exit_code})"
        return DirectoryResult(raw.stdout, raw.stderr, raw.exit_code, error=error if keep_changes else None)
    exit_code = int(header.get("exit_code", 1))
    timed_out = bool(header.get("timed_out"))
    if timed_out:
        exit_code = TIMEOUT_EXIT_CODE
    result = DirectoryResult(raw.stdout, raw.stderr, exit_code, timed_out=timed_out)
    if not keep_changes:
        return result
    if header.get("error"):
        result.error = str(header["error"])
        return result
    try:
        _replace(root, tree, max_bytes, max_entries)
    except (TreeError, OSError) as exc:
        result.error = f"the work directory the command left was refused ({exc})"
        return result
    result.kept_changes = True
    result.skipped = [str(name) for name in header.get("refused", [])][:_MAX_REFUSED_NAMES]
    return result


def pack_directory(
    directory: Union[str, Path],
    *,
    max_bytes: int = DEFAULT_MAX_DIRECTORY_BYTES,
    max_entries: int = DEFAULT_MAX_ENTRIES,
) -> bytes:
    """``directory`` as one packed tree, the format work directories travel in (:mod:`._tree`):
    its directories, regular files (contents, permission bits, modification times) and the
    symbolic links that stay inside it (as links), read without ever following a link.

    What that format cannot carry (a link leading out of the directory, a device, fifo or socket)
    is not left out silently, as a copy without it would not be the same directory:
    :class:`TreeError` names it. :class:`TreeTooLarge` past ``max_bytes`` (apparent sizes) or
    ``max_entries``, before what is over is read."""
    packed, skipped = _tree.pack(os.path.realpath(directory), max_bytes, max_entries)
    if skipped:
        names = ", ".join(repr(name) for name in skipped[:10]) + (" ..." if len(skipped) > 10 else "")
        raise TreeError(
            f"the directory holds what a packed tree does not carry (links leading out of it, devices, fifos or sockets): {names}"
        )
    return packed


def unpack_directory(
    data: bytes,
    directory: Union[str, Path],
    *,
    max_bytes: int = DEFAULT_MAX_DIRECTORY_BYTES,
    max_entries: int = DEFAULT_MAX_ENTRIES,
) -> None:
    """Create the tree ``data`` holds (what :func:`pack_directory` made) in the empty directory
    ``directory``. Every entry is made under a descriptor of its parent, which the tree itself
    made: no absolute or ``..`` names, nothing under a link, links must stay inside, apparent
    sizes within ``max_bytes``; anything else raises :class:`TreeError` before it is written
    (what came before it may be: unpack into a fresh directory, removed on failure)."""
    _tree.unpack(data, str(directory), max_bytes, max_entries)


def _read_result(sent: Optional[bytes]) -> tuple:
    """The launcher's header and packed tree, or (None, b"") when nothing usable came."""
    if sent is None or len(sent) < 4:
        return None, b""
    (length,) = struct.unpack_from(">I", sent)
    try:
        header = json.loads(sent[4 : 4 + length])
    except ValueError:
        return None, b""
    if not isinstance(header, dict) or len(sent) < 4 + length:
        return None, b""
    return header, sent[4 + length :]


def _replace(root: str, tree: bytes, max_bytes: int, max_entries: int) -> None:
    """Unpack ``tree`` into a fresh directory beside ``root``, then swap it in (the old one goes)."""
    parent = os.path.dirname(root)
    fresh = tempfile.mkdtemp(prefix=".openenv-tree-", dir=parent)
    try:
        _tree.unpack(tree, fresh, max_bytes, max_entries)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    os.chmod(fresh, 0o700)
    old = root + ".old"
    shutil.rmtree(old, ignore_errors=True)
    os.rename(root, old)
    os.rename(fresh, root)
    shutil.rmtree(old, ignore_errors=True)


__all__ = [
    "DEFAULT_MAX_DIRECTORY_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "DirectoryResult",
    "TreeError",
    "TreeTooLarge",
    "pack_directory",
    "run_shell_in_directory",
    "unpack_directory",
]
