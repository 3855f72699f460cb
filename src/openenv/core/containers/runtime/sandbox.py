"""``SandboxProvider``: an environment server in a bubblewrap sandbox, the default way to run one.

The server runs in namespaces of its own (user or uid, pid, ipc, uts, cgroup, mount, and network
unless ``network=True``), sees a read-only system, its Python runtime and its package, a private
``/tmp``, and listens on a Unix socket in a host directory only it and the host can reach. See
:mod:`.isolation` for the filesystem view and :class:`~.isolation.Limits` for the limits.

Start-up: when running as root (servers, CI), a *zygote* per environment package — a sandboxed
process that has imported and warmed the app once — forks each new server, which then isolates
itself further (its own namespaces, uid, cgroup, /tmp, socket directory). A start then takes
milliseconds instead of a Python start-up and the app's imports. Otherwise each start runs
bubblewrap afresh (about a second for an MCP environment).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ...manifest import EnvManifest
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

ZYGOTE_ROOT = "/run/openenv-zygote"
SERVER_DIR = "/run/openenv"
SOCKET_NAME = "env.sock"
_MODULE = "openenv.core.containers.runtime._serve"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_HOST_PREFIXES = ("openenv-sandbox-", "openenv-server-")


def _make_host_dir(prefix: str) -> Path:
    _sweep_stale_dirs()
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(directory, 0o711)  # sandbox uids reach only their own subdirectory
    (directory / "owner").write_text(str(os.getpid()))
    return directory


def _sweep_stale_dirs() -> None:
    """Remove directories left by processes that died without cleaning up (e.g. killed)."""
    for prefix in _HOST_PREFIXES:
        for directory in Path(tempfile.gettempdir()).glob(prefix + "*"):
            try:
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


def _descendants(pid: int) -> list:
    """Host pids of every process below ``pid``."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            frontier.extend(children)
    return found


def _connectable(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


class _Zygote:
    """A sandboxed process that has imported one environment app and forks its servers."""

    def __init__(
        self,
        python: str,
        project_dir: str,
        app: str,
        network: bool,
        tmp_size_mb: int,
        log_level: str,
        timeout_s: float,
        env: Dict[str, str],
    ) -> None:
        bwrap = require_bwrap()
        self.host_dir = _make_host_dir("openenv-sandbox-")
        self.log = self.host_dir / "zygote.log"
        self.lock = threading.Lock()
        self.cgroup: Optional[Cgroup] = None
        command = BwrapCommand(bwrap, network=network, tmp_size_mb=tmp_size_mb)
        command.view(runtime_view(python), [project_dir])
        command.bind(str(self.host_dir), ZYGOTE_ROOT)
        command.dir(SERVER_DIR)
        inside_cgroups = []
        roots = cgroup_roots()
        if roots is not None:
            roots.sweep()
            try:
                self.cgroup = Cgroup(roots, f"openenv-{os.getpid()}-{uuid.uuid4().hex[:8]}", None, None)
            except OSError as exc:
                logger.warning("cgroup limits unavailable (%s): relying on rlimits alone", exc)
            else:
                for path in self.cgroup.dirs:
                    inside = "/sys/fs/cgroup/" + ("unified" if roots.version == 2 else Path(path).parts[4])
                    command.bind(path, inside)
                    inside_cgroups.append(inside)
        command.chdir("/tmp")
        config = {
            "mode": "zygote",
            "root": ZYGOTE_ROOT,
            "app": app,
            "project_dir": project_dir,
            "network": network,
            "cgroups": inside_cgroups,
            # Code that lives under /tmp (a checkout, a venv) is bound over the sandbox's /tmp;
            # each server gets its own /tmp and needs these bound again on top of it.
            "tmp_views": [p for p in command.views if p.startswith("/tmp/")],
            "log_level": log_level,
        }
        env = sandbox_environment({**env, "OPENENV_SANDBOX_CONFIG": json.dumps(config)})
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command.command([python, "-m", _MODULE]), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        try:
            self._wait_started(timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait_started(self, timeout_s: float) -> None:
        control = self.host_dir / "control.sock"
        deadline = time.monotonic() + timeout_s
        while not _connectable(control):
            if self.process.poll() is not None:
                raise IsolationError(
                    f"the sandbox did not start (exit code {self.process.returncode}):\n{_tail(self.log)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the sandbox did not start within {timeout_s:g} s:\n{_tail(self.log)}")
            time.sleep(0.005)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, message: Dict[str, Any], timeout_s: float = 30.0) -> Dict[str, Any]:
        data = b""
        try:
            with self.lock, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout_s)
                s.connect(str(self.host_dir / "control.sock"))
                s.sendall(json.dumps(message).encode() + b"\n")
                while not data.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except OSError as exc:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(0.2)  # a zygote that is dying: let it finish, so `alive` tells
            state = "is still running" if self.alive else f"exited with code {self.process.returncode}"
            raise IsolationError(
                f"the sandbox's zygote failed to answer {message.get('op')!r} ({exc}); it {state}:\n{_tail(self.log)}"
            ) from None
        if not data:
            raise IsolationError(f"the sandbox's zygote did not answer:\n{_tail(self.log)}")
        reply = json.loads(data)
        if not reply.get("ok"):
            raise IsolationError(f"the sandbox refused {message.get('op')!r}: {reply.get('error')}")
        return reply

    def close(self) -> None:
        if self.alive:
            with contextlib.suppress(Exception):
                self.request({"op": "shutdown", "grace_s": 2.0}, timeout_s=10.0)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
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


class SandboxProvider(RuntimeProvider):
    """Serve an environment package in a sandbox; ``start()`` returns ``unix:///.../env.sock``.

    ``project_path`` is the package directory (with ``openenv.yaml``); ``app`` overrides its
    ``app`` entry; ``python`` is the interpreter that has the package's dependencies (default:
    this one). ``env_vars`` reach the server through its environment, never a command line.
    ``isolation="none"`` runs the server as a plain subprocess (development only; it is logged).
    ``warm=False`` starts every server with bubblewrap afresh instead of forking it from the
    package's zygote.
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
    ) -> None:
        if isolation not in ("sandbox", "none"):
            raise ValueError(f"isolation must be 'sandbox' or 'none', got {isolation!r}")
        manifest = EnvManifest.load(project_path)
        self.project_dir = str(manifest.path)
        self.app = app or manifest.app
        self.name = manifest.name
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
        if isolation == "sandbox":
            require_bwrap()
        self._server_id: Optional[str] = None
        self._last_words = ""
        self._zygote: Optional[_Zygote] = None
        self._process: Optional[subprocess.Popen] = None
        self._dir: Optional[Path] = None
        self._base_url: Optional[str] = None

    @property
    def base_url(self) -> Optional[str]:
        return self._base_url

    @property
    def socket_path(self) -> Optional[Path]:
        return self._dir / SOCKET_NAME if self._dir is not None else None

    @property
    def log_path(self) -> Optional[Path]:
        """The server's stdout and stderr, while it runs (the directory goes when it stops)."""
        return self._dir / "server.log" if self._dir is not None else None

    # --- starting ---------------------------------------------------------------------------

    def start(self, port: Optional[int] = None, env_vars: Optional[Dict[str, str]] = None, **kwargs: Any) -> str:
        """Start the server; returns its ``unix://`` base URL (call :meth:`wait_for_ready` next)."""
        if port is not None:
            raise ValueError(
                "a sandboxed server listens on a Unix socket, not a port; use LocalProcessProvider for TCP"
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
        self._base_url = f"unix://{self._dir / SOCKET_NAME}"
        return self._base_url

    def _start_from_zygote(self, env: Dict[str, str]) -> None:
        # The app is imported in the zygote: environment variables it reads at import time
        # (MAX_CONCURRENT_ENVS, OPENENV_STEP_TIMEOUT_S, ...) must be there, so they are part of the key.
        key = (
            self.python,
            self.project_dir,
            self.app,
            self.network,
            self.limits.tmp_size_mb,
            self.log_level,
            tuple(sorted(env.items())),
        )
        args = (self.python, self.project_dir, self.app, self.network, self.limits.tmp_size_mb, self.log_level)
        server_id = uuid.uuid4().hex[:16]
        uid = sandbox_uid()
        spawn = {"op": "spawn", "id": server_id, "uid": uid, "gid": uid, "limits": json.loads(self.limits.to_json())}
        for attempt in (1, 2):
            zygote = _zygote(key, *args, self.start_timeout_s, env)
            try:
                zygote.request({**spawn, "env": env})
                break
            except IsolationError:
                if attempt == 2 or zygote.alive:
                    raise
                # It died between two starts (killed from outside, say): a fresh one takes over.
                logger.warning("the sandbox's zygote for %s died; starting a fresh one", self.name)
        self._zygote, self._server_id = zygote, server_id
        self._dir = zygote.host_dir / server_id

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
        log = open(directory / "server.log", "ab")
        try:
            if sandboxed:
                command = BwrapCommand(require_bwrap(), network=self.network, tmp_size_mb=self.limits.tmp_size_mb)
                command.view(runtime_view(self.python), [self.project_dir])
                command.bind(str(directory), SERVER_DIR).chdir("/tmp")
                config["uds"] = f"{SERVER_DIR}/{SOCKET_NAME}"
                if privileged():
                    uid = sandbox_uid()
                    os.chown(directory, uid, uid)
                    config["drop_to"] = [uid, uid]
                argv = command.command([self.python, "-m", _MODULE])
            else:
                logger.warning("%s runs WITHOUT isolation: it can reach this machine's files and network", self.name)
                config.update(self._plain_address(directory))
                config["parent_pid"] = os.getpid()
                argv = [self.python, "-m", _MODULE]
            self._process = subprocess.Popen(
                argv,
                env=sandbox_environment({**env, "OPENENV_SANDBOX_CONFIG": json.dumps(config)}),
                cwd=str(directory) if not sandboxed else None,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()

    def _plain_address(self, directory: Path) -> Dict[str, Any]:
        """Where an unsandboxed server listens (a Unix socket here; a TCP port in a subclass)."""
        return {"uds": str(directory / SOCKET_NAME)}

    # --- readiness and stopping ------------------------------------------------------------------

    def _accepting(self) -> bool:
        assert self._dir is not None
        return _connectable(self._dir / SOCKET_NAME)

    def wait_for_ready(self, timeout_s: float = 30.0) -> None:
        """Return once the server accepts connections; raise with its log if it died or is late."""
        if self._dir is None:
            raise RuntimeError("start() the provider first")
        deadline = time.monotonic() + timeout_s
        pause = 0.002
        while not self._accepting():
            exit_code = self._exit_code()
            if exit_code is not None:
                log = self._last_words or _tail(self._dir / "server.log")
                if self._zygote is not None and not self._zygote.alive:
                    log = f"the sandbox's zygote died:\n{_tail(self._zygote.log)}"
                self.stop()
                raise RuntimeError(f"{self.name} exited with code {exit_code} while starting:\n{log}")
            if time.monotonic() > deadline:
                log = _tail(self._dir / "server.log")
                raise TimeoutError(f"{self.name} did not start within {timeout_s:g} s:\n{log}")
            time.sleep(pause)
            pause = min(pause * 1.5, 0.05)

    def _exit_code(self) -> Optional[int]:
        if self._process is not None:
            return self._process.poll()
        if self._zygote is not None and self._server_id is not None:
            if not self._zygote.alive:
                return -1
            status = self._zygote.request({"op": "status", "id": self._server_id})
            if status.get("running"):
                return None
            self._last_words = status.get("log") or ""
            return status.get("exit_code", -1)
        return None

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``grace_s``) and remove its directory."""
        zygote, server_id = self._zygote, self._server_id
        process, directory = self._process, self._dir
        self._zygote = self._server_id = self._process = self._dir = self._base_url = None
        if zygote is not None and server_id is not None:
            if zygote.alive:
                with contextlib.suppress(Exception):
                    zygote.request({"op": "stop", "id": server_id, "grace_s": grace_s}, timeout_s=grace_s + 10)
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
            return
        if process is not None:
            if process.poll() is None:
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
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def __del__(self) -> None:
        if getattr(self, "_base_url", None) is not None:
            with contextlib.suppress(Exception):
                self.stop(grace_s=1.0)

    def __repr__(self) -> str:
        return f"SandboxProvider({self.project_dir!r}, isolation={self.isolation!r}, base_url={self._base_url!r})"
