"""Sandboxed execution of untrusted code: every call runs in a fresh sandbox.

:func:`run_python` and :func:`run_shell` start a bubblewrap sandbox (see
:mod:`openenv.core.containers.runtime.isolation`): no network unless asked, a read-only system
and Python runtime, a private ``/tmp``, a private working directory ``/workspace`` (holding the
caller's ``files``), a pid namespace, its own unprivileged uid when OpenEnv runs as root, and
resource limits (rlimits, plus a per-sandbox memory/pids cgroup where cgroups are writable), the
strict seccomp filter (:mod:`openenv.core.containers.runtime.seccomp`: no keyrings, ptrace, mounts or
new user namespaces), and of Python only the interpreter's standard library (no site-packages, no
virtual environment, no project directories: ``packages=`` opts in to named ones).

Inside, a small launcher (``_launcher.py``) reads the code and files from a pipe — code never
appears on a command line —, joins a fresh session keyring, sets ``oom_score_adj`` to 1000 (when
memory runs out the kernel kills the agent's code, not the server), drops privileges, sets the
limits and execs the interpreter. When
the code's main process ends, or the wall-clock timeout passes, the sandbox's pid 1 is killed:
the kernel then kills every process left in its pid namespace, forked, backgrounded or
daemonized. The call returns once they are all gone.

These calls block. Environments call them from their synchronous ``step``, which the server
runs in its worker pool, so blocking there is right; from async code use the ``*_async``
variants (a worker thread each).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import selectors
import time
from dataclasses import replace
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from openenv.core.containers.runtime.isolation import IsolationError, Limits, privileged
from openenv.core.env_server.types import CodeExecResult

from . import broker
from .sandbox import (
    WORKSPACE,
    FileContent,
    Isolation,
    LocalSandbox,
    SandboxSpec,
    checked_package_name,
    encode_files,
)

logger = logging.getLogger("openenv.tools")

CODE_LIMITS = Limits(
    memory_mb=512, cpu_seconds=None, max_processes=64, max_open_files=256, max_file_size_mb=64, tmp_size_mb=256
)
"""Default limits for code: 512 MiB of address space per process (and for the whole sandbox where
cgroups allow), 64 processes/threads, 256 open files, 64 MiB per file, 256 MiB for each of
``/tmp`` and ``/workspace``. One-shot calls also get ``cpu_seconds`` = the timeout rounded up,
plus one."""

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
TIMEOUT_EXIT_CODE = 124
_DRAIN_S = 2.0  # how long output may keep arriving once the tree is dead or killed


# --- output ------------------------------------------------------------------------------------


class _Output:
    """The first ``limit`` bytes of a stream, and a count of the bytes after them."""

    def __init__(self, name: str, limit: int) -> None:
        self.name, self.limit = name, limit
        self.data = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[{self.name} truncated: {self.dropped} more bytes not shown (limit {self.limit} bytes)]\n"
        return text


def _append_note(text: str, note: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + note + "\n"


def _timeout_note(timeout_s: float, what: str) -> str:
    return f"[timed out after {timeout_s:g} s: {what} killed, with every process it started]"


_warned_unsandboxed = False


def _check_isolation(isolation: str) -> None:
    global _warned_unsandboxed
    if isolation not in ("sandbox", "none"):
        raise ValueError(f"isolation must be 'sandbox' or 'none', not {isolation!r}")
    if isolation == "none" and not _warned_unsandboxed:
        _warned_unsandboxed = True
        logger.warning(
            "running untrusted code with isolation='none': no sandbox, only rlimits and a timeout "
            "(it can read your files and use the network); use it for development only"
        )


def new_sandbox(spec: SandboxSpec) -> Any:
    """Start ``spec``: here, or, in a sandboxed server that has one, through its broker (the
    server has no privilege, and may not make the namespaces a sandbox needs itself)."""
    if spec.isolation == "sandbox" and not privileged() and broker.available():
        return broker.BrokeredSandbox(spec)
    return LocalSandbox(spec)


# --- moving bytes ------------------------------------------------------------------------------


class _Streams:
    """Reads a sandbox's output pipes and feeds its input pipes, never blocking on any one of them."""

    def __init__(self, sandbox: LocalSandbox) -> None:
        self.sandbox = sandbox
        self.selector = selectors.DefaultSelector()
        self.reading: set = set()
        self._pending: Dict[int, memoryview] = {}
        if sandbox.exit_fd is not None:
            self.selector.register(sandbox.exit_fd, selectors.EVENT_READ, None)

    def read(self, fd: int, sink: Callable[[bytes], None]) -> None:
        os.set_blocking(fd, False)
        self.selector.register(fd, selectors.EVENT_READ, sink)
        self.reading.add(fd)

    def write(self, fd: int, data: bytes, on_done: Optional[Callable[[], None]] = None) -> None:
        """Queue ``data`` for ``fd``; ``on_done`` runs once it is all written (or the reader is gone)."""
        os.set_blocking(fd, False)
        self._pending[fd] = memoryview(data)
        self.selector.register(fd, selectors.EVENT_WRITE, on_done)

    def run(self, deadline: float, until: Callable[[], bool]) -> bool:
        """Move bytes until ``until()`` holds (True) or ``deadline`` passes (False)."""
        polling = self.sandbox.exit_fd is None
        while not until():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for key, _events in self.selector.select(min(remaining, 0.05) if polling else remaining):
                self._handle(key)
            if polling:
                self.sandbox.poll_exit()
        return True

    def drain(self, max_reads: int = 64) -> None:
        """Read what the output pipes hold right now, without waiting."""
        for fd in list(self.reading):
            key = self.selector.get_key(fd)
            for _ in range(max_reads):
                if fd not in self.reading or not self._read(key):
                    break

    def _handle(self, key: selectors.SelectorKey) -> None:
        if key.fd == self.sandbox.exit_fd:
            self.selector.unregister(key.fd)
            self.sandbox.exited = True
        elif key.fd in self._pending:
            self._write(key)
        else:
            self._read(key)

    def _read(self, key: selectors.SelectorKey) -> bool:
        try:
            chunk = os.read(key.fd, 65536)
        except BlockingIOError:
            return False
        if not chunk:
            self.selector.unregister(key.fd)
            self.reading.discard(key.fd)
            return False
        key.data(chunk)
        return True

    def _write(self, key: selectors.SelectorKey) -> None:
        view = self._pending[key.fd]
        try:
            view = view[os.write(key.fd, view[:65536]) :]
        except BlockingIOError:
            return
        except BrokenPipeError:
            view = view[:0]
        self._pending[key.fd] = view
        if not view:
            del self._pending[key.fd]
            self.selector.unregister(key.fd)
            if key.data is not None:
                key.data()

    def close(self) -> None:
        self.selector.close()


# --- one-shot runs -----------------------------------------------------------------------------


def _run(
    spec: SandboxSpec, *, stdin: Union[str, bytes, None], timeout_s: float, max_output_bytes: int
) -> CodeExecResult:
    return _execute(spec, stdin=stdin, timeout_s=timeout_s, max_output_bytes=max_output_bytes)[0]


def _execute(
    spec: SandboxSpec,
    *,
    stdin: Union[str, bytes, None],
    timeout_s: float,
    max_output_bytes: int,
    max_result_bytes: int = 0,
) -> Tuple[CodeExecResult, Optional[bytes]]:
    """Run one sandbox to its end: its result, and (tree mode) what came over the result pipe
    (None when it sent more than ``max_result_bytes``)."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, not {timeout_s}")
    started = time.monotonic()
    sandbox = new_sandbox(replace(spec, stdin=stdin is not None))
    streams = _Streams(sandbox)
    try:
        stdout, stderr = _Output("stdout", max_output_bytes), _Output("stderr", max_output_bytes)
        streams.read(sandbox.stdout, stdout.feed)
        streams.read(sandbox.stderr, stderr.feed)
        result = _Output("result", max_result_bytes)
        if sandbox.result_r is not None:
            streams.read(sandbox.result_r, result.feed)
        if stdin is not None:
            data = stdin.encode() if isinstance(stdin, str) else stdin
            streams.write(sandbox.stdin, data, on_done=sandbox.close_stdin)
        finished = streams.run(started + timeout_s, lambda: sandbox.exited)
        # The main process is done (or out of time): nothing it started may outlive it.
        sandbox.kill()
        streams.run(time.monotonic() + _DRAIN_S, lambda: not streams.reading)
        sent = bytes(result.data) if sandbox.result_r is not None and not result.dropped else None
        if finished:
            error = sandbox.launch_error()
            if error is not None:
                raise IsolationError(f"the sandbox could not start the code: {error} {stderr.text().strip()}".strip())
            return CodeExecResult(stdout=stdout.text(), stderr=stderr.text(), exit_code=sandbox.returncode), sent
        note = _timeout_note(timeout_s, "the code was")
        return (
            CodeExecResult(stdout=stdout.text(), stderr=_append_note(stderr.text(), note), exit_code=TIMEOUT_EXIT_CODE),
            None,
        )
    finally:
        streams.close()
        sandbox.close()


def _one_shot_limits(limits: Optional[Limits], timeout_s: float) -> Limits:
    if limits is not None:
        return limits
    # One second more than the wall clock: the timeout (124), not the CPU limit (SIGKILL, 137),
    # ends a single-threaded loop; code burning several cores at once meets the CPU limit first.
    return replace(CODE_LIMITS, cpu_seconds=math.ceil(timeout_s) + 1)


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    limits: Optional[Limits] = None,
    network: bool = False,
    stdin: Union[str, bytes, None] = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    files: Optional[Mapping[str, FileContent]] = None,
    python: Optional[str] = None,
    isolation: Isolation = "sandbox",
    env: Optional[Mapping[str, str]] = None,
    packages: Sequence[str] = (),
    import_paths: Sequence[str] = (),
) -> CodeExecResult:
    """Run Python ``code`` in a fresh sandbox and return its output and exit status.

    The code runs as a script (``__name__ == "__main__"``) on ``python`` (default: this one), in
    ``/workspace``, which starts with ``files`` (relative name -> text or bytes; modules there are
    importable). In the sandbox it sees that interpreter's binary and standard library only: no
    site-packages, no virtual environment, no installed project's files (answer data stays out of
    reach). ``packages`` names the top-level modules it may import besides (``("numpy",)``: that
    package's directory, read-only under :data:`~openenv.core.tools.sandbox.SITE`; list
    dependencies too); ``import_paths`` adds directories, read-only and on its ``PYTHONPATH``;
    both are ignored without a sandbox, where everything installed is importable. ``stdin`` is fed to it; ``env`` adds environment variables (the place for secrets). ``limits`` default to
    :data:`CODE_LIMITS` with ``cpu_seconds`` = the timeout + 1. ``network=True`` shares the host's
    network. stdout and stderr each keep their first ``max_output_bytes`` bytes, then a marker.

    ``exit_code`` is the code's; ``128 + N`` when signal N killed it (137: SIGKILL, e.g. out of
    memory); 124 after ``timeout_s`` seconds, when the whole process tree is killed and a note is
    appended to stderr. ``isolation="none"`` runs a plain subprocess with the same limits and
    timeout, as this process's user, in a scratch directory (for development, and to show what
    the sandbox prevents); its timeout kills the process group, and the cgroup where cgroups are
    writable. Raises :class:`IsolationError` if the sandbox cannot be set up.
    """
    _check_isolation(isolation)
    spec = SandboxSpec(
        argv=["{python}", "{control}/main.py"],
        isolation=isolation,
        limits=_one_shot_limits(limits, timeout_s),
        network=network,
        python=python,
        script=code,
        script_name="main.py",
        files=encode_files(files),
        env=dict(env or {}),
        packages=_names(packages),
        import_paths=tuple(import_paths),
    )
    return _run(spec, stdin=stdin, timeout_s=timeout_s, max_output_bytes=max_output_bytes)


def _names(packages: Sequence[str]) -> Tuple[str, ...]:
    if isinstance(packages, str):
        raise TypeError(f"packages must be a sequence of module names, not the string {packages!r}")
    return tuple(checked_package_name(name) for name in packages)


def _shell() -> str:
    return "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"


def run_shell(
    command: str,
    *,
    timeout_s: float = 10.0,
    limits: Optional[Limits] = None,
    network: bool = False,
    stdin: Union[str, bytes, None] = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    files: Optional[Mapping[str, FileContent]] = None,
    python: Optional[str] = None,
    isolation: Isolation = "sandbox",
    env: Optional[Mapping[str, str]] = None,
    packages: Sequence[str] = (),
    import_paths: Sequence[str] = (),
) -> CodeExecResult:
    """Run a shell script (bash, else sh) in a fresh sandbox; the contract of :func:`run_python`.

    ``command`` may span lines; it runs in ``/workspace``. ``python`` is only the interpreter the
    sandbox's launcher runs on; the script's own ``python3`` is whatever its PATH finds (the
    system's, whose site directories are hidden too).
    """
    _check_isolation(isolation)
    spec = SandboxSpec(
        argv=[_shell(), "{control}/main.sh"],
        isolation=isolation,
        limits=_one_shot_limits(limits, timeout_s),
        network=network,
        python=python,
        script=command,
        script_name="main.sh",
        files=encode_files(files),
        env=dict(env or {}),
        packages=_names(packages),
        import_paths=tuple(import_paths),
    )
    return _run(spec, stdin=stdin, timeout_s=timeout_s, max_output_bytes=max_output_bytes)


async def run_python_async(code: str, **kwargs: Any) -> CodeExecResult:
    """:func:`run_python` on a worker thread, for async code."""
    return await asyncio.to_thread(run_python, code, **kwargs)


async def run_shell_async(command: str, **kwargs: Any) -> CodeExecResult:
    """:func:`run_shell` on a worker thread, for async code."""
    return await asyncio.to_thread(run_shell, command, **kwargs)


__all__ = [
    "CODE_LIMITS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "TIMEOUT_EXIT_CODE",
    "WORKSPACE",
    "FileContent",
    "Isolation",
    "run_python",
    "run_python_async",
    "run_shell",
    "run_shell_async",
]
