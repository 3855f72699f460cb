"""What changed in a session's work directory since its last reset: the grader's diff.

An environment whose agent works in a directory declares it (``Environment.workspace_dir()``
returns its path; see :mod:`.interfaces`). After each reset (and restore) the session manager
takes a :class:`Tree` of it, in the same call as the reset, under the session's lock: every
entry's type, size, permission bits and SHA-256 (a link's target instead), and the text of small
text files. :func:`diff` compares the directory now with that tree: files added, removed and
modified, and a unified diff of each small text file that changed.

The directory is the agent's to write, so it is read as hostile: walked under descriptors of its
directories (``dir_fd``), every file opened with ``O_NOFOLLOW`` and checked to be a regular
file, a subdirectory entered only when it is one. A symbolic link is reported as a link with its
target (and whether that leads out of the directory), never followed; a special file (a FIFO, a
device) is reported, never opened. Every cost is bounded: a walk takes at most
:data:`MAX_ENTRIES` entries, enters at most :data:`MAX_DEPTH` levels of directories and no
directory of more than :data:`MAX_LISTING` names (past those the answer says ``truncated``, and
what lies past them is compared in neither walk: it is unknown, not added or removed), and hashes
at most :data:`MAX_HASH_BYTES` (files past that are compared by size and modification time:
``unhashed``); text is kept for files of up to :data:`MAX_TEXT_FILE_BYTES`, :data:`MAX_TEXT_BYTES`
in all, and an answer carries at most :data:`MAX_DIFF_CHARS` of diff text (a file left out says
why in ``omitted``). A walk visits names in sorted order, depth first, so two walks stop at
comparable places.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import os
import posixpath
import stat
import time
from typing import Any, Dict, List, Optional, Tuple

from .exceptions import NOT_SUPPORTED, SESSION_CONFLICT, UNSUPPORTED, OpenEnvError

MAX_ENTRIES = 10_000
"""Entries (files, directories, links) one walk looks at; past them the walk stops."""

MAX_DEPTH = 64
"""Directories nested deeper than this are listed, not entered."""

MAX_LISTING = 100_000
"""A directory holding more names than this is listed, not entered (its names are not all read)."""

MAX_HASH_BYTES = 256 * 1024 * 1024
"""Bytes of file content one walk hashes; files past it are compared by size and mtime."""

MAX_TEXT_FILE_BYTES = 64 * 1024
"""The largest file whose text is kept, and diffed."""

MAX_TEXT_BYTES = 2 * 1024 * 1024
"""Text kept by one walk in all (a session's baseline holds it until its next reset)."""

MAX_DIFF_CHARS = 512 * 1024
"""Characters of unified diff in one answer."""

_CHUNK = 1024 * 1024
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_OPEN_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


class NoWorkspaceError(OpenEnvError):
    """``diff`` of an environment that declares no work directory."""

    kind = NOT_SUPPORTED

    def __init__(self, name: str) -> None:
        super().__init__(
            f"{name} declares no workspace: it has no work directory to diff (an environment declares "
            "one by returning its path from workspace_dir(); see docs/roles.md)"
        )


class NoBaselineError(OpenEnvError):
    """``diff`` of a session with nothing to compare with (not reset since its environment was built)."""

    kind = SESSION_CONFLICT

    def __init__(self, why: str) -> None:
        super().__init__(why)


class WorkspaceUnreadableError(OpenEnvError):
    """The work directory could not be walked for a diff (removed, or no longer a directory)."""

    kind = UNSUPPORTED

    def __init__(self, why: str) -> None:
        super().__init__(f"The work directory could not be read for a diff: {why}")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry of a walk: ``type`` (file, dir, link, other), size, permission bits, and the
    file's SHA-256 (None past the hashing budget: then ``mtime_ns`` stands in) or the link's
    target; ``text`` where kept."""

    type: str
    size: int
    mode: int
    digest: Optional[str] = None
    mtime_ns: int = 0
    text: Optional[str] = None

    def describe(self, path: str) -> Dict[str, Any]:
        info: Dict[str, Any] = {"path": path, "type": self.type, "size": self.size, "mode": f"{self.mode:04o}"}
        if self.type == "link":
            info["target"] = self.digest
            info["outside"] = leads_outside(path, self.digest or "")
        return info


@dataclasses.dataclass
class Tree:
    """What one walk of a work directory found: entries by relative path (``/``-separated)."""

    entries: Dict[str, Entry]
    stopped_after: Optional[Tuple[str, ...]] = None
    """Where the walk stopped at :data:`MAX_ENTRIES` (the last path taken, as its parts): it walks
    in the order of these tuples (each directory's names sorted, depth first), so every path
    after it was left unseen."""
    unentered: Tuple[str, ...] = ()
    """Directories listed but not entered (deeper than :data:`MAX_DEPTH`, or holding more than
    :data:`MAX_LISTING` names): what is under them was left unseen."""
    unhashed: bool = False
    """Some files were past :data:`MAX_HASH_BYTES`: compared by size and modification time."""
    since: str = "reset"
    taken_at: float = dataclasses.field(default_factory=time.time)

    @property
    def truncated(self) -> bool:
        """Part of the directory was left unseen."""
        return self.stopped_after is not None or bool(self.unentered)

    def saw(self, path: str) -> bool:
        """Whether ``path`` lies where this walk looked (its absence then means it was not there)."""
        if self.stopped_after is not None and tuple(path.split("/")) > self.stopped_after:
            return False
        # ("" is the top directory itself, when it holds too many names)
        return not any(not directory or path.startswith(directory + "/") for directory in self.unentered)


@dataclasses.dataclass(frozen=True)
class Unavailable:
    """No baseline could be taken (the reason is the diff's answer)."""

    why: str


def leads_outside(path: str, target: str) -> bool:
    """Whether a link at ``path`` (relative to the work directory) pointing at ``target`` leads
    out of it, read as text (absolute, or climbing above the top with ``..``): never resolved."""
    if target.startswith("/"):
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return joined == ".." or joined.startswith("../")


def walk(root: Any) -> Tree:
    """The :class:`Tree` of the directory ``root`` (see the module docstring). ``root`` itself
    must be a directory, not a link to one (:class:`OSError` otherwise)."""
    budget = _Budget()
    entries: Dict[str, Entry] = {}
    top = os.open(os.fspath(root), _OPEN_DIR)
    try:
        stopped = _walk_dir(top, "", entries, budget)
    finally:
        os.close(top)
    last = tuple(next(reversed(entries)).split("/")) if stopped and entries else () if stopped else None
    return Tree(entries, stopped_after=last, unentered=tuple(budget.unentered), unhashed=budget.unhashed)


def baseline(root: Any, since: str = "reset") -> Any:
    """A :class:`Tree` of ``root`` to compare with later, or :class:`Unavailable` saying why
    there is none (no directory declared, or one that cannot be read)."""
    if root is None:
        return Unavailable(f"this environment returned no workspace directory at its {since}")
    try:
        tree = walk(root)
    except OSError as exc:
        return Unavailable(f"the work directory could not be read at the {since}: {exc.strerror or exc}")
    except Exception as exc:  # (a root that is no path, say)
        return Unavailable(f"the work directory could not be read at the {since}: {type(exc).__name__}: {exc}")
    tree.since = since
    return tree


def baseline_of(env: Any, since: str) -> Any:
    """The baseline of ``env``'s declared work directory (``workspace_dir()``) right after its
    ``since`` (``reset`` or ``restore``): a :class:`Tree`, or :class:`Unavailable`. Runs on the
    environment's thread, in the call that reset it; never raises."""
    try:
        root = env.workspace_dir()
    except Exception as exc:
        return Unavailable(f"workspace_dir() raised {type(exc).__name__} at the {since}: {exc}")
    return baseline(root, since)


def diff(root: Any, before: Tree) -> Dict[str, Any]:
    """What changed in ``root`` since ``before`` was taken: ``added``, ``removed`` and
    ``modified`` entries (``path``, ``type``, ``size``, ``mode``; a link's ``target`` and
    ``outside``; a modified one's ``changes`` and ``before``), ``diffs`` (path: unified diff of
    a small text file), ``omitted`` (path: why its text diff is left out), ``since`` (``reset``
    or ``restore``), ``baseline_time``, ``truncated`` (a walk left part of the directory unseen:
    past :data:`MAX_ENTRIES`, under directories it did not enter; what lies there is compared in
    neither) and ``unhashed`` (some files compared by size and modification time only)."""
    try:
        now = walk(root)
    except OSError as exc:
        raise WorkspaceUnreadableError(exc.strerror or str(exc)) from None
    added: List[Dict[str, Any]] = []
    removed: List[Dict[str, Any]] = []
    modified: List[Dict[str, Any]] = []
    texts = _Texts()
    for path in sorted(before.entries.keys() | now.entries.keys()):
        if not (before.saw(path) and now.saw(path)):
            continue  # past where one of the walks stopped: unknown, not added or removed
        old, new = before.entries.get(path), now.entries.get(path)
        if old is None:
            assert new is not None
            added.append(new.describe(path))
            texts.add(path, None, new)
        elif new is None:
            removed.append(old.describe(path))
            texts.add(path, old, None)
        else:
            changes = _changes(old, new)
            if changes:
                info = new.describe(path)
                info["changes"] = changes
                info["before"] = {k: v for k, v in old.describe(path).items() if k != "path"}
                modified.append(info)
                if "content" in changes:
                    texts.add(path, old, new)
    return {
        "since": before.since,
        "baseline_time": before.taken_at,
        "added": added,
        "removed": removed,
        "modified": modified,
        "diffs": texts.diffs,
        "omitted": texts.omitted,
        "truncated": before.truncated or now.truncated,
        "unhashed": before.unhashed or now.unhashed,
    }


def _changes(old: Entry, new: Entry) -> List[str]:
    if old.type != new.type:
        return ["type"]
    changes = []
    if old.type == "link":
        if old.digest != new.digest:
            changes.append("target")
    elif old.type == "file":
        if old.digest is not None and new.digest is not None:
            same = old.digest == new.digest
        else:  # one of them past the hashing budget
            same = old.size == new.size and old.mtime_ns == new.mtime_ns
        if not same:
            changes.append("content")
    if old.mode != new.mode:
        changes.append("mode")
    return changes


class _Budget:
    def __init__(self) -> None:
        self.entries = 0
        self.hashed = 0
        self.text = 0
        self.unhashed = False
        self.unentered: List[str] = []


def _walk_dir(fd: int, prefix: str, entries: Dict[str, Entry], budget: _Budget, depth: int = 0) -> bool:
    """Walk the directory open as ``fd``, its names in sorted order, depth first; True when the
    entry budget ran out."""
    with os.scandir(fd) as listing:  # (a huge directory is not read whole: it is left unentered)
        names = sorted(item.name for item in itertools.islice(listing, MAX_LISTING + 1))
    if len(names) > MAX_LISTING:
        budget.unentered.append(prefix.rstrip("/"))
        return False
    for name in names:
        if budget.entries >= MAX_ENTRIES:
            return True
        budget.entries += 1
        path = prefix + name
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISLNK(info.st_mode):
            try:
                target = os.readlink(name, dir_fd=fd)
            except OSError:
                continue
            entries[path] = Entry("link", info.st_size, mode, target, info.st_mtime_ns)
        elif stat.S_ISDIR(info.st_mode):
            entries[path] = Entry("dir", 0, mode)
            if depth >= MAX_DEPTH:
                budget.unentered.append(path)
                continue
            try:
                child = os.open(name, _OPEN_DIR, dir_fd=fd)
            except OSError:
                continue  # replaced (by a link, say) meanwhile: not entered
            try:
                if _walk_dir(child, path + "/", entries, budget, depth + 1):
                    return True
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode):
            entries[path] = _file(fd, name, info, budget)
        else:
            entries[path] = Entry("other", info.st_size, mode)
    return False


def _file(dir_fd: int, name: str, info: os.stat_result, budget: _Budget) -> Entry:
    """A regular file's entry, read through a descriptor opened without following a link (one
    that turned into something else since it was listed is reported as it is now)."""
    mode = stat.S_IMODE(info.st_mode)
    if budget.hashed + info.st_size > MAX_HASH_BYTES:
        budget.unhashed = True
        return Entry("file", info.st_size, mode, None, info.st_mtime_ns)
    try:
        fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
    except OSError:
        return Entry("other", info.st_size, mode)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode):
            return Entry("other", now.st_size, stat.S_IMODE(now.st_mode))
        digest = hashlib.sha256()
        kept = bytearray() if now.st_size <= MAX_TEXT_FILE_BYTES else None
        size = 0
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            size += len(chunk)
            budget.hashed += len(chunk)
            digest.update(chunk)
            if kept is not None:
                kept += chunk
                if len(kept) > MAX_TEXT_FILE_BYTES:  # it grew while being read
                    kept = None
            if budget.hashed > MAX_HASH_BYTES:
                budget.unhashed = True
                return Entry("file", size, mode, None, now.st_mtime_ns)
    except OSError:
        return Entry("other", info.st_size, mode)
    finally:
        os.close(fd)
    text = None
    if kept is not None and budget.text + len(kept) <= MAX_TEXT_BYTES and b"\0" not in kept:
        try:
            text = kept.decode("utf-8")
            budget.text += len(kept)
        except UnicodeDecodeError:
            pass
    return Entry("file", size, mode, digest.hexdigest(), now.st_mtime_ns, text)


class _Texts:
    """The unified diffs of an answer, within :data:`MAX_DIFF_CHARS`."""

    def __init__(self) -> None:
        self.diffs: Dict[str, str] = {}
        self.omitted: Dict[str, str] = {}
        self.chars = 0

    def add(self, path: str, old: Optional[Entry], new: Optional[Entry]) -> None:
        sides = [side for side in (old, new) if side is not None]
        if any(side.type != "file" for side in sides):
            return
        for side in sides:
            if side.text is None:
                self.omitted[path] = _why_no_text(side)
                return
        before = old.text if old is not None else ""
        after = new.text if new is not None else ""
        lines = difflib.unified_diff(
            (before or "").splitlines(keepends=True),
            (after or "").splitlines(keepends=True),
            fromfile="/dev/null" if old is None else f"a/{path}",
            tofile="/dev/null" if new is None else f"b/{path}",
        )
        text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        if self.chars + len(text) > MAX_DIFF_CHARS:
            self.omitted[path] = f"the answer's diff budget ({MAX_DIFF_CHARS} characters) is spent"
            return
        self.chars += len(text)
        self.diffs[path] = text


def _why_no_text(entry: Entry) -> str:
    if entry.size > MAX_TEXT_FILE_BYTES:
        return f"larger than {MAX_TEXT_FILE_BYTES} bytes"
    if entry.digest is None:
        return "not read: the walk's hashing budget was spent"
    return "not text (binary, or not UTF-8), or past the text kept for one walk"
