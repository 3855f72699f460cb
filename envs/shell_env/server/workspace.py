"""A per-session work directory whose shell commands run in fresh sandboxes.

:func:`openenv.core.tools.run_shell` gives every command a brand-new, empty ``/workspace``. A
shell session needs files that persist from one command to the next, so :class:`Workspace` keeps
them in a directory of the server (``path``) and carries them across each sandbox: the directory
goes in as a tar archive, is unpacked in ``/workspace``, the command runs there, and the
directory comes back out as a tar archive that replaces the server's copy. The archive coming
out is untrusted: it is unpacked with tarfile's ``data`` filter (no absolute paths, no links
leaving the directory, no device files) and only if it is under the size limit.

Files are read, written and listed directly in ``path``, confined to it (symbolic links that
point outside are refused).
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Dict, List, Mapping, Optional

from openenv.core.tools import TIMEOUT_EXIT_CODE, WORKSPACE, Isolation, IsolationError, run_shell

MAX_OUTPUT_BYTES = 16 * 1024
"""What a command's stdout and stderr each keep (the rest is counted and dropped)."""

MAX_WORKSPACE_BYTES = 32 * 1024 * 1024
"""The largest work directory a command may leave behind (as a tar archive)."""

MAX_TIMEOUT_S = 60.0
_MARGIN_S = 15.0  # time for unpacking and packing the work directory around the command
_INBOX = ".openenv-inbox"
_KILLED_BY_SIGKILL = 137

# Runs in the sandbox, in the fresh work directory that holds only the inbox (the packed work
# directory and the command). The command's own process group is timed out; then (sandbox only)
# every process it left behind is killed, so that the work directory can be packed in peace.
_WRAPPER = """\
WS=$PWD
T=$(mktemp -d) || exit 90
trap 'rm -rf "$T"' EXIT
mv "$WS/{inbox}" "$T/in" || exit 91
tar -xpf "$T/in/ws.tar" -C "$WS" || exit 92
rm -f "$T/in/ws.tar"
mkdir "$T/res"
timeout -k 1 {timeout} /bin/bash "$T/in/cmd.sh" < /dev/null > "$T/out" 2> "$T/err"
echo $? > "$T/res/code"
{reap}
cd "$WS"
head -c {limit} "$T/out" > "$T/res/stdout"; stat -c %s "$T/out" > "$T/res/stdout_size"
head -c {limit} "$T/err" > "$T/res/stderr"; stat -c %s "$T/err" > "$T/res/stderr_size"
tar -cf "$T/res/ws.tar" . || echo "packing the work directory failed" > "$T/res/pack_error"
if [ "$(stat -c %s "$T/res/ws.tar")" -gt {max_ws} ]; then
  rm -f "$T/res/ws.tar"; echo "the work directory grew past {max_ws_mib} MiB" > "$T/res/pack_error"
fi
tar -cf - -C "$T/res" . | base64 -w0
"""
_NESTING_HINT = (
    "Commands run in a sandbox nested in the server's: that works when SandboxProvider forks the server "
    "from its zygote (the default when running as root); a server started with warm=False, or by a "
    "non-root user, cannot mount /proc for a nested sandbox. Serve it that way, or in a container with "
    "SHELL_ENV_ISOLATION=none (GIT_ENV_ISOLATION=none for git_env)"
)
_REAP = "for _ in 1 2 3 4 5 6 7 8; do kill -9 -1 2>/dev/null || break; done"


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

    # --- commands ------------------------------------------------------------------------------

    def run(self, command: str, timeout_s: float = 10.0, keep_changes: bool = True) -> CommandResult:
        """Run a bash ``command`` in a fresh sandbox on a copy of the work directory.

        The command gets ``timeout_s`` seconds (at most :data:`MAX_TIMEOUT_S`); then its process
        group is killed and ``exit_code`` is 124. With ``keep_changes`` the work directory as the
        command left it replaces the server's (also after a timeout); otherwise it is discarded.
        """
        if not isinstance(command, str):
            raise WorkspaceError("command must be a string")
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise WorkspaceError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}], not {timeout_s}")
        script = _WRAPPER.format(
            inbox=_INBOX,
            timeout=f"{timeout_s:g}",
            reap=_REAP if self.isolation == "sandbox" else "",
            limit=MAX_OUTPUT_BYTES,
            max_ws=MAX_WORKSPACE_BYTES,
            max_ws_mib=MAX_WORKSPACE_BYTES // (1024 * 1024),
        )
        files = {f"{_INBOX}/ws.tar": self._pack(), f"{_INBOX}/cmd.sh": command}
        started = time.monotonic()
        try:
            raw = run_shell(
                script,
                timeout_s=timeout_s + _MARGIN_S,
                files=files,
                isolation=self.isolation,
                env=self.env,
                max_output_bytes=MAX_WORKSPACE_BYTES * 4 // 3 + 8 * MAX_OUTPUT_BYTES,
            )
        except IsolationError as exc:
            raise WorkspaceError(f"{exc}. {_NESTING_HINT}") from None
        elapsed = time.monotonic() - started
        try:
            results = _unpack_results(raw.stdout)
        except (ValueError, tarfile.TarError):
            note = f"[the command's sandbox failed (exit code {raw.exit_code}); the work directory is unchanged]"
            return CommandResult("", (raw.stderr.strip() + "\n" + note).strip(), raw.exit_code, kept_changes=False)
        code = int(results.get("code", b"1").strip() or 1)
        timed_out = code == TIMEOUT_EXIT_CODE or (code == _KILLED_BY_SIGKILL and elapsed >= timeout_s)
        stdout = _text(results, "stdout")
        stderr = _text(results, "stderr")
        if timed_out:
            code = TIMEOUT_EXIT_CODE
            stderr += f"[timed out after {timeout_s:g} s: the command was killed]\n"
        kept = False
        if "pack_error" in results:
            stderr += f"[{results['pack_error'].decode().strip()}: the work directory is unchanged]\n"
        elif keep_changes and "ws.tar" in results:
            refused = self._replace(results["ws.tar"])
            kept = refused is not None
            if refused is None:
                stderr += "[the work directory the command left could not be unpacked: it is unchanged]\n"
            elif refused:
                names = ", ".join(refused[:10]) + (" ..." if len(refused) > 10 else "")
                stderr += f"[not kept (links out of the work directory, or special files): {names}]\n"
        return CommandResult(stdout, stderr, code, timed_out=timed_out, kept_changes=kept)

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

    def _pack(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for entry in sorted(os.listdir(self.path)):
                archive.add(os.path.join(self.path, entry), arcname=entry)
        return buffer.getvalue()

    def _replace(self, data: bytes) -> Optional[List[str]]:
        """Unpack ``data`` as the new work directory; returns the names it refused (None: failed)."""
        fresh = Path(tempfile.mkdtemp(prefix="openenv-workspace-", dir=self.path.parent))
        refused: List[str] = []

        def safe(member: tarfile.TarInfo, dest: str) -> Optional[tarfile.TarInfo]:
            try:
                return tarfile.data_filter(member, dest)
            except tarfile.FilterError:
                refused.append(member.name[2:] if member.name.startswith("./") else member.name)
                return None

        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
                members = [m for m in archive.getmembers() if m.name not in (".", "./", "")]
                archive.extractall(fresh, members=members, filter=safe)
        except (tarfile.TarError, OSError):
            shutil.rmtree(fresh, ignore_errors=True)
            return None
        os.chmod(fresh, 0o700)
        old = self.path.with_name(self.path.name + ".old")
        os.rename(self.path, old)
        os.rename(fresh, self.path)
        shutil.rmtree(old, ignore_errors=True)
        return refused


def _unpack_results(stdout: str) -> Dict[str, bytes]:
    data = base64.b64decode(stdout.strip(), validate=True)
    if not data:
        raise ValueError("no results")
    results: Dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive.getmembers():
            if member.isfile():
                extracted = archive.extractfile(member)
                if extracted is not None:
                    results[PurePosixPath(member.name).name] = extracted.read()
    return results


def _text(results: Dict[str, bytes], name: str) -> str:
    text = results.get(name, b"").decode("utf-8", errors="replace")
    size = int(results.get(f"{name}_size", b"0").strip() or 0)
    if size > MAX_OUTPUT_BYTES:
        if text and not text.endswith("\n"):
            text += "\n"
        text += f"[{name} truncated: {size - MAX_OUTPUT_BYTES} more bytes not shown (limit {MAX_OUTPUT_BYTES} bytes)]\n"
    return text
