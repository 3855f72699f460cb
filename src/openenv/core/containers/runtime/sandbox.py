"""``SandboxProvider``: an environment server in a bubblewrap sandbox, the default way to run one.

The server runs in namespaces of its own (user or uid, pid, ipc, uts, cgroup, mount, and network
unless ``network=True``), sees a read-only system, its Python runtime and its package, a private
``/tmp``, and runs under a seccomp filter (:mod:`.seccomp`) with no capability. See
:mod:`.isolation` for the filesystem view and :class:`~.isolation.Limits` for the limits.

Nothing the sandbox can write is ever trusted by the host: the host binds the server's listening
socket in a run directory of its own (mode 0700, never mounted into a sandbox) and hands the
server descriptors only — the socket, a pipe for its log (copied here into a bounded file) and a
pipe on which it says it is ready.

Start-up: when running as root (servers, CI), a *warden* per environment package — a sandboxed,
privileged process that has imported the framework (never the package) — forks each new server,
which isolates itself (its own namespaces, uid, cgroup, ``/tmp``), drops every privilege and only
then imports the package. A start then takes about a tenth of a second instead of a Python
start-up and the framework's imports. Otherwise each start runs bubblewrap afresh (about a second
for an MCP environment).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...manifest import EnvManifest
from ...utils import popen_lasting
from . import seccomp
from ._app_import import unreadable_message
from ._linux import descendants
from .isolation import (
    BwrapCommand,
    Cgroup,
    IsolationError,
    Limits,
    cgroup_roots,
    privileged,
    python_command,
    require_bwrap,
    runtime_view,
    sandbox_environment,
    sandbox_uid,
)
from .providers import RuntimeProvider

logger = logging.getLogger("openenv.sandbox")

SOCKET_NAME = "env.sock"
LOG_NAME = "server.log"
MAX_LOG_BYTES = 16 * 1024 * 1024
"""A server's log file starts over (with a note) when it reaches this size."""
_MODULE = "openenv.core.containers.runtime._serve"


def read_log(path: Path, offset: int = 0, max_bytes: int = 1 << 20) -> Tuple[bytes, int]:
    """Up to ``max_bytes`` of the log at ``path`` from ``offset`` (negative: from the end), and its size.

    Opens without following links or blocking and reads only a regular file, whatever is found at
    the path: ``(b"", 0)`` otherwise.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b"", 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return b"", 0
        start = max(0, info.st_size + offset) if offset < 0 else min(offset, info.st_size)
        return os.pread(fd, max_bytes, start), info.st_size
    finally:
        os.close(fd)


def _tail(path: Path, lines: int = 20, max_bytes: int = 16384) -> str:
    """The last ``lines`` lines of a log (at most its last ``max_bytes`` bytes are read)."""
    data, _size = read_log(path, -max_bytes, max_bytes)
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


_HOST_PREFIXES = ("openenv-sandbox-", "openenv-server-")


def _make_host_dir(prefix: str) -> Path:
    """A run directory on the host: the sockets and logs of servers. No sandbox can reach it (0700,
    never mounted into one): sandboxes get descriptors, never paths."""
    _sweep_stale_dirs()
    directory = Path(tempfile.mkdtemp(prefix=prefix))  # mode 0700
    (directory / "owner").write_text(str(os.getpid()))
    return directory


def _sweep_stale_dirs() -> None:
    """Remove directories left by processes that died without cleaning up (e.g. killed)."""
    for prefix in _HOST_PREFIXES:
        for directory in Path(tempfile.gettempdir()).glob(prefix + "*"):
            try:
                if directory.lstat().st_uid != os.geteuid() or directory.is_symlink():
                    continue  # not ours
                owner = int((directory / "owner").read_text())
            except (OSError, ValueError):
                continue
            if not _pid_alive(owner):
                shutil.rmtree(directory, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_descendants = descendants  # (the name tests and older callers use)


def _listener(path: Path, tcp: Optional[Tuple[str, int]] = None) -> socket.socket:
    """A listening socket made by the host, the server inherits it and accepts on it: a Unix socket
    at ``path``, or a TCP one bound to ``tcp`` (``(host, port)``)."""
    if tcp is None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        listener = socket.socket(socket.AF_INET6 if ":" in tcp[0] else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if tcp is None:
            listener.bind(str(path))
        else:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
            listener.bind(tcp)
        listener.listen(1024)
    except BaseException:
        listener.close()
        raise
    return listener


class _LogCopier:
    """Copies a sandbox's output pipe into a host log file, bounded by :data:`MAX_LOG_BYTES`.

    The sandbox holds only the pipe's write end: it cannot replace, link or grow the file past
    the bound, and nothing on the host ever opens a path the sandbox could have written.
    """

    def __init__(self, read_fd: int, path: Path) -> None:
        self.read_fd = read_fd
        self.path = path
        self._file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        self._thread = threading.Thread(target=self._copy, name="openenv-sandbox-log", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        written = 0
        try:
            while True:
                try:
                    chunk = os.read(self.read_fd, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                if written + len(chunk) > MAX_LOG_BYTES:
                    os.ftruncate(self._file, 0)
                    note = f"[openenv: the log reached {MAX_LOG_BYTES // (1024 * 1024)} MiB and starts over]\n"
                    written = os.write(self._file, note.encode())
                written += os.write(self._file, chunk)
        finally:
            with contextlib.suppress(OSError):
                os.close(self.read_fd)
            with contextlib.suppress(OSError):
                os.close(self._file)

    def wait(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the sandbox's end is closed and everything is copied."""
        self._thread.join(timeout_s)


def _send_config(fd: int, data: bytes) -> None:
    """Write ``data`` to a pipe and close it, without blocking the caller on a slow reader."""

    def write() -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            pass  # the server died before reading: wait_for_ready reports it
        finally:
            os.close(fd)

    if len(data) <= 65536:
        write()  # fits in the pipe: no thread needed
    else:
        threading.Thread(target=write, name="openenv-sandbox-config", daemon=True).start()


def _cgroup_view(command: BwrapCommand, cgroup: Optional[Cgroup], version: int) -> List[str]:
    inside_cgroups = []
    for path in cgroup.dirs if cgroup is not None else []:
        inside = "/sys/fs/cgroup/" + ("unified" if version == 2 else Path(path).parts[4])
        command.bind(path, inside)
        inside_cgroups.append(inside)
    return inside_cgroups


class _Zygote:
    """A package's sandbox whose warden (privileged, framework only) forks its servers.

    The host talks to the warden over a socket pair made here (no path at all), passing each
    server its listening socket, log pipe, readiness pipe and configuration pipe as descriptors.
    """

    def __init__(
        self,
        python: str,
        project_dir: str,
        app: str,
        network: bool,
        tmp_size_mb: int,
        log_level: str,
        profile: str,
        timeout_s: float,
    ) -> None:
        bwrap = require_bwrap()
        self.host_dir = _make_host_dir("openenv-sandbox-")
        self.log = self.host_dir / "zygote.log"
        self.lock = threading.Lock()
        self.cgroup: Optional[Cgroup] = None
        self.process: Optional[subprocess.Popen] = None
        self._copier: Optional[_LogCopier] = None
        command = BwrapCommand(bwrap, network=network, tmp_size_mb=tmp_size_mb)
        command.view(runtime_view(python), [project_dir])
        roots = cgroup_roots()
        inside_cgroups: List[str] = []
        if roots is not None:
            roots.sweep()
            try:
                self.cgroup = Cgroup(roots, f"openenv-{os.getpid()}-{uuid.uuid4().hex[:8]}", None, None)
            except OSError as exc:
                logger.warning("cgroup limits unavailable (%s): relying on rlimits alone", exc)
            else:
                inside_cgroups = _cgroup_view(command, self.cgroup, roots.version)
        command.chdir("/tmp")
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "mode": "warden",
            "control_fd": theirs.fileno(),
            "app": app,
            "project_dir": project_dir,
            "network": network,
            "seccomp": profile,
            "cgroups": inside_cgroups,
            # Code that lives under /tmp (a checkout, a venv) is bound over the sandbox's /tmp;
            # each server gets its own /tmp and needs these bound again on top of it.
            "tmp_views": [p for p in command.views if p.startswith("/tmp/")],
            "log_level": log_level,
        }
        log_r, log_w = os.pipe()
        try:
            self._copier = _LogCopier(log_r, self.log)
            self.process = popen_lasting(  # (the warden outlives the thread that starts it)
                command.command([python, "-m", _MODULE]),
                env=sandbox_environment({"OPENENV_SANDBOX_CONFIG": json.dumps(config)}),
                stdin=subprocess.DEVNULL,
                stdout=log_w,
                stderr=log_w,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            self.close()
            raise
        finally:
            os.close(log_w)
            theirs.close()
        try:
            self._wait_started(timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait_started(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while True:
            ready, _, _ = select.select([self.control], [], [], 0.05)
            if ready:
                try:
                    data = self.control.recv(65536)
                except OSError:
                    data = b""
                if data and json.loads(data).get("ready"):
                    return
            if self.process.poll() is not None or (ready and not data):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(1)
                if self._copier is not None:
                    self._copier.wait(1.0)
                raise IsolationError(
                    f"the sandbox did not start (exit code {self.process.returncode}):\n{_tail(self.log)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the sandbox did not start within {timeout_s:g} s:\n{_tail(self.log)}")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def request(self, message: Dict[str, Any], timeout_s: float = 30.0, fds: Tuple[int, ...] = ()) -> Dict[str, Any]:
        data = b""
        try:
            with self.lock:
                self.control.settimeout(timeout_s)
                socket.send_fds(self.control, [json.dumps(message).encode()], list(fds))
                data = self.control.recv(65536)
        except OSError as exc:
            if self.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(0.2)  # a warden that is dying: let it finish, so `alive` tells
            state = "is still running" if self.alive else f"exited with code {self.process and self.process.returncode}"
            raise IsolationError(
                f"the sandbox's warden failed to answer {message.get('op')!r} ({exc}); it {state}:\n{_tail(self.log)}"
            ) from None
        if not data:
            with contextlib.suppress(subprocess.TimeoutExpired):
                if self.process is not None:
                    self.process.wait(0.2)
            raise IsolationError(f"the sandbox's warden did not answer:\n{_tail(self.log)}")
        reply = json.loads(data)
        if not reply.get("ok"):
            raise IsolationError(f"the sandbox refused {message.get('op')!r}: {reply.get('error')}")
        return reply

    def close(self) -> None:
        if self.alive:
            with contextlib.suppress(Exception):
                self.request({"op": "shutdown", "grace_s": 2.0}, timeout_s=10.0)
        if self.process is not None:
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.control.close()
        if self._copier is not None:
            self._copier.wait(1.0)
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.host_dir, ignore_errors=True)


_ZYGOTES: Dict[Tuple[Any, ...], _Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def _zygote(key: Tuple[Any, ...], *args: Any) -> _Zygote:
    with _ZYGOTES_LOCK:
        zygote = _ZYGOTES.get(key)
        if zygote is not None and not zygote.alive:
            zygote.close()
            zygote = None
        if zygote is None:
            zygote = _ZYGOTES[key] = _Zygote(*args)
        return zygote


def shutdown_sandboxes() -> None:
    """Stop every zygote this process started (they also stop at interpreter exit)."""
    with _ZYGOTES_LOCK:
        zygotes = list(_ZYGOTES.values())
        _ZYGOTES.clear()
    for zygote in zygotes:
        zygote.close()


atexit.register(shutdown_sandboxes)


def _check_readable_by_others(project_dir: str) -> None:
    """As root, a sandboxed server runs as a fresh uid (in no group): only "others" bits let it read
    its package. Said here, before any sandbox starts, rather than as "No module named 'server'"."""
    if not privileged():
        return  # the server keeps this user's uid (mapped in its user namespace)
    info = os.stat(project_dir)
    if info.st_mode & (stat.S_IROTH | stat.S_IXOTH) != stat.S_IROTH | stat.S_IXOTH:
        raise IsolationError(unreadable_message(project_dir, info, project_dir))


class SandboxProvider(RuntimeProvider):
    """Serve an environment package in a sandbox; ``start()`` returns ``unix:///.../env.sock``.

    ``project_path`` is the package directory (with ``openenv.yaml``); ``app`` overrides its
    ``app`` entry; ``python`` is the interpreter that has the package's dependencies (default:
    this one). ``env_vars`` reach the server through its environment, never a command line.
    ``isolation="none"`` runs the server as a plain subprocess (development only; it is logged).
    ``warm=False`` starts every server with bubblewrap afresh instead of forking it from the
    package's warden. ``listen=(host, port)`` serves on that TCP address instead (``start()``
    returns ``http://host:port``, port 0 picks a free one): the host binds the socket and hands it
    to the server, which accepts on it and still has no network of its own.
    """

    def __init__(
        self,
        project_path: str,
        app: Optional[str] = None,
        python: Optional[str] = None,
        network: bool = False,
        memory_mb: Optional[int] = 2048,
        cpu_seconds: Optional[int] = None,
        max_processes: Optional[int] = 256,
        max_open_files: Optional[int] = 4096,
        max_file_size_mb: Optional[int] = 1024,
        tmp_size_mb: int = 512,
        env_vars: Optional[Dict[str, str]] = None,
        isolation: str = "sandbox",
        warm: bool = True,
        start_timeout_s: float = 60.0,
        log_level: str = "warning",
        listen: Optional[Tuple[str, int]] = None,
    ) -> None:
        if isolation not in ("sandbox", "none"):
            raise ValueError(f"isolation must be 'sandbox' or 'none', got {isolation!r}")
        manifest = EnvManifest.load(project_path)
        self.project_dir = str(manifest.path)
        self.app = app or manifest.app
        self.name = manifest.name
        # A package that runs code in sandboxes of its own needs bubblewrap inside its server, unless
        # the server has a broker to start them (as root): then it is denied namespaces like any other.
        nesting = manifest.raw.get("nested_sandboxes") is True and not privileged()
        self.seccomp_profile = "nesting" if nesting else "strict"
        self.python = python_command(python)
        if isolation == "sandbox":
            self.python = runtime_view(self.python).executable  # a real interpreter, not a shim
        self.network = network
        self.limits = Limits(memory_mb, cpu_seconds, max_processes, max_open_files, max_file_size_mb, tmp_size_mb)
        self.env_vars = dict(env_vars or {})
        self.isolation = isolation
        self.warm = warm
        self.start_timeout_s = start_timeout_s
        self.log_level = log_level
        self.listen = listen
        if isolation == "sandbox":
            require_bwrap()
            ok, why = seccomp.available()
            if not ok:
                raise IsolationError(why)
            _check_readable_by_others(self.project_dir)
        self._server_id: Optional[str] = None
        self._zygote: Optional[_Zygote] = None
        self._process: Optional[subprocess.Popen] = None
        self._dir: Optional[Path] = None
        self._base_url: Optional[str] = None
        self._copier: Optional[_LogCopier] = None
        self._ready_fd: Optional[int] = None
        self._ready = False
        self._tcp_url: Optional[str] = None

    @property
    def base_url(self) -> Optional[str]:
        return self._base_url

    @property
    def socket_path(self) -> Optional[Path]:
        return self._dir / SOCKET_NAME if self._dir is not None else None

    @property
    def log_path(self) -> Optional[Path]:
        """The server's stdout and stderr, while it runs (the directory goes when it stops).

        The host writes this file (bounded by :data:`MAX_LOG_BYTES`) from a pipe; the server
        never sees its path."""
        return self._dir / LOG_NAME if self._dir is not None else None

    # --- starting ---------------------------------------------------------------------------

    def start(self, port: Optional[int] = None, env_vars: Optional[Dict[str, str]] = None, **kwargs: Any) -> str:
        """Start the server; returns its ``unix://`` base URL (call :meth:`wait_for_ready` next)."""
        if port is not None:
            raise ValueError(
                "a sandboxed server listens on a Unix socket, not a port: make the provider with "
                "listen=(host, port) to serve on TCP"
            )
        if kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(kwargs))}")
        if self._base_url is not None:
            raise RuntimeError("this provider has already started a server; stop() it first")
        env = {**self.env_vars, **(env_vars or {})}
        if self.isolation == "none":
            self._start_process(env, sandboxed=False)
            if self._base_url is not None:  # a subclass chose another address
                return self._base_url
        elif privileged() and self.warm:
            self._start_from_zygote(env)
        else:
            self._start_process(env, sandboxed=True)
        assert self._dir is not None
        self._base_url = self._tcp_url or f"unix://{self._dir / SOCKET_NAME}"
        return self._base_url

    def _start_from_zygote(self, env: Dict[str, str]) -> None:
        # The warden imports no package code, so one serves every start of this package whatever
        # its environment variables: each server reads its own after it has forked.
        key = (self.python, self.project_dir, self.app, self.network, self.limits.tmp_size_mb, self.log_level)
        args = (*key, self.seccomp_profile, self.start_timeout_s)
        server_id = uuid.uuid4().hex[:16]
        uid = sandbox_uid()
        spawn = {"op": "spawn", "id": server_id, "uid": uid, "gid": uid, "limits": json.loads(self.limits.to_json())}
        for attempt in (1, 2):
            zygote = _zygote((*key, self.seccomp_profile), *args)
            directory = zygote.host_dir / server_id
            directory.mkdir(mode=0o700)
            try:
                self._spawn(zygote, directory, spawn, env)
                break
            except IsolationError:
                self._release()
                shutil.rmtree(directory, ignore_errors=True)
                if attempt == 2 or zygote.alive:
                    raise
                # It died between two starts (killed from outside, say): a fresh one takes over.
                logger.warning("the sandbox's warden for %s died; starting a fresh one", self.name)
        self._zygote, self._server_id, self._dir = zygote, server_id, directory

    def _spawn(self, zygote: _Zygote, directory: Path, spawn: Dict[str, Any], env: Dict[str, str]) -> None:
        listener = self._listen(directory)
        log_r, log_w = os.pipe()
        ready_r, ready_w = os.pipe()
        config_r, config_w = os.pipe()
        self._copier = _LogCopier(log_r, directory / LOG_NAME)
        self._ready_fd, self._ready = ready_r, False
        try:
            zygote.request(spawn, fds=(listener.fileno(), log_w, ready_w, config_r))
        except BaseException:
            os.close(config_w)
            raise
        finally:
            listener.close()
            for fd in (log_w, ready_w, config_r):
                os.close(fd)
        _send_config(config_w, json.dumps(env).encode())

    def _start_process(self, env: Dict[str, str], sandboxed: bool) -> None:
        directory = _make_host_dir("openenv-server-")
        self._dir = directory
        config: Dict[str, Any] = {
            "mode": "single",
            "app": self.app,
            "project_dir": self.project_dir,
            "limits": json.loads(self.limits.to_json()),
            "log_level": self.log_level,
        }
        log_r, log_w = os.pipe()
        ready_r, ready_w = os.pipe()
        self._copier = _LogCopier(log_r, directory / LOG_NAME)
        self._ready_fd, self._ready = ready_r, False
        config["ready_fd"] = ready_w
        listener: Optional[socket.socket] = None
        try:
            address = None if sandboxed else self._plain_address(directory)
            if address is None:
                listener = self._listen(directory)
                config["listen_fd"] = listener.fileno()
            else:
                config.update(address)
            if sandboxed:
                command = BwrapCommand(require_bwrap(), network=self.network, tmp_size_mb=self.limits.tmp_size_mb)
                command.view(runtime_view(self.python), [self.project_dir]).chdir("/tmp")
                config["seccomp"] = self.seccomp_profile
                if privileged():
                    uid = sandbox_uid()
                    config["drop_to"] = [uid, uid]
                argv = command.command([self.python, "-m", _MODULE])
            else:
                logger.warning("%s runs WITHOUT isolation: it can reach this machine's files and network", self.name)
                config["parent_pid"] = os.getpid()
                argv = [self.python, "-m", _MODULE]
            # bwrap dies with the thread that forks it (--die-with-parent): a sandbox is forked
            # from a thread that lasts; a server without one watches this process instead.
            spawn = popen_lasting if sandboxed else subprocess.Popen
            self._process = spawn(
                argv,
                env=sandbox_environment({**env, "OPENENV_SANDBOX_CONFIG": json.dumps(config)}),
                cwd=str(directory) if not sandboxed else None,
                stdin=subprocess.DEVNULL,
                stdout=log_w,
                stderr=log_w,
                pass_fds=[fd for fd in (ready_w, config.get("listen_fd")) if fd is not None],
                start_new_session=True,
            )
        finally:
            os.close(log_w)
            os.close(ready_w)
            if listener is not None:
                listener.close()

    def _listen(self, directory: Path) -> socket.socket:
        listener = _listener(directory / SOCKET_NAME, self.listen)
        if self.listen is not None:
            host, port = listener.getsockname()[:2]
            self._tcp_url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        return listener

    def _plain_address(self, directory: Path) -> Optional[Dict[str, Any]]:
        """Where an unsandboxed server listens: None for the host's Unix socket (a TCP port in a subclass)."""
        return None

    # --- readiness and stopping ------------------------------------------------------------------

    def _accepting(self) -> bool:
        """Whether the server said it accepts connections (it writes to a pipe the host holds)."""
        if self._ready or self._ready_fd is None:
            return self._ready
        readable, _, _ = select.select([self._ready_fd], [], [], 0)
        if readable:
            self._ready = os.read(self._ready_fd, 1) == b"R"
            os.close(self._ready_fd)  # a byte, or the end: it says nothing more either way
            self._ready_fd = None
        return self._ready

    def wait_for_ready(self, timeout_s: float = 30.0) -> None:
        """Return once the server accepts connections; raise with its log if it died or is late."""
        if self._dir is None:
            raise RuntimeError("start() the provider first")
        deadline = time.monotonic() + timeout_s
        pause = 0.002
        while not self._accepting():
            exit_code = self._exit_code()
            if exit_code is not None:
                if self._copier is not None:
                    self._copier.wait(1.0)
                log = _tail(self._dir / LOG_NAME)
                if self._zygote is not None and not self._zygote.alive:
                    log = f"the sandbox's warden died:\n{_tail(self._zygote.log)}"
                self.stop()
                raise RuntimeError(f"{self.name} exited with code {exit_code} while starting:\n{log}")
            if time.monotonic() > deadline:
                log = _tail(self._dir / LOG_NAME)
                raise TimeoutError(f"{self.name} did not start within {timeout_s:g} s:\n{log}")
            time.sleep(pause)
            pause = min(pause * 1.5, 0.05)

    def poll(self) -> Optional[int]:
        """None while the server runs (or before :meth:`start`); its exit code once it has
        exited (-1 when that is not known). Cheap enough to call every fraction of a second."""
        try:
            return self._exit_code()
        except IsolationError:  # its warden is gone, and the server with it
            return -1

    def _exit_code(self) -> Optional[int]:
        if self._process is not None:
            return self._process.poll()
        if self._zygote is not None and self._server_id is not None:
            if not self._zygote.alive:
                return -1
            status = self._zygote.request({"op": "status", "id": self._server_id})
            if status.get("running"):
                return None
            return status.get("exit_code", -1)
        return None

    def _release(self) -> None:
        if self._ready_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._ready_fd)
        self._ready_fd, self._ready = None, False
        copier, self._copier = self._copier, None
        if copier is not None:
            copier.wait(1.0)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``grace_s``) and remove its directory."""
        zygote, server_id = self._zygote, self._server_id
        process, directory = self._process, self._dir
        self._zygote = self._server_id = self._process = self._dir = self._base_url = self._tcp_url = None
        if zygote is not None and server_id is not None:
            if zygote.alive:
                with contextlib.suppress(Exception):
                    zygote.request({"op": "stop", "id": server_id, "grace_s": grace_s}, timeout_s=grace_s + 10)
        elif process is not None and process.poll() is None:
            # bwrap does not pass signals on: ask the server itself to shut down cleanly.
            for pid in _descendants(process.pid) or [process.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        self._release()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def __del__(self) -> None:
        if getattr(self, "_base_url", None) is not None:
            with contextlib.suppress(Exception):
                self.stop(grace_s=1.0)

    def __repr__(self) -> str:
        return f"SandboxProvider({self.project_dir!r}, isolation={self.isolation!r}, base_url={self._base_url!r})"
