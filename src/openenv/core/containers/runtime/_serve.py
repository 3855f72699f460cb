"""The program that runs inside a sandbox: serve one environment app, or be a package's warden.

Configuration arrives as JSON in ``$OPENENV_SANDBOX_CONFIG`` (never on the command line). Every
descriptor a server needs is made by the host and inherited: the listening socket (the host binds
it in a directory no sandbox can reach), the log (a pipe the host reads), a readiness pipe (the
server writes ``R`` to it once it accepts connections) and, for forked servers, a pipe carrying
the server's environment variables.

``single`` mode isolates itself further where it runs as root (its own pid namespace and
``/proc``, its own uid), applies the limits, joins a fresh session keyring, installs the seccomp
filter, and only then imports the environment package and serves it.

``warden`` mode is the privileged helper behind warm starts: it runs as root inside the sandbox,
imports the *framework* (openenv's server, FastAPI, pydantic, uvicorn, FastMCP: never the package)
and answers the host's requests on an inherited control socket. Each ``spawn`` forks a child that
makes namespaces of its own (mount, pid, ipc, uts, and network unless allowed), a fresh ``/tmp``,
its cgroup, and a server as pid 1 of them, which drops to a uid of its own, loses every
capability, gets its limits, keyring and seccomp filter, and only then imports and warms the
package. No package code ever runs in the warden or with privileges, and each server starts from
the warden's state, which holds nothing of any other server: the warden never reads a server's
environment, log or traffic.

In both modes, as root, the process that started the server stays behind as its sandbox broker
(:mod:`openenv.core.tools.broker`): the server's code runs (``openenv.core.tools``) are started
there, so that the server itself never needs user namespaces or mounts, and each run gets its own
uid and, under the server's cgroup, a cgroup of its own.
"""

from __future__ import annotations

import errno
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from openenv.core.tools import broker

from . import _linux
from ._app_import import import_app
from .isolation import Limits

# Framework modules the warden imports once, so that forked servers only import the package.
PRELOAD = (
    "openenv.core.env_server.http_server",
    "openenv.core.env_server.mcp_environment",
    "openenv.core.env_server.serving.runner",
    "openenv.core.containers.runtime.seccomp",
    "pyseccomp",
    "fastmcp",
    "fastmcp.server.context",
    "fastmcp.server.elicitation",
    "fastmcp.server.middleware.dereference",
    "fastmcp.server.sessions",
    "griffe",
    "pydantic.v1",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.websockets_sansio_impl",
    "uvicorn.lifespan.on",
    "uvicorn.loops.uvloop",
)
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a forked server's environment variables


def _import_app(app_path: str, project_dir: Optional[str]) -> Any:
    """The package's app: see :mod:`._app_import` for how its path is read."""
    return import_app(app_path, project_dir)


def _warm_up(app: Any) -> None:
    """Build and close one environment, so that its lazy imports happen before the first reset."""
    server = getattr(getattr(app, "state", None), "openenv_server", None)
    factory = getattr(getattr(server, "manager", None), "_factory", None)
    if factory is None:
        return
    try:
        env = factory()
        close = getattr(env, "close", None)
        if close is not None:
            close()
    except Exception as exc:  # the server will report factory failures itself
        print(f"openenv sandbox: warm-up of the environment failed: {exc}", file=sys.stderr, flush=True)


def _harden(profile: Optional[str]) -> None:
    """What every sandboxed server does once it runs unprivileged, before any package code."""
    from . import seccomp

    _linux.no_new_privileges()
    if profile is None:
        return
    seccomp.join_fresh_session_keyring()
    seccomp.load(profile)


def _serve(app: Any, config: Dict[str, Any], ready_fd: Optional[int]) -> None:
    """Serve ``app`` on the inherited listening socket (or a TCP port); signal readiness on ``ready_fd``."""
    import uvicorn

    from openenv.core.env_server.serving.runner import owned_process_gc, uvicorn_config

    log_level = config.get("log_level", "warning")
    sockets: Optional[List[socket.socket]] = None
    options: Dict[str, Any] = {}
    if config.get("listen_fd") is not None:
        # The host's listening socket, a Unix or a TCP one: its family is read from the descriptor
        # (uvicorn's own ``fd`` option would take every descriptor for a Unix socket).
        sockets = [socket.socket(fileno=int(config["listen_fd"]))]
    else:
        options = {"host": config.get("host", "127.0.0.1"), "port": int(config.get("port") or 8000)}
    server = uvicorn.Server(uvicorn_config(app, log_level=log_level, **options))
    if ready_fd is not None:

        def signal_ready() -> None:
            # uvicorn sets ``started`` once it accepts connections; the host waits on this pipe.
            while not server.started and not server.should_exit:
                time.sleep(0.002)
            try:
                if server.started:
                    os.write(ready_fd, b"R")
            except OSError:
                pass  # the host stopped waiting (it gave up, or is gone)
            finally:
                os.close(ready_fd)

        threading.Thread(target=signal_ready, name="openenv-ready", daemon=True).start()
    with owned_process_gc(app):
        server.run(sockets=sockets)


def single(config: Dict[str, Any]) -> None:
    """Serve the app in this process (sandboxed by bwrap already, or not sandboxed at all)."""
    _linux.die_with_parent()
    if os.getppid() == 1 and config.get("parent_pid") not in (None, 1):
        return  # the parent died before we could ask to die with it
    limits = Limits(**config["limits"])
    if config.get("drop_to"):  # root inside a bwrap sandbox without a user namespace
        broker_fd = _own_pid_namespace(limits)
        os.environ[broker.BROKER_FD_ENV] = str(broker_fd)
    limits.apply()
    os.umask(0o077)
    if config.get("drop_to"):
        uid, gid = config["drop_to"]
        _linux.drop_privileges(uid, gid)
    if config.get("seccomp") is not None or config.get("drop_to"):
        _harden(config.get("seccomp"))
    app = _import_app(config["app"], config.get("project_dir"))
    _serve(app, config, config.get("ready_fd"))


def _own_pid_namespace(limits: Limits) -> int:
    """Go on as pid 1 of a new pid namespace with a ``/proc`` of its own; this process stays
    behind, root, as its sandbox broker (:mod:`openenv.core.tools.broker`), until it exits.

    bubblewrap's ``/proc`` has read-only mounts over parts of it, and the kernel refuses a sandbox
    nested in ours (``openenv.core.tools`` running an agent's code) a ``/proc`` of its own while
    every ``/proc`` it could see is partly covered. Servers forked by the warden get a fresh one the
    same way. As pid 1, the server also inherits (and reaps) what its code sandboxes leave behind.
    """
    own_pid_namespace = _linux.open_pid_namespace()
    _linux.unshare(_linux.CLONE_NEWNS | _linux.CLONE_NEWPID)
    _linux.make_mounts_private()
    brokers, servers = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        _linux.die_with_parent()
        os.close(own_pid_namespace)
        brokers.close()
        _private_proc()
        return servers.detach()
    servers.close()
    _linux.children_in(own_pid_namespace)  # the broker's sandboxes: not in the server's namespace
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: _forward(pid, number))
    os._exit(broker.serve(brokers, pid, limits, None))


def _private_proc(hidden: Optional[List[str]] = None) -> None:
    """A mount namespace of the server's own, with its pid namespace's ``/proc`` (its broker keeps
    the ``/proc`` it sees itself by) and with ``hidden`` directories covered."""
    _linux.unshare(_linux.CLONE_NEWNS)
    _linux.make_mounts_private()
    for path in hidden or []:
        _linux.mount_tmpfs(path, mode="0000", size_mb=1)
    _linux.mount_proc()


# --- the warden ------------------------------------------------------------------------------------


class Warden:
    """The privileged helper of warm starts: forks isolated servers; runs no package code."""

    def __init__(self, config: Dict[str, Any], control: socket.socket) -> None:
        self.control = control
        self.app_path = config["app"]
        self.project_dir = config.get("project_dir")
        self.network = bool(config.get("network"))
        self.profile = config.get("seccomp", "strict")
        self.cgroups = [p for p in config.get("cgroups", []) if os.path.isdir(p)]
        self.tmp_views = [p for p in config.get("tmp_views", []) if os.path.isdir(p)]
        self.log_level = config.get("log_level", "warning")
        self.children: Dict[str, int] = {}
        self.exited: Dict[str, int] = {}
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # an optional part (uvloop, FastMCP) that this runtime lacks
                pass
        gc.collect()
        gc.freeze()  # what is here now is shared by every server: keep the collector off it

    def run(self) -> None:
        self._reply({"ok": True, "ready": True})
        while True:
            ready, _, _ = select.select([self.control], [], [], 1.0)
            self._reap()
            if not ready:
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.control, 65536, 8)
            except OSError:
                return
            if not data:
                for fd in fds:
                    os.close(fd)
                self.shutdown(2.0)  # the host went away
                return
            try:
                reply = self.handle(json.loads(data), fds)
            except Exception as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            finally:
                for fd in fds:
                    _close(fd)
            self._reply(reply)
            if reply.get("shutdown"):
                return

    def _reply(self, reply: Dict[str, Any]) -> None:
        try:
            self.control.sendall(json.dumps(reply).encode())
        except OSError:
            pass  # the host went away; what was asked is done anyway

    def handle(self, request: Dict[str, Any], fds: List[int]) -> Dict[str, Any]:
        op = request.get("op")
        if op == "spawn":
            return self.spawn(request, fds)
        if op == "stop":
            return self.stop(str(request["id"]), float(request.get("grace_s", 5.0)))
        if op == "status":
            server_id = str(request["id"])
            if server_id in self.exited:
                return {"ok": True, "running": False, "exit_code": self.exited[server_id]}
            return {"ok": True, "running": server_id in self.children}
        if op == "ping":
            return {"ok": True, "servers": len(self.children)}
        if op == "shutdown":
            self.shutdown(float(request.get("grace_s", 2.0)))
            return {"ok": True, "shutdown": True}
        return {"ok": False, "error": f"unknown op {op!r}"}

    def shutdown(self, grace_s: float) -> None:
        for server_id in list(self.children):
            self.stop(server_id, grace_s)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for server_id, child in list(self.children.items()):
                if child == pid:
                    del self.children[server_id]
                    self.exited[server_id] = os.waitstatus_to_exitcode(status)
                    self._cleanup(server_id)

    def spawn(self, request: Dict[str, Any], fds: List[int]) -> Dict[str, Any]:
        server_id = str(request["id"])
        if not server_id.isalnum() or server_id in self.children:
            raise ValueError(f"bad server id {server_id!r}")
        if len(fds) != 4:
            raise ValueError(f"spawn needs 4 descriptors (socket, log, ready, config), got {len(fds)}")
        uid, gid = int(request["uid"]), int(request["gid"])
        if uid <= 0 or gid <= 0:
            raise ValueError("a server never runs as root")
        limits = Limits(**request["limits"])
        cgroups = []
        for root in self.cgroups:
            path = os.path.join(root, server_id)
            try:
                os.mkdir(path)
                _limit(path, limits)
                cgroups.append(path)
            except OSError as exc:
                print(f"openenv sandbox: no cgroup for {server_id}: {exc}", file=sys.stderr, flush=True)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = self._child(server_id, cgroups, uid, gid, limits, fds)
            except BaseException as exc:
                print(f"openenv sandbox: server {server_id} could not start: {exc}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        self.children[server_id] = pid
        return {"ok": True}

    def _child(self, server_id: str, cgroups: list, uid: int, gid: int, limits: Limits, fds: List[int]) -> int:
        """The forked intermediate process: isolate, start the server as pid 1, wait for it."""
        _linux.die_with_parent()
        self.control.close()
        for path in cgroups:
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        flags = _linux.CLONE_NEWNS | _linux.CLONE_NEWPID | _linux.CLONE_NEWIPC | _linux.CLONE_NEWUTS
        if not self.network:
            flags |= _linux.CLONE_NEWNET
        own_pid_namespace = _linux.open_pid_namespace()
        _linux.unshare(flags)
        _linux.make_mounts_private()
        views = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in self.tmp_views]
        _linux.mount_tmpfs("/tmp", size_mb=limits.tmp_size_mb)
        for path, fd in views:  # the code directories under /tmp, hidden by the fresh tmpfs
            os.makedirs(path, 0o755, exist_ok=True)
            _linux.bind_mount_readonly(f"/proc/self/fd/{fd}", path)
            os.close(fd)
        brokers, servers = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(own_pid_namespace)
                brokers.close()
                code = self._server(uid, gid, limits, fds, servers.detach())
            except BaseException as exc:
                print(f"openenv sandbox: server {server_id} failed: {exc}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        servers.close()
        _linux.children_in(own_pid_namespace)  # the broker's sandboxes: not in the server's namespace
        signal.signal(signal.SIGTERM, lambda *_: _forward(pid, signal.SIGTERM))
        _linux.close_fds((1, 2, brokers.fileno()))
        # From here on this process is the server's broker: root, no package code, outside the
        # server's pid and mount namespaces; the server's code runs reach it over `brokers`.
        return broker.serve(brokers, pid, limits, broker.cgroups_under(cgroups))

    def _server(self, uid: int, gid: int, limits: Limits, fds: List[int], broker_fd: int) -> int:
        """The server: pid 1 of its namespaces, unprivileged, limited; the package is imported here."""
        listen_fd, log_fd, ready_fd, config_fd = fds
        _linux.die_with_parent()
        _private_proc(hidden=self.cgroups)  # every server's cgroups, its own included
        if not self.network:
            _linux.loopback_up()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        _linux.close_fds((0, 1, 2, listen_fd, ready_fd, config_fd, broker_fd))
        os.umask(0o077)
        _linux.drop_privileges(uid, gid)
        limits.apply()
        _harden(self.profile)
        env = json.loads(_read_bounded(config_fd, MAX_CONFIG_BYTES) or b"{}")
        os.close(config_fd)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", **env})
        os.environ[broker.BROKER_FD_ENV] = str(broker_fd)
        os.chdir("/tmp")
        gc.unfreeze()
        app = _import_app(self.app_path, self.project_dir)
        _warm_up(app)
        _serve(app, {"listen_fd": listen_fd, "log_level": self.log_level}, ready_fd)
        return 0

    def stop(self, server_id: str, grace_s: float) -> Dict[str, Any]:
        pid = self.children.get(server_id)
        if pid is None:
            self._cleanup(server_id)
            return {"ok": True, "exit_code": self.exited.pop(server_id, None)}
        _forward(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        status: Optional[int] = None
        while time.monotonic() < deadline:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = raw
                break
            time.sleep(0.005)
        if status is None:
            _forward(pid, signal.SIGKILL)  # its server dies with it (PR_SET_PDEATHSIG), and all below
            _, status = os.waitpid(pid, 0)
        del self.children[server_id]
        self._cleanup(server_id)
        return {"ok": True, "exit_code": os.waitstatus_to_exitcode(status)}

    def _cleanup(self, server_id: str) -> None:
        for root in self.cgroups:
            path = os.path.join(root, server_id)
            if os.path.isdir(path):  # runs its broker could not end (it was killed): theirs first
                for entry in os.scandir(path):
                    if entry.is_dir(follow_symlinks=False):
                        _rmdir_when_empty(entry.path)
            _rmdir_when_empty(path)


def _rmdir_when_empty(path: str) -> None:
    """Remove a cgroup directory, waiting a little for its last processes to be reaped."""
    for _ in range(50):  # the cgroup empties as its last process is reaped
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                return
            time.sleep(0.01)


def _read_bounded(fd: int, limit: int) -> bytes:
    chunks: List[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ValueError(f"the server's configuration is larger than {limit} bytes")
        chunks.append(chunk)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _limit(path: str, limits: Limits) -> None:
    mib = 1024 * 1024
    settings = []
    if limits.memory_mb is not None:
        settings += [("memory.limit_in_bytes", limits.memory_mb * mib), ("memory.max", limits.memory_mb * mib)]
    if limits.max_processes is not None:
        settings.append(("pids.max", limits.max_processes))
    for name, value in settings:
        target = os.path.join(path, name)
        if os.path.exists(target):
            with open(target, "w") as f:
                f.write(str(value))


def _forward(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def main() -> None:
    config = json.loads(os.environ.pop("OPENENV_SANDBOX_CONFIG"))
    if config["mode"] == "warden":
        _linux.die_with_parent()
        control = socket.socket(fileno=int(config["control_fd"]))
        Warden(config, control).run()
    else:
        single(config)


if __name__ == "__main__":
    main()
