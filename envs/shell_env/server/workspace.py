"""A per-session work directory whose shell commands run in fresh sandboxes.

:func:`openenv.core.tools.run_shell` gives every command a brand-new, empty ``/workspace``. A
shell session needs files that persist from one command to the next, so :class:`Workspace` keeps
them in a directory of the server (``path``) and runs each command with
:func:`openenv.core.tools.run_shell_in_directory`: the directory is copied into the sandbox, the
command runs there, and what it left comes back over a channel that only the sandbox's trusted
launcher holds, is checked (no links leading out, no special files, apparent size within
:data:`MAX_WORKSPACE_BYTES`) and replaces the server's copy.

Files are read, written and listed directly in ``path``, confined to it (symbolic links that
point outside are refused).

:meth:`Workspace.save` and :meth:`Workspace.load` carry the whole directory as one packed tree,
the format commands' copies travel in (:func:`openenv.core.tools.pack_directory`): a session
snapshot holds it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Dict, List, Mapping, Optional

from openenv.core.tools import (
    TIMEOUT_EXIT_CODE,
    WORKSPACE,
    Isolation,
    IsolationError,
    TreeError,
    TreeTooLarge,
    pack_directory,
    run_shell_in_directory,
    unpack_directory,
)

MAX_OUTPUT_BYTES = 16 * 1024
"""What a command's stdout and stderr each keep (the rest is counted and dropped)."""

MAX_WORKSPACE_BYTES = 32 * 1024 * 1024
"""The largest work directory a command may leave behind (apparent size of its files: sparse
files count for their full length)."""

MAX_TIMEOUT_S = 60.0
_MARGIN_S = 15.0  # time for carrying the work directory in and out around the command
_NESTING_HINT = (
    "Commands run in a sandbox nested in the server's: that works when SandboxProvider forks the server "
    "from its zygote (the default when running as root); a server started with warm=False, or by a "
    "non-root user, cannot mount /proc for a nested sandbox. Serve it that way, or in a container with "
    "SHELL_ENV_ISOLATION=none (GIT_ENV_ISOLATION=none for git_env)"
)


class WorkspaceError(ValueError):
    """A path or request the work directory refuses (the message says why)."""


@dataclass
class CommandResult:
    """What a command printed, how it ended, and whether its changes to the files were kept."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    kept_changes: bool = True

    def as_dict(self) -> Dict[str, object]:
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "kept_changes": self.kept_changes,
        }


class Workspace:
    """A private directory of the server, seen by sandboxed shell commands as their working directory.

    ``env`` adds environment variables for the commands; ``isolation`` is passed on to
    :func:`~openenv.core.tools.run_shell` (``"none"`` only where the server is itself confined,
    e.g. in a container). Call :meth:`close` to remove the directory.
    """

    def __init__(self, env: Optional[Mapping[str, str]] = None, isolation: Isolation = "sandbox") -> None:
        self.path = Path(tempfile.mkdtemp(prefix="openenv-workspace-"))
        self.env = dict(env or {})
        self.isolation: Isolation = isolation
        # Removed when closed, collected, or at exit, whichever comes first.
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.path), True)

    # --- files ---------------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The file ``path`` names: relative to the work directory, or absolute under ``/workspace``."""
        if not isinstance(path, str) or "\x00" in path:
            raise WorkspaceError("a path must be a string without NUL characters")
        posix = PurePosixPath(path or ".")
        if posix.is_absolute():
            try:
                posix = posix.relative_to(WORKSPACE)
            except ValueError:
                raise WorkspaceError(
                    f"{path!r} is outside the work directory ({WORKSPACE}); use a relative path"
                ) from None
        root = os.path.realpath(self.path)
        target = os.path.realpath(os.path.join(root, *posix.parts))
        if target != root and not target.startswith(root + os.sep):
            raise WorkspaceError(f"{path!r} leads outside the work directory")
        return Path(target)

    def read_file(self, path: str, max_bytes: int = 64 * 1024) -> str:
        """The text of a file (its first ``max_bytes`` bytes, with a note when it is longer)."""
        target = self.resolve(path)
        if not target.is_file():
            raise WorkspaceError(f"{path!r} is not a file" + ("" if target.exists() else " (it does not exist)"))
        with open(target, "rb") as f:
            data = f.read(max_bytes + 1)
        text = data[:max_bytes].decode("utf-8", errors="replace")
        if len(data) > max_bytes:
            text += f"\n[truncated: the file is longer than {max_bytes} bytes]\n"
        return text

    def write_file(self, path: str, content: str) -> int:
        """Write ``content`` to a file (parents are made); returns the number of bytes written."""
        target = self.resolve(path)
        if target == self.resolve("."):
            raise WorkspaceError("give a file name, not the work directory")
        if target.is_dir():
            raise WorkspaceError(f"{path!r} is a directory")
        data = content.encode()
        if len(data) > MAX_WORKSPACE_BYTES:
            raise WorkspaceError(f"content of {len(data)} bytes is over the {MAX_WORKSPACE_BYTES} byte limit")
        target.parent.mkdir(parents=True, exist_ok=True)
        self.resolve(str(target.relative_to(os.path.realpath(self.path))))  # parents may not be links out
        with open(target, "wb") as f:
            f.write(data)
        return len(data)

    def list_dir(self, path: str = ".") -> List[Dict[str, object]]:
        """The entries of a directory: name, type (file, dir, link, other) and size, sorted by name."""
        target = self.resolve(path)
        if not target.is_dir():
            raise WorkspaceError(f"{path!r} is not a directory" + ("" if target.exists() else " (it does not exist)"))
        entries = []
        for entry in sorted(os.scandir(target), key=lambda e: e.name):
            info = entry.stat(follow_symlinks=False)
            kind = (
                "link"
                if stat.S_ISLNK(info.st_mode)
                else "dir"
                if stat.S_ISDIR(info.st_mode)
                else "file"
                if stat.S_ISREG(info.st_mode)
                else "other"
            )
            entries.append({"name": entry.name, "type": kind, "size": info.st_size})
        return entries

    def populate(self, files: Mapping[str, str], executable: tuple = ()) -> None:
        """Empty the work directory and fill it with ``files`` (relative name -> text)."""
        self.clear()
        for name, content in files.items():
            self.write_file(name, content)
        for name in executable:
            target = self.resolve(name)
            target.chmod(target.stat().st_mode | 0o111)

    def clear(self) -> None:
        for entry in os.scandir(self.path):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)

    def close(self) -> None:
        self._cleanup()

    # --- saving and loading --------------------------------------------------------------------

    def save(self) -> bytes:
        """The work directory as one packed tree: its directories, files (contents, permission
        bits, modification times) and links that stay inside it, read without following a link.
        :class:`WorkspaceError` when it cannot be carried exactly: a link leading out of it or a
        special file (which no sandboxed command can leave, only the server's own code), or more
        than :data:`MAX_WORKSPACE_BYTES`."""
        try:
            return pack_directory(self.path, max_bytes=MAX_WORKSPACE_BYTES)
        except TreeError as exc:  # TreeTooLarge too
            raise WorkspaceError(f"the work directory cannot be saved: {exc}") from None

    def load(self, packed: bytes) -> None:
        """Make the work directory a fresh one holding ``packed`` (what :meth:`save` made); the
        old one is removed. The tree is unpacked under descriptors of the fresh directory, never
        through a link: an entry that would land outside it raises :class:`TreeError`, and the
        fresh directory is removed (the old one stays)."""
        fresh = tempfile.mkdtemp(prefix="openenv-workspace-")
        try:
            unpack_directory(packed, fresh, max_bytes=MAX_WORKSPACE_BYTES)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        old, self.path = self.path, Path(fresh)
        self._cleanup.detach()
        self._cleanup = weakref.finalize(self, shutil.rmtree, fresh, True)
        shutil.rmtree(old, ignore_errors=True)

    # --- commands ------------------------------------------------------------------------------

    def run(self, command: str, timeout_s: float = 10.0, keep_changes: bool = True) -> CommandResult:
        """Run a bash ``command`` in a fresh sandbox on a copy of the work directory.

        The command gets ``timeout_s`` seconds (at most :data:`MAX_TIMEOUT_S`); then it and every
        process it started are killed and ``exit_code`` is 124. With ``keep_changes`` the work directory as the
        command left it replaces the server's (also after a timeout); otherwise it is discarded.
        """
        if not isinstance(command, str):
            raise WorkspaceError("command must be a string")
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise WorkspaceError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}], not {timeout_s}")
        try:
            done = run_shell_in_directory(
                command,
                self.path,
                timeout_s=timeout_s,
                keep_changes=keep_changes,
                max_bytes=MAX_WORKSPACE_BYTES,
                env=self.env,
                isolation=self.isolation,
                max_output_bytes=MAX_OUTPUT_BYTES,
                margin_s=_MARGIN_S,
            )
        except IsolationError as exc:
            raise WorkspaceError(f"{exc}. {_NESTING_HINT}") from None
        except TreeTooLarge as exc:
            raise WorkspaceError(f"{exc}: remove files before running a command") from None
        stderr = done.stderr
        if done.timed_out:
            stderr = _note(stderr, f"[timed out after {timeout_s:g} s: the command was killed]")
        if done.error is not None:
            stderr = _note(stderr, f"[{done.error}: the work directory is unchanged]")
        elif done.skipped:
            names = ", ".join(done.skipped[:10]) + (" ..." if len(done.skipped) > 10 else "")
            stderr = _note(stderr, f"[not kept (links out of the work directory, or special files): {names}]")
        code = TIMEOUT_EXIT_CODE if done.timed_out else done.exit_code
        return CommandResult(done.stdout, stderr, code, timed_out=done.timed_out, kept_changes=done.kept_changes)

    def run_trusted(self, command: str, timeout_s: float = 30.0) -> CommandResult:
        """Run a trusted bash ``command`` (a task's own setup, shipped with the package) directly
        in the work directory, without a sandbox; the environment gets :attr:`env` and no ``HOME``
        configuration. Raises :class:`WorkspaceError` if it fails."""
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": "/nonexistent"}
        env.update({"LANG": "C.UTF-8", "GIT_CONFIG_GLOBAL": "/dev/null", **self.env})
        try:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=self.path,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WorkspaceError(f"setup command failed: {exc}") from None
        if done.returncode != 0:
            raise WorkspaceError(f"setup command failed with exit code {done.returncode}: {done.stderr.strip()}")
        return CommandResult(done.stdout, done.stderr, done.returncode)


def _note(text: str, note: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + note + "\n"
