"""An agent harness as a child process: line I/O over its stdin/stdout, plainly or in a sandbox.

:class:`HarnessProcess` keeps upstream's signature and behaviour: the command runs in a process
group of its own, reader threads collect its stdout lines (for :meth:`~HarnessProcess.read_line`)
and the last lines of its stderr (:meth:`~HarnessProcess.drain_stderr`), ``stop()`` sends SIGTERM
to the group and SIGKILL after a grace period. Plainly, the child gets this process's environment
plus ``env_vars`` and can reach everything this process can.

With ``sandbox=HarnessSandbox(...)`` the same object runs the command in a bubblewrap sandbox built
from the project's own pieces (:mod:`openenv.core.containers.runtime.isolation`: read-only system,
private ``/tmp``, pid/ipc/uts/cgroup namespaces, the strict seccomp filter, rlimits and a cgroup,
its own uid when running as root; and the code sandbox's launcher steps). On top of that:

* the episode's workspace (a host directory) is bound read-write at ``/workspace``; the agent has a
  home of its own (a tmpfs, or a host directory) and sees only the read-only paths it is given
  (``ro_paths``: a ``node_modules`` directory, a virtual environment) besides the system;
* it has a network namespace of its own with loopback only, and reaches exactly the services it is
  given: each is a Unix socket on the host (the capture proxy, the environment's MCP bridge),
  bound into the sandbox and offered to the agent as ``http://127.0.0.1:<port>`` by a small relay
  running inside the sandbox (:mod:`._netrelay`). No host port, host address or other Unix socket
  is reachable, and the host's environment variables never enter the sandbox;
* the sandbox ends with the agent's main process, and ``stop()`` kills every process in it (its
  pid namespace) whatever session or group they moved to.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import resource
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from openenv.core.containers.runtime._linux import descendants as _descendants
from openenv.core.containers.runtime.isolation import Limits

from .errors import HarnessError, HarnessNotRunningError, HarnessStartupError, HarnessTurnTimeoutError

logger = logging.getLogger("openenv.harness")

STDERR_LINES = 50
"""How many of the last stderr lines a harness keeps (for error messages and :meth:`drain_stderr`)."""
MAX_LINE_BYTES = 16 * 1024 * 1024
"""A stdout line longer than this is handed over in pieces of this size (memory stays bounded)."""
MAX_BUFFERED_LINES = 10_000
"""Unread stdout lines kept; beyond that the harness blocks on its next write until one is read."""

HARNESS_LIMITS = Limits(
    memory_mb=4096, cpu_seconds=None, max_processes=512, max_open_files=4096, max_file_size_mb=1024, tmp_size_mb=512
)
"""Default limits of a harness sandbox: agent CLIs (Node programs, Python agents) are bigger than
the code an environment runs, and live for a whole episode (no CPU-time limit)."""

CONTROL_DIR = "/run/openenv"
"""Inside the sandbox: the relay's program and the services' sockets (mode 0700: as root, the agent,
which runs as another uid, cannot even list it)."""
SERVICE_DIR = f"{CONTROL_DIR}/services"
FIRST_PORT = 41001
"""Services without a port of their own get 41001, 41002, ... in the order given (any port is free
in the sandbox's own network namespace, so the numbers are known before it starts)."""

_HERE = Path(__file__).resolve().parent
_NETRELAY = str(_HERE / "_netrelay.py")
_SERVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_KILL_WAIT_S = 5.0

ReadyCheck = Callable[[str], bool]


# --- the sandbox's description -----------------------------------------------------------------


@dataclass(frozen=True)
class HarnessSandbox:
    """Where and with what a sandboxed harness runs.

    ``workspace``: a host directory, bound read-write at ``workspace_path`` (what the agent writes
    there persists on the host). As root the agent runs as a fresh uid of its own, and the
    workspace (and ``home``) are handed to it first (``chown -R``, staying on their filesystem and
    skipping hard-linked files); ``uid`` picks that uid instead.
    ``services``: name -> path of a Unix socket on the host; inside, ``url(name)`` reaches it.
    ``ports``: name -> the loopback port inside (default: :data:`FIRST_PORT` onwards, in order).
    ``home``: a host directory bound read-write at ``home_path`` (an agent's configuration written
    beforehand); ``None``: an empty private tmpfs. ``HOME`` points at ``home_path`` either way.
    ``ro_paths``: host paths shown read-only, each at the same path or as ``(host, inside)``.
    ``path``: directories put before the system's on the agent's ``PATH`` (e.g. ``node_modules/.bin``).
    The system (``/usr``, ``/etc``) is read-only, ``/tmp`` private, and this process's Python
    interpreter (standard library only) is visible: it runs the relay.
    """

    workspace: Union[str, os.PathLike]
    services: Mapping[str, Union[str, os.PathLike]] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)
    workspace_path: str = "/workspace"
    home: Optional[Union[str, os.PathLike]] = None
    home_path: str = "/home/agent"
    ro_paths: Sequence[Union[str, os.PathLike, Tuple[str, str]]] = ()
    path: Sequence[str] = ()
    limits: Limits = HARNESS_LIMITS
    uid: Optional[int] = None
    max_connections: int = 256

    def __post_init__(self) -> None:
        ports: Dict[str, int] = {}
        next_port = FIRST_PORT
        for name in self.services:
            if not isinstance(name, str) or not _SERVICE_NAME.match(name):
                raise ValueError(f"service name {name!r} must be letters, digits, '_', '.' or '-' (at most 64)")
            if name in self.ports:
                ports[name] = int(self.ports[name])
            else:
                while next_port in self.ports.values() or next_port in ports.values():
                    next_port += 1
                ports[name] = next_port
                next_port += 1
        unknown = set(self.ports) - set(self.services)
        if unknown:
            raise ValueError(f"ports given for services that are not: {sorted(unknown)}")
        for name, port in ports.items():
            if not 1024 <= port <= 65535:
                raise ValueError(f"port {port} of service {name!r} must be between 1024 and 65535")
        if len(set(ports.values())) != len(ports):
            raise ValueError(f"two services share a port: {ports}")
        for inside in (self.workspace_path, self.home_path):
            if not inside.startswith("/") or inside.rstrip("/") in ("", "/tmp", CONTROL_DIR, "/proc", "/dev"):
                raise ValueError(f"{inside!r} cannot be a workspace or home path in the sandbox")
        object.__setattr__(self, "ports", ports)

    def port(self, name: str) -> int:
        """The loopback port inside the sandbox that reaches service ``name``."""
        try:
            return self.ports[name]
        except KeyError:
            raise KeyError(f"no service {name!r} (services: {sorted(self.services)})") from None

    def url(self, name: str) -> str:
        """``http://127.0.0.1:<port>``: the base URL of service ``name`` as the agent sees it."""
        return f"http://127.0.0.1:{self.port(name)}"


# --- stdout lines, handed from a reader thread to asyncio --------------------------------------


class _Lines:
    """A bounded queue of stdout lines, filled by a thread and awaited from any event loop.

    The reader thread blocks when it is full (the harness then blocks on its own writes: no line is
    ever dropped). Awaiting uses a future per waiter, woken through its loop, so a cancelled or
    timed-out read leaves no thread behind and takes no line."""

    def __init__(self, limit: int = MAX_BUFFERED_LINES) -> None:
        self._cond = threading.Condition()
        self._items: Deque[str] = collections.deque()
        self._limit = limit
        self._eof = False
        self._closed = False
        self._waiters: Set[Tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()

    def put(self, line: str) -> None:
        with self._cond:
            while len(self._items) >= self._limit and not self._closed:
                self._cond.wait()
            if self._closed:
                return
            self._items.append(line)
            self._wake()

    def end(self) -> None:
        """No more lines will come (end of file)."""
        with self._cond:
            self._eof = True
            self._wake()

    def close(self) -> None:
        """Drop what is left and unblock the reader (the harness is being stopped)."""
        with self._cond:
            self._closed = self._eof = True
            self._items.clear()
            self._cond.notify_all()
            self._wake()

    def _wake(self) -> None:
        for loop, future in self._waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_resolve, future)
        self._waiters.clear()

    async def get(self, timeout_s: Optional[float]) -> Optional[str]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + max(0.0, timeout_s)
        while True:
            with self._cond:
                if self._items:
                    line = self._items.popleft()
                    self._cond.notify_all()
                    return line
                if self._eof:
                    return None
                future = loop.create_future()
                waiter = (loop, future)
                self._waiters.add(waiter)
            try:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return None
                await asyncio.wait_for(future, remaining)
            except asyncio.TimeoutError:
                return None
            finally:
                with self._cond:
                    self._waiters.discard(waiter)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


# --- the process ---------------------------------------------------------------------------------


class HarnessProcess:
    """One agent harness process, talked to line by line (upstream's ``HarnessProcess``).

    ``command`` runs with working directory ``cwd`` (inside the sandbox with ``sandbox=``: default
    the workspace; a host path inside the workspace is translated), in a process group of its own.
    Plainly its environment is this process's plus ``env_vars``; sandboxed it is a clean one
    (``PATH``, ``HOME``, ``LANG``) plus ``env_vars``. Output is decoded as UTF-8 with replacement.
    ``startup_timeout_s`` bounds :meth:`start`; ``terminate_grace_s`` is how long :meth:`stop` waits
    after SIGTERM before SIGKILL.
    """

    def __init__(
        self,
        command: Sequence[str],
        cwd: Optional[Union[str, os.PathLike]],
        env_vars: Optional[Mapping[str, str]] = None,
        startup_timeout_s: float = 30.0,
        terminate_grace_s: float = 5.0,
        *,
        sandbox: Optional[HarnessSandbox] = None,
        stdin: str = "pipe",
    ) -> None:
        if stdin not in ("pipe", "closed"):
            raise ValueError(f"stdin must be 'pipe' or 'closed', not {stdin!r}")
        if isinstance(command, (str, bytes)) or not command or not all(isinstance(p, str) for p in command):
            raise ValueError(f"command must be a non-empty list of strings, not {command!r}")
        self.command: List[str] = list(command)
        self.cwd = os.fspath(cwd) if cwd is not None else None
        self.env_vars: Dict[str, str] = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.startup_timeout_s = float(startup_timeout_s)
        self.terminate_grace_s = float(terminate_grace_s)
        self.sandbox = sandbox
        self.stdin = stdin
        self._proc: Optional[subprocess.Popen] = None
        self._exit_fd: Optional[int] = None  # a pidfd: readable once the process has exited
        self._init_pidfd: Optional[int] = None  # the sandbox's pid 1
        self._init_pid: Optional[int] = None
        self._cgroup: Any = None
        self._lines = _Lines()
        self._stderr: Deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._stderr_lock = threading.Lock()
        self._pipes: Optional[_Pipes] = None
        self._stop_lock = threading.Lock()
        self._spawning = False  # a sandbox is being made on a worker thread
        self._stop_requested = False
        self._returncode: Optional[int] = None

    # --- state -----------------------------------------------------------------------------------

    @property
    def pid(self) -> Optional[int]:
        """The host pid of the process started (``bwrap`` when sandboxed), while there is one."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> Optional[int]:
        """The exit status once the process has exited (-N: killed by signal N; sandboxed, the
        agent's status shell-style, 128+N), else None."""
        if self._returncode is None and self._proc is not None:
            self._returncode = self._peek_exit()
        return self._returncode

    def is_running(self) -> bool:
        return self._proc is not None and self._peek_exit() is None

    def _peek_exit(self) -> Optional[int]:
        """The exit status without reaping (the pid, and the group id, stay ours until stop())."""
        proc = self._proc
        if proc is None:
            return self._returncode
        if proc.returncode is not None:
            return proc.returncode
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return proc.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def pids(self) -> List[int]:
        """Host pids of the process and of every process below it (sandboxed: all of the sandbox's)."""
        if self._proc is None:
            return []
        return [self._proc.pid, *_descendants(self._proc.pid)]

    def drain_stderr(self) -> str:
        """The last stderr lines (at most :data:`STDERR_LINES`) not drained yet, joined; clears them."""
        with self._stderr_lock:
            lines = list(self._stderr)
            self._stderr.clear()
        return "\n".join(lines)

    def _stderr_tail(self) -> str:
        with self._stderr_lock:
            return "\n".join(self._stderr)

    # --- starting --------------------------------------------------------------------------------

    async def start(self, ready_check: Optional[ReadyCheck] = None) -> None:
        """Start the process; with ``ready_check``, wait for a stdout line it accepts.

        Lines read while waiting (the accepted one too) are consumed. Already running, a spawn
        failure (a command not found, say), or an exit or ``startup_timeout_s`` before a line is
        accepted raise :class:`HarnessStartupError`, the process stopped."""
        if self.is_running():
            raise HarnessStartupError(f"harness {self.command[0]!r} is already running (pid {self.pid})")
        if self._proc is not None:
            await self.stop()  # an earlier run that exited: release it first
        self._lines = _Lines()
        with self._stderr_lock:
            self._stderr.clear()
        self._returncode = None
        self._stop_requested = False
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            if self.sandbox is None:
                self._spawn_plain()
            else:
                self._spawning = True
                await asyncio.to_thread(self._spawn_sandboxed_locked, deadline)
        except BaseException:
            await self.stop()
            raise
        if ready_check is None:
            return
        while True:
            line = await self._lines.get(deadline - time.monotonic())
            if line is not None:
                try:
                    ready = bool(ready_check(line))
                except Exception as exc:
                    await self.stop()
                    raise HarnessStartupError(f"the ready check of {self.command[0]!r} failed: {exc!r}") from exc
                if ready:
                    return
                continue
            remaining = deadline - time.monotonic()
            code = await self.wait(min(remaining, 2.0)) if remaining > 0 else self._peek_exit()  # end of output
            await self.stop()
            tail = self._stderr_tail()
            tail = f"; stderr:\n{tail}" if tail else ""
            if code is not None:
                raise HarnessStartupError(
                    f"harness {self.command[0]!r} exited with code {code} before it was ready{tail}"
                )
            raise HarnessStartupError(
                f"harness {self.command[0]!r} was not ready within {self.startup_timeout_s:g} s{tail}"
            )

    def _spawn_plain(self) -> None:
        cwd = self.cwd
        if cwd is not None and not os.path.isdir(cwd):
            raise HarnessStartupError(f"cannot start harness {self.command[0]!r}: no directory {cwd!r}")
        pipes = self._pipes = _Pipes()
        try:
            self._proc = subprocess.Popen(
                self.command, cwd=cwd, env={**os.environ, **self.env_vars}, start_new_session=True, **pipes.child_ends()
            )
        except FileNotFoundError as exc:
            where = "" if "/" in self.command[0] else " on PATH"
            raise HarnessStartupError(
                f"cannot start harness: command {self.command[0]!r} not found{where} ({exc})"
            ) from None
        except OSError as exc:
            raise HarnessStartupError(f"cannot start harness {self.command[0]!r}: {exc}") from None
        self._watch()

    def _watch(self) -> None:
        """Open the exit pidfd and start reading the child's output."""
        assert self._proc is not None and self._pipes is not None
        try:
            self._exit_fd = os.pidfd_open(self._proc.pid)
        except (AttributeError, OSError):
            self._exit_fd = None
        lines = self._lines

        def on_stderr(data: bytes) -> None:
            with self._stderr_lock:
                self._stderr.append(_decode_line(data))

        self._pipes.started(lambda data: lines.put(_decode_line(data)), lines.end, on_stderr, self.command[0])
        if self.stdin == "closed":
            self.close_stdin()

    # --- sandboxed start -------------------------------------------------------------------------

    def _inside_cwd(self) -> str:
        sandbox = self.sandbox
        assert sandbox is not None
        if self.cwd is None:
            return sandbox.workspace_path
        host_workspace = os.path.realpath(sandbox.workspace)
        real = os.path.realpath(self.cwd) if os.path.exists(self.cwd) else self.cwd
        if real == host_workspace or real.startswith(host_workspace + os.sep):
            return sandbox.workspace_path.rstrip("/") + real[len(host_workspace) :]
        return self.cwd

    def _spawn_sandboxed_locked(self, deadline: float) -> None:
        # Holding the stop lock; a stop asked for meanwhile (the start was cancelled: its caller
        # no longer waits for this thread) is carried out here, whatever the outcome.
        with self._stop_lock:
            try:
                if self._stop_requested:
                    raise HarnessStartupError(f"harness {self.command[0]!r} was stopped while starting")
                self._spawn_sandboxed(deadline)
            except BaseException:
                if self._stop_requested:
                    self._teardown()
                raise
            finally:
                self._spawning = False
            if self._stop_requested:
                self._teardown()

    def _spawn_sandboxed(self, deadline: float) -> None:
        # Imported here: the plain harness needs none of the sandbox's machinery.
        from openenv.core.containers.runtime import seccomp
        from openenv.core.containers.runtime.isolation import (
            BwrapCommand,
            IsolationError,
            privileged,
            require_bwrap,
            sandbox_environment,
            sandbox_uid,
        )
        from openenv.core.tools.sandbox import (
            LAUNCHER,
            close_all,
            keyctl_number,
            make_cgroup,
            resolve_interpreter,
            show_interpreter,
            write_all,
        )
        from openenv.core.utils import popen_lasting

        sandbox = self.sandbox
        assert sandbox is not None
        try:
            bwrap = require_bwrap()
        except IsolationError as exc:
            raise HarnessStartupError(str(exc)) from None
        ok, why = seccomp.available()
        if not ok:
            raise HarnessStartupError(why)
        workspace = os.path.realpath(sandbox.workspace)
        if not os.path.isdir(workspace):
            raise HarnessStartupError(f"the harness's workspace {os.fspath(sandbox.workspace)!r} is not a directory")
        home = os.path.realpath(sandbox.home) if sandbox.home is not None else None
        if home is not None and not os.path.isdir(home):
            raise HarnessStartupError(f"the harness's home {os.fspath(sandbox.home or '')!r} is not a directory")
        sockets: Dict[str, str] = {}
        for name, path in sandbox.services.items():
            real = os.path.realpath(path)
            try:
                is_socket = stat.S_ISSOCK(os.stat(real).st_mode)
            except OSError:
                is_socket = False
            if not is_socket:
                raise HarnessStartupError(f"service {name!r}: no Unix socket at {os.fspath(path)!r} (is it running?)")
            sockets[name] = real
        limits = sandbox.limits
        uid = sandbox.uid if sandbox.uid is not None else (sandbox_uid() if privileged() else None)
        if uid is not None:
            _hand_over(workspace, uid)
            if home is not None:
                _hand_over(home, uid)

        python = os.path.realpath(sys.executable)
        try:
            interpreter = resolve_interpreter(python, ())
        except (IsolationError, ValueError) as exc:
            raise HarnessStartupError(f"the sandbox's relay cannot run on {python}: {exc}") from None
        cmd = BwrapCommand(bwrap, network=False, tmp_size_mb=limits.tmp_size_mb)
        cmd.tmpfs(CONTROL_DIR, size_mb=1, perms="0700")
        cmd.ro_bind(LAUNCHER, f"{CONTROL_DIR}/_launcher.py")
        cmd.ro_bind(_NETRELAY, f"{CONTROL_DIR}/netrelay.py")
        show_interpreter(cmd, interpreter, ())
        shown = {interpreter.executable}
        for entry in sandbox.ro_paths:
            source, dest = entry if isinstance(entry, tuple) else (os.fspath(entry), None)  # type: ignore[misc]
            real = os.path.realpath(source)
            if not os.path.exists(real):
                raise HarnessStartupError(f"read-only path {source!r} does not exist")
            cmd.ro_bind(real, dest or os.path.abspath(os.fspath(source)))
            if os.path.isfile(os.path.join(real, "pyvenv.cfg")):
                _show_venv_python(cmd, real, shown)
        cmd.bind(workspace, sandbox.workspace_path)
        if home is not None:
            cmd.bind(home, sandbox.home_path)
        else:
            cmd.tmpfs(sandbox.home_path, size_mb=limits.tmp_size_mb, perms="0700")
        cmd.dir(SERVICE_DIR, perms="0700")
        services = []
        for name, real in sockets.items():
            inside = f"{SERVICE_DIR}/{name}.sock"
            cmd.ro_bind(real, inside)  # connecting needs no write access to the mount
            services.append({"name": name, "port": sandbox.ports[name], "socket": inside})
        cmd.chdir("/")

        child_fds: List[int] = []  # the sandbox's ends: closed here once bwrap has them
        parent_fds: List[int] = []  # ours: closed when the start is over, whichever way
        pipes = self._pipes = _Pipes()
        try:
            self._cgroup = make_cgroup(limits)
            cgroup_fds = []
            for path in self._cgroup.dirs if self._cgroup is not None else []:
                cgroup_fds.append(os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY))
                child_fds.append(cgroup_fds[-1])
            config_r, config_w = os.pipe()
            status_r, status_w = os.pipe()
            info_r, info_w = os.pipe()
            child_fds += [config_r, status_w, info_w]
            parent_fds += [config_w, status_r, info_r]
            cmd.info_fd(info_w)
            try:
                cmd.seccomp("strict")
            except seccomp.SeccompUnavailable as exc:
                raise HarnessStartupError(str(exc)) from None
            child_fds.extend(cmd.pass_fds)
            cmd.pass_fds.clear()
            argv = cmd.command(
                [interpreter.executable, "-I", "-S", f"{CONTROL_DIR}/netrelay.py", str(config_r), str(status_w)]
            )
            path = ":".join([*sandbox.path, "/usr/local/bin:/usr/bin:/bin"])
            env = sandbox_environment({"HOME": sandbox.home_path, "PATH": path, "TMPDIR": "/tmp", **self.env_vars})
            config = {
                "argv": self.command,
                "env": env,
                "cwd": self._inside_cwd(),
                "uid": uid,
                "chown": [sandbox.workspace_path, sandbox.home_path],
                # No address-space limit: Node reserves far more than it uses (WebAssembly's guard
                # regions alone exceed any sensible one); memory is bounded by the cgroup instead.
                "rlimits": [pair for pair in limits.rlimits() if pair[0] != resource.RLIMIT_AS],
                "keyctl": keyctl_number(),
                "cgroup_fds": cgroup_fds,
                "services": services,
                "max_connections": sandbox.max_connections,
            }
            try:
                self._proc = popen_lasting(  # on a long-lived thread: bwrap dies with the thread that forked it
                    argv,
                    **pipes.child_ends(),
                    pass_fds=child_fds,
                    start_new_session=True,
                    env=sandbox_environment(),  # bwrap and the relay get nothing of this process's environment
                    cwd="/",
                )
            except OSError as exc:
                raise HarnessStartupError(f"cannot start bubblewrap ({bwrap}): {exc}") from None
            finally:
                close_all(child_fds)
                child_fds.clear()
            self._watch()
            self._read_init(info_r, deadline)
            try:
                write_all(config_w, json.dumps(config).encode())
            except BrokenPipeError:
                pass  # the relay is gone: its status says why
            os.close(config_w)
            parent_fds.remove(config_w)
            self._await_status(status_r, deadline)
        finally:
            close_all(child_fds)
            close_all(parent_fds)

    def _read_init(self, info_r: int, deadline: float) -> None:
        """Learn the sandbox's pid 1 from bwrap's ``--info-fd`` (nothing: bwrap failed)."""
        data = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([info_r], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(info_r, 4096) if ready else b""
            if not chunk:
                break
            data += chunk
            with contextlib.suppress(ValueError):
                json.loads(data)
                break
        if not data:
            raise HarnessStartupError(f"the harness's sandbox could not be set up: {self._why_exited()}")
        self._init_pid = int(json.loads(data)["child-pid"])
        with contextlib.suppress(AttributeError, OSError):
            self._init_pidfd = os.pidfd_open(self._init_pid)

    def _await_status(self, status_r: int, deadline: float) -> None:
        """Wait for the relay's word: ``R`` (the agent runs) or ``E<why>``."""
        ready, _, _ = select.select([status_r], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise HarnessStartupError(
                f"the harness's sandbox did not start within {self.startup_timeout_s:g} s: {self._why_exited()}"
            )
        status = os.read(status_r, 4096)
        if status.startswith(b"R"):
            return
        if status:
            status += _read_all(status_r)  # the rest of an error: the relay exits right after it
        if status.startswith(b"E"):
            raise HarnessStartupError(f"cannot start harness in the sandbox: {status[1:].decode(errors='replace')}")
        raise HarnessStartupError(f"the harness's sandbox did not start: {self._why_exited()}")

    def _why_exited(self) -> str:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(2.0)
        if self._pipes is not None:
            self._pipes.join(1.0)
        tail = self._stderr_tail().strip()
        code = self._proc.returncode if self._proc is not None else None
        return (tail or "no message") + (f" (exit code {code})" if code is not None else "")

    # --- talking ---------------------------------------------------------------------------------

    async def write_line(self, text: str) -> None:
        """Send ``text`` and a newline to the harness's stdin (HarnessNotRunningError if it is gone)."""
        if not self.is_running():
            raise HarnessNotRunningError(f"harness {self.command[0]!r} is not running")
        data = (text + "\n").encode("utf-8")
        try:
            await asyncio.to_thread(self._write, data)
        except (BrokenPipeError, ConnectionResetError, ValueError, OSError) as exc:
            raise HarnessNotRunningError(
                f"harness {self.command[0]!r} is not reading its input (exit code {self.returncode}): {exc}"
            ) from None

    def close_stdin(self) -> None:
        """End the harness's input (it reads end of file). Agent CLIs run for one task, such as
        ``codex exec`` or ``opencode run``, wait for their input to end before they start:
        ``stdin="closed"`` does this as soon as the process starts."""
        pipes = self._pipes
        if pipes is not None:
            pipes.close_input()

    def _write(self, data: bytes) -> None:
        pipes = self._pipes
        if pipes is None:
            raise BrokenPipeError("the harness was stopped")
        pipes.write(data)

    async def read_line(self, timeout_s: Optional[float] = None) -> Optional[str]:
        """The next stdout line, without its line ending; None on timeout or at end of output."""
        return await self._lines.get(timeout_s)

    async def wait(self, timeout_s: Optional[float] = None) -> Optional[int]:
        """Wait until the process exits; its :attr:`returncode`, or None on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while self._proc is not None and self._peek_exit() is None:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            step = 0.05 if remaining is None else min(0.05, remaining)
            if self._exit_fd is not None:
                future = loop.create_future()
                loop.add_reader(self._exit_fd, _resolve, future)
                try:
                    await asyncio.wait_for(future, remaining)
                except asyncio.TimeoutError:
                    return None
                finally:
                    loop.remove_reader(self._exit_fd)
            else:
                await asyncio.sleep(step)
        return self.returncode

    # --- stopping --------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop the harness: SIGTERM, then SIGKILL after ``terminate_grace_s`` (idempotent).

        Plainly to its process group; sandboxed, SIGTERM goes to the agent and everything it
        started, and the SIGKILL to the whole sandbox. Returns once they are all gone."""
        self._stop_requested = True
        if self._proc is None and self._pipes is None and self._cgroup is None and not self._spawning:
            return
        await asyncio.to_thread(self._stop_sync)

    def _stop_sync(self) -> None:
        with self._stop_lock:
            self._teardown()

    def _teardown(self) -> None:
        """Stop and release everything (the stop lock held)."""
        proc = self._proc
        try:
            if proc is None:
                pass  # it never started: only its pipes and cgroup are left
            elif self.sandbox is None:
                self._stop_group(proc)
            else:
                self._stop_sandbox(proc)
        finally:
            pipes, self._pipes = self._pipes, None
            if pipes is not None:
                # What the harness wrote before it died is read to its end (a start-up error quotes
                # its stderr); a process that escaped the group may hold the pipes: not waited for.
                pipes.join(0.5)
            self._lines.close()  # what is left unread is dropped (and a reader blocked on a full queue let go)
            if pipes is not None:
                pipes.close()
            if proc is not None:
                self._returncode = proc.returncode
            for fd in (self._exit_fd, self._init_pidfd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._exit_fd = self._init_pidfd = self._init_pid = None
            self._release_cgroup()
            self._proc = None

    def _exited_within(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._peek_exit() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._exit_fd is not None:
                select.select([self._exit_fd], [], [], remaining)
            else:
                time.sleep(min(remaining, 0.02))
        return True

    def _stop_group(self, proc: subprocess.Popen) -> None:
        # The leader stays unreaped until the end: its pid, the group's id, cannot be reused meanwhile.
        if self._peek_exit() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            self._exited_within(self.terminate_grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the leader if it ignored SIGTERM, and what is left of its group
        try:
            proc.wait(_KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            logger.error("harness process %d did not die within %.0f s of SIGKILL", proc.pid, _KILL_WAIT_S)

    def _stop_sandbox(self, proc: subprocess.Popen) -> None:
        if self._peek_exit() is None and self._init_pid is not None:
            # bwrap passes no signal on: SIGTERM the agent and all it started (not the relay, pid 2).
            for pid in _descendants(self._init_pid):
                if _namespace_pid(pid) != 2:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGTERM)
            self._exited_within(self.terminate_grace_s)
        # SIGKILL to the sandbox's pid 1: the kernel kills everything in its pid namespace.
        if self._init_pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._init_pidfd, signal.SIGKILL)
            select.select([self._init_pidfd], [], [], _KILL_WAIT_S)
        elif self._init_pid is not None and self._peek_exit() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._init_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.wait(_KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            logger.error("harness sandbox %d did not die within %.0f s of SIGKILL", proc.pid, _KILL_WAIT_S)
        if self._init_pidfd is not None and hasattr(os, "P_PIDFD"):
            with contextlib.suppress(OSError):  # reaped here only if it was re-parented to this process
                os.waitid(os.P_PIDFD, self._init_pidfd, os.WEXITED | os.WNOHANG)

    def _release_cgroup(self) -> None:
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is None:
            return
        deadline = time.monotonic() + _KILL_WAIT_S
        while time.monotonic() < deadline:
            pids = [int(p) for d in cgroup.dirs for p in _read_words(os.path.join(d, "cgroup.procs"))]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        cgroup.remove()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        where = f", sandbox={self.sandbox.workspace!r}" if self.sandbox is not None else ""
        return f"HarnessProcess({self.command!r}, {state}{where})"


# --- helpers -------------------------------------------------------------------------------------


class _Pipes:
    """The child's stdin, stdout and stderr: pipes made here, whose read ends two threads own.

    The threads wait on their pipe and on a wake-up pipe, so :meth:`close` ends them even when a
    process that escaped the harness's group still holds the other end (a blocking read, or a
    buffered stream closed under a reading thread, would hang until that process exits)."""

    def __init__(self) -> None:
        self._fds: List[int] = []
        self.stdin_r, self.stdin_w = self._pipe()
        self.stdout_r, self.stdout_w = self._pipe()
        self.stderr_r, self.stderr_w = self._pipe()
        self.wake_r, self.wake_w = self._pipe()
        self.threads: List[threading.Thread] = []
        self._write_lock = threading.Lock()

    def _pipe(self) -> Tuple[int, int]:
        r, w = os.pipe()
        self._fds += [r, w]
        return r, w

    def child_ends(self) -> Dict[str, int]:
        return {"stdin": self.stdin_r, "stdout": self.stdout_w, "stderr": self.stderr_w}

    def _close(self, fd: int) -> None:
        if fd in self._fds:
            self._fds.remove(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def started(
        self,
        on_line: Callable[[bytes], None],
        on_end: Callable[[], None],
        on_stderr: Callable[[bytes], None],
        name: str,
    ) -> None:
        """The child has its ends: close ours of them and start reading."""
        for fd in (self.stdin_r, self.stdout_w, self.stderr_w):
            self._close(fd)
        name = os.path.basename(name)[:20]
        for fd, emit, end, what in (
            (self.stdout_r, on_line, on_end, "stdout"),
            (self.stderr_r, on_stderr, None, "stderr"),
        ):
            thread = threading.Thread(
                target=_read_lines, args=(fd, self.wake_r, emit, end), name=f"harness-{what}-{name}", daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def write(self, data: bytes) -> None:
        with self._write_lock:
            if self.stdin_w not in self._fds:
                raise BrokenPipeError("the harness was stopped")
            view = memoryview(data)
            while view:
                view = view[os.write(self.stdin_w, view) :]

    def close_input(self) -> None:
        with self._write_lock:
            self._close(self.stdin_w)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Stop the readers (what is left unread is dropped) and close every descriptor."""
        with self._write_lock:
            self._close(self.stdin_w)
        self._close(self.wake_w)  # the readers see the wake-up pipe's end and stop
        self.join(5.0)
        if any(thread.is_alive() for thread in self.threads):
            logger.error("a harness reader thread did not stop; its descriptors stay open")
            return
        for fd in list(self._fds):
            self._close(fd)


def _read_lines(fd: int, wake_fd: int, emit: Callable[[bytes], None], end: Optional[Callable[[], None]]) -> None:
    """Hand each line of ``fd`` (at most :data:`MAX_LINE_BYTES` at a time) to ``emit`` until its end,
    or until ``wake_fd`` becomes readable."""
    buffer = bytearray()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.register(wake_fd, select.POLLIN)
    try:
        while True:
            events = poller.poll()
            if any(ready == wake_fd for ready, _ in events):
                return
            chunk = os.read(fd, 65536)
            if not chunk:
                if buffer:
                    emit(bytes(buffer))
                return
            buffer += chunk
            while True:
                newline = buffer.find(b"\n", 0, MAX_LINE_BYTES)
                if newline < 0 and len(buffer) < MAX_LINE_BYTES:
                    break
                cut = newline + 1 if newline >= 0 else MAX_LINE_BYTES
                emit(bytes(buffer[:cut]))
                del buffer[:cut]
    except OSError:
        return
    finally:
        if end is not None:
            end()


def _decode_line(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
    return text


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _namespace_pid(pid: int) -> Optional[int]:
    """The pid of host process ``pid`` in its innermost pid namespace."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def _read_words(path: str) -> List[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


def _show_venv_python(cmd: Any, venv: str, shown: Set[str]) -> None:
    """Make the virtual environment ``venv`` runnable: its interpreter's standard library (not its
    site-packages) and each link on the way from ``bin/python*`` to the real binary."""
    from openenv.core.tools.sandbox import resolve_interpreter, show_interpreter

    bin_dir = os.path.join(venv, "bin")
    names = sorted(n for n in os.listdir(bin_dir) if n.startswith("python")) if os.path.isdir(bin_dir) else []
    for name in names:
        path = os.path.join(bin_dir, name)
        while os.path.islink(path):
            target = os.readlink(path)
            path = os.path.normpath(os.path.join(os.path.dirname(path), target))
            if not (path == venv or path.startswith(venv + os.sep)) and path not in shown and os.path.exists(path):
                cmd.ro_bind(os.path.realpath(path), path)
                shown.add(path)
    python = os.path.realpath(os.path.join(bin_dir, "python"))
    if python not in shown and os.path.isfile(python):
        try:
            show_interpreter(cmd, resolve_interpreter(python, ()), ())
        except (ValueError, OSError, RuntimeError) as exc:
            raise HarnessStartupError(f"the virtual environment {venv} has no usable Python: {exc}") from None
        shown.add(python)


def _hand_over(root: str, uid: int) -> None:
    """Give ``root`` and what is under it to the sandbox's ``uid`` (as root, before it starts).

    Stays on ``root``'s filesystem, never follows a link, and leaves alone a file with several
    hard links (it may be linked from outside: changing its owner would change that one too)."""
    top = os.lstat(root)
    if top.st_uid != uid or top.st_gid != uid:
        os.lchown(root, uid, uid)
    for directory, subdirs, files in os.walk(root, onerror=None):
        keep = []
        for name in subdirs:
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode) and info.st_dev != top.st_dev:
                continue  # a mount point: another filesystem
            if info.st_uid != uid:
                with contextlib.suppress(OSError):
                    os.lchown(path, uid, uid)
            if stat.S_ISDIR(info.st_mode):
                keep.append(name)
        subdirs[:] = keep
        for name in files:
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if info.st_uid == uid or (not stat.S_ISLNK(info.st_mode) and info.st_nlink > 1):
                continue
            with contextlib.suppress(OSError):
                os.lchown(path, uid, uid)


__all__ = [
    "FIRST_PORT",
    "HARNESS_LIMITS",
    "HarnessError",
    "HarnessNotRunningError",
    "HarnessProcess",
    "HarnessSandbox",
    "HarnessStartupError",
    "HarnessTurnTimeoutError",
    "MAX_LINE_BYTES",
    "STDERR_LINES",
]
