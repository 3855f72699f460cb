"""A persistent sandboxed Python interpreter per session, for REPL-style environments.

One :class:`PythonREPL` owns one long-lived worker process in its own sandbox (the sandbox of
:mod:`.executor`: same isolation, limits, uid dropping and tree killing). Calls talk to it over
two pipes with JSON lines (``{"code": ...}`` in, ``{"exit_code": N}`` out); what a cell prints
arrives on the worker's own stdout and stderr pipes.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import threading
import time
import weakref
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from openenv.core.containers.runtime.isolation import IsolationError, Limits
from openenv.core.env_server.types import CodeExecResult

from .executor import (
    CODE_LIMITS,
    DEFAULT_MAX_OUTPUT_BYTES,
    TIMEOUT_EXIT_CODE,
    FileContent,
    Isolation,
    _append_note,
    _check_isolation,
    _names,
    _Output,
    _Streams,
    _timeout_note,
    new_sandbox,
)
from .sandbox import LocalSandbox, SandboxSpec, encode_files

REPL_LIMITS = replace(CODE_LIMITS, cpu_seconds=None)
"""Default limits of a REPL's worker: :data:`CODE_LIMITS` without a CPU-time limit (the worker
lives across calls; each call is bounded by its timeout instead)."""

_MAX_REPLY_BYTES = 1 << 20


class _Capture:
    """What the worker sends: the current call's output and the reply bytes.

    The pipes' callbacks hold this, not the REPL, so an unclosed REPL can still be collected
    (and its worker killed by the finalizer)."""

    def __init__(self, max_output_bytes: int) -> None:
        self.max_output_bytes = max_output_bytes
        self.reply = bytearray()
        self.new_call()

    def new_call(self) -> None:
        self.stdout = _Output("stdout", self.max_output_bytes)
        self.stderr = _Output("stderr", self.max_output_bytes)

    def has_reply(self) -> bool:
        return b"\n" in self.reply or len(self.reply) > _MAX_REPLY_BYTES

    def next_reply(self) -> Optional[dict]:
        end = self.reply.find(b"\n")
        if end < 0:
            return None
        line = bytes(self.reply[:end])
        del self.reply[: end + 1]
        try:
            message = json.loads(line)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None


class PythonREPL:
    """A sandboxed Python interpreter that keeps its globals between :meth:`execute` calls.

    Each cell runs like one entry at the interactive prompt: the value of a final expression
    statement is echoed to stdout as its ``repr`` (through :func:`sys.displayhook`; ``None`` is
    not echoed); an uncaught exception prints its traceback to stderr and gives exit code 1; a
    ``SystemExit`` gives its code and keeps the interpreter. Files, imports and background
    processes persist too, in the worker's sandbox (``/workspace`` is the working directory).

    The worker sees the standard library only, besides ``packages`` and ``import_paths`` (as
    in :func:`~openenv.core.tools.run_python`). The worker starts on the first call. When a call times out (exit code 124) or the worker
    dies (e.g. killed for memory: exit code 137), the worker is killed with every process it
    started; the next call starts a fresh one, with empty globals, and says so on its stderr.
    :meth:`reset` does the same on purpose, silently.

    Calls block and are serialised (a lock): call them from an environment's synchronous
    ``step`` (the server runs it in a worker thread), or await :meth:`execute_async`. Close the
    REPL (or use it as a context manager) to end the worker; it is also killed when the object
    is garbage collected or the program exits.
    """

    def __init__(
        self,
        *,
        limits: Optional[Limits] = None,
        network: bool = False,
        files: Optional[Mapping[str, FileContent]] = None,
        python: Optional[str] = None,
        isolation: Isolation = "sandbox",
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        env: Optional[Mapping[str, str]] = None,
        start_timeout_s: float = 30.0,
        packages: Sequence[str] = (),
        import_paths: Sequence[str] = (),
    ) -> None:
        _check_isolation(isolation)
        self._spec = SandboxSpec(
            argv=["{python}", "{worker}", "{request}", "{reply}"],
            isolation=isolation,
            limits=limits or REPL_LIMITS,
            network=network,
            python=python,
            files=encode_files(files),
            env=dict(env or {}),
            channels=True,
            packages=_names(packages),
            import_paths=tuple(import_paths),
        )
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._sandbox: Optional[LocalSandbox] = None
        self._streams: Optional[_Streams] = None
        self._finalizer: Optional[weakref.finalize] = None
        self._capture = _Capture(max_output_bytes)
        self._lost: Optional[str] = None  # why the previous worker was killed, for the next call
        self._closed = False
        self._idle: Tuple[int, int] = (0, 0)  # the worker's process tree right after its start

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """A worker is up (it starts on the first call, and after a timeout, a death or a reset)."""
        return self._sandbox is not None

    def _start(self) -> None:
        sandbox = new_sandbox(self._spec)
        streams = _Streams(sandbox)
        self._sandbox, self._streams = sandbox, streams
        self._finalizer = weakref.finalize(self, _shutdown, sandbox, streams)
        capture = self._capture
        capture.reply.clear()
        capture.new_call()
        streams.read(sandbox.stdout, lambda chunk: capture.stdout.feed(chunk))
        streams.read(sandbox.stderr, lambda chunk: capture.stderr.feed(chunk))
        assert sandbox.reply_r is not None
        streams.read(sandbox.reply_r, capture.reply.extend)
        ready = streams.run(time.monotonic() + self.start_timeout_s, lambda: capture.has_reply() or sandbox.exited)
        if ready and capture.next_reply() == {"ready": True}:
            proc = getattr(sandbox, "proc", None)  # (a run through the sandbox broker has none here)
            self._idle = _process_tree(proc.pid) if proc is not None else (0, 0)
            return
        exited = sandbox.exited
        self._kill_and_drain()
        if not exited:
            error = f"no answer within {self.start_timeout_s:g} s"
        else:
            error = sandbox.launch_error() or f"it exited with code {sandbox.returncode}"
        self._stop()
        detail = capture.stderr.text().strip()
        raise IsolationError(f"the REPL worker did not start: {error}" + (f": {detail}" if detail else ""))

    def _stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # kills the tree, once
        self._sandbox = self._streams = self._finalizer = None

    def reset(self) -> None:
        """End the worker; the next call starts a fresh one (empty globals, fresh ``files``)."""
        with self._lock:
            self._stop()
            self._lost = None

    def close(self) -> None:
        """End the worker for good; later calls raise ``RuntimeError``."""
        with self._lock:
            self._stop()
            self._closed = True

    def __enter__(self) -> PythonREPL:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def background(self) -> Optional[str]:
        """What the worker does besides answering calls, in words, or None when it does nothing
        (or no worker runs): processes or threads the cells started that still run, output of
        theirs not yet read, or the worker's own exit since the last call. It only looks (from
        outside, in ``/proc``): no cell runs, nothing is read, the next call is unchanged."""
        with self._lock:
            sandbox = self._sandbox
            if self._closed or sandbox is None:
                return None
            proc = getattr(sandbox, "proc", None)
            if proc is None:  # run by the sandbox broker: its processes are not in this server's /proc
                return "its processes cannot be seen from this server (the worker runs through the sandbox broker)"
            if sandbox.poll_exit():
                return "the worker has exited since the last call (the next call starts a fresh one)"
            waiting, _, _ = select.select([sandbox.stdout, sandbox.stderr], [], [], 0)
            if waiting:
                return "output of work running in the background is waiting to be read"
            processes, threads = _process_tree(proc.pid)
            idle_processes, idle_threads = self._idle
            if not idle_processes:
                return "its processes cannot be seen in /proc here"
            if (processes, threads) != self._idle:
                return (
                    f"the cells left work running: {processes - idle_processes} process(es) and "
                    f"{threads - processes - idle_threads + idle_processes} thread(s) more than the idle worker's"
                )
            return None

    # --- calls -------------------------------------------------------------------------------

    def execute(self, code: str, timeout_s: float = 10.0) -> CodeExecResult:
        """Run ``code`` in the persistent namespace; the output and exit code of this call.

        ``timeout_s`` bounds this call's wall-clock time (the worker's start-up is not counted).
        stdout and stderr each keep their first ``max_output_bytes`` bytes, then a marker.
        """
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        with self._lock:
            if self._closed:
                raise RuntimeError("this PythonREPL is closed")
            notes: List[str] = []
            if self._sandbox is not None and self._sandbox.poll_exit():  # died since the last call
                self._kill_and_drain()
                self._lost = f"the previous worker died (exit code {self._sandbox.returncode})"
                self._stop()
            if self._sandbox is None:
                if self._lost is not None:
                    notes.append(
                        f"[a fresh REPL worker was started because {self._lost}: variables, imports and "
                        "files from earlier calls are gone]"
                    )
                    self._lost = None
                self._start()
            return self._execute(code, timeout_s, notes)

    async def execute_async(self, code: str, timeout_s: float = 10.0) -> CodeExecResult:
        """:meth:`execute` on a worker thread, for async code."""
        return await asyncio.to_thread(self.execute, code, timeout_s)

    def _execute(self, code: str, timeout_s: float, notes: List[str]) -> CodeExecResult:
        return self._exchange({"code": code}, timeout_s, notes)[1]

    def exchange(
        self, request: Dict[str, Any], timeout_s: float, on_call: Callable[[Dict[str, Any]], Dict[str, Any]]
    ) -> Tuple[Optional[Dict[str, Any]], CodeExecResult]:
        """Send the worker one request and answer the ``{"call": ...}`` messages it sends meanwhile
        with ``on_call``; its final answer (None when there is none: timeout, death, protocol
        break) and the call's output. For :mod:`.code_mode`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this PythonREPL is closed")
            if self._sandbox is None:
                self._start()
            return self._exchange(request, timeout_s, [], on_call)

    def _exchange(
        self,
        request: Dict[str, Any],
        timeout_s: float,
        notes: List[str],
        on_call: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
    ) -> Tuple[Optional[Dict[str, Any]], CodeExecResult]:
        sandbox, streams = self._sandbox, self._streams
        assert sandbox is not None and streams is not None and sandbox.request_w is not None
        capture = self._capture
        capture.new_call()
        streams.drain()  # output of background work since the last call belongs to this one
        deadline = time.monotonic() + timeout_s
        message: Dict[str, Any] = request
        while True:
            streams.write(sandbox.request_w, json.dumps(message).encode() + b"\n")
            answered = streams.run(deadline, lambda: capture.has_reply() or sandbox.exited)
            reply = capture.next_reply() if answered else None
            if reply is None or on_call is None or "call" not in reply:
                break
            message = on_call(reply)
        if reply is not None and isinstance(reply.get("exit_code"), int):
            streams.drain()  # the cell's output was in the pipes before its reply
            return reply, self._result(notes, reply["exit_code"])
        died = sandbox.exited
        self._kill_and_drain()
        if not answered:
            exit_code, self._lost = TIMEOUT_EXIT_CODE, "the previous call timed out"
            note = _timeout_note(timeout_s, "the REPL worker was")
        elif died:
            exit_code = sandbox.returncode
            self._lost = f"the previous worker died (exit code {exit_code})"
            note = f"[the REPL worker died (exit code {exit_code})]"
        else:
            exit_code, self._lost = 1, "the previous worker broke its protocol"
            note = "[the REPL worker broke its protocol (did the code write to its pipes?) and was killed]"
        self._stop()
        return None, self._result(notes, exit_code, [note, "[its state is lost: the next call starts a fresh worker]"])

    def _kill_and_drain(self) -> None:
        """Kill the worker's tree, then collect what it printed before it died."""
        sandbox, streams = self._sandbox, self._streams
        assert sandbox is not None and streams is not None
        sandbox.kill()
        streams.run(time.monotonic() + 2.0, lambda: not streams.reading)

    def _result(self, notes: List[str], exit_code: int, notes_after: Optional[List[str]] = None) -> CodeExecResult:
        stderr = self._capture.stderr.text()
        if notes:
            stderr = "\n".join(notes) + "\n" + stderr
        for note in notes_after or []:
            stderr = _append_note(stderr, note)
        return CodeExecResult(stdout=self._capture.stdout.text(), stderr=stderr, exit_code=exit_code)


def _process_tree(root: int) -> Tuple[int, int]:
    """``(processes, threads)`` of ``root`` and its descendants, as ``/proc`` shows them (0, 0
    where it shows none of them)."""
    children: Dict[int, List[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0, 0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            parent = int(stat[stat.rindex(b")") + 2 :].split()[1])  # after the command: state, ppid
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(name))
    processes = threads = 0
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            count = len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
        processes += 1
        threads += count
        stack.extend(children.get(pid, ()))
    return processes, threads


def _shutdown(sandbox: LocalSandbox, streams: _Streams) -> None:
    try:
        sandbox.kill()
    finally:
        streams.close()
        sandbox.close()


__all__ = ["REPL_LIMITS", "PythonREPL"]
