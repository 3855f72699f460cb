"""The program that runs inside a sandbox: serve one environment app, or be its zygote.

Configuration arrives as JSON in ``$OPENENV_SANDBOX_CONFIG`` (never on the command line).

``single`` mode applies the limits and serves the app on a Unix socket (or TCP port).

``zygote`` mode imports the app once, warms it up (one environment instance is built and
closed, so lazy imports happen here), and then serves requests on a control socket: each
``spawn`` forks a server that is fully set up within milliseconds. The forked server gets namespaces
of its own (mount, pid, ipc, uts, and network unless allowed), a fresh ``/tmp`` and ``/proc``, its
own socket directory (the others, and the control socket, are hidden from it), its cgroup, rlimits,
a uid of its own, and no descriptor of the zygote's. A ``stop`` ends it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import errno
import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import sys
import time
from typing import Any, Dict, Optional

from . import _linux
from .isolation import Limits

SERVER_DIR = "/run/openenv"  # each server's socket directory, inside its sandbox
SOCKET_NAME = "env.sock"
LOG_NAME = "server.log"


def _import_app(app_path: str, project_dir: Optional[str]) -> Any:
    if project_dir and project_dir not in sys.path:
        sys.path.insert(0, project_dir)
    module_name, _, attribute = app_path.partition(":")
    module = importlib.import_module(module_name)
    app = module
    for part in attribute.split("."):
        app = getattr(app, part)
    return app


def _warm_up(app: Any) -> None:
    """Build and close one environment so that its lazy imports happen before forking."""
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


def _serve(app: Any, uds: Optional[str], port: Optional[int], log_level: str, host: str = "127.0.0.1") -> None:
    from openenv.core.env_server.runner import run_server

    if uds:
        run_server(app, uds=uds, log_level=log_level)
    else:
        run_server(app, host=host, port=int(port or 8000), log_level=log_level)


def single(config: Dict[str, Any]) -> None:
    """Serve the app in this process (sandboxed by bwrap already, or not sandboxed at all)."""
    _linux.die_with_parent()
    if os.getppid() == 1 and config.get("parent_pid") not in (None, 1):
        return  # the parent died before we could ask to die with it
    if config.get("drop_to"):  # root inside a bwrap sandbox without a user namespace
        _own_pid_namespace()
    Limits(**config["limits"]).apply()
    os.umask(0o077)
    if config.get("drop_to"):
        uid, gid = config["drop_to"]
        _linux.drop_privileges(uid, gid)
        _linux.no_new_privileges()
    app = _import_app(config["app"], config.get("project_dir"))
    _serve(
        app, config.get("uds"), config.get("port"), config.get("log_level", "warning"), config.get("host", "127.0.0.1")
    )


def _own_pid_namespace() -> None:
    """Go on as pid 1 of a new pid namespace with a ``/proc`` of its own; this process waits for it.

    bubblewrap's ``/proc`` has read-only mounts over parts of it, and the kernel refuses a sandbox
    nested in ours (``openenv.core.tools`` running an agent's code) a ``/proc`` of its own while
    every ``/proc`` it could see is partly covered. Servers forked by the zygote get a fresh one the
    same way. As pid 1, the server also inherits (and reaps) what its code sandboxes leave behind.
    """
    _linux.unshare(_linux.CLONE_NEWNS | _linux.CLONE_NEWPID)
    _linux.make_mounts_private()
    pid = os.fork()
    if pid == 0:
        _linux.die_with_parent()
        _linux.mount_proc()
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: _forward(pid, number))
    os._exit(_exit_code(pid))


def _exit_code(pid: int) -> int:
    """Wait for the child ``pid`` and return its exit status as one byte (0 if already reaped)."""
    try:
        _, status = os.waitpid(pid, 0)  # retried by Python when a signal interrupts it
    except ChildProcessError:
        return 0
    return os.waitstatus_to_exitcode(status) & 0xFF


# --- zygote --------------------------------------------------------------------------------------


class Zygote:
    def __init__(self, config: Dict[str, Any]) -> None:
        self.config = config
        self.root = config["root"]  # the shared socket root inside the zygote's sandbox
        self.network = bool(config.get("network"))
        self.cgroups = [p for p in config.get("cgroups", []) if os.path.isdir(p)]
        self.tmp_views = [p for p in config.get("tmp_views", []) if os.path.isdir(p)]
        self.log_level = config.get("log_level", "warning")
        self.children: Dict[str, int] = {}
        self.exited: Dict[str, int] = {}
        self.last_words: Dict[str, str] = {}  # the log tail of servers that exited on their own
        self.app = _import_app(config["app"], config.get("project_dir"))
        _warm_up(self.app)
        import threading

        if threading.active_count() > 1:  # forking copies one thread: the others' locks could stay held
            names = ", ".join(t.name for t in threading.enumerate())
            print(
                f"openenv sandbox: the app started threads at import ({names}); forked servers lose them",
                file=sys.stderr,
                flush=True,
            )
        gc.collect()
        gc.freeze()  # what is here now is shared by every server: keep the collector off it

    def run(self) -> None:
        control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = os.path.join(self.root, "control.sock")
        control.bind(path)
        os.chmod(path, 0o600)
        control.listen(16)
        while True:
            ready, _, _ = select.select([control], [], [], 1.0)
            self._reap()
            if not ready:
                continue
            connection, _ = control.accept()
            with connection:
                line = _read_line(connection)
                if not line.strip():
                    continue  # a readiness probe: connected and left
                try:
                    reply = self.handle(json.loads(line))
                except Exception as exc:
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                try:
                    connection.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass  # the provider went away; what was asked is done anyway
            if reply.get("shutdown"):
                return

    def handle(self, request: Dict[str, Any]) -> Dict[str, Any]:
        op = request.get("op")
        if op == "spawn":
            return self.spawn(request)
        if op == "stop":
            return self.stop(request["id"], float(request.get("grace_s", 5.0)))
        if op == "status":
            server_id = request["id"]
            if server_id in self.exited:
                return {
                    "ok": True,
                    "running": False,
                    "exit_code": self.exited[server_id],
                    "log": self.last_words.get(server_id, ""),
                }
            return {"ok": True, "running": server_id in self.children}
        if op == "ping":
            return {"ok": True, "servers": len(self.children)}
        if op == "shutdown":
            for server_id in list(self.children):
                self.stop(server_id, float(request.get("grace_s", 2.0)))
            return {"ok": True, "shutdown": True}
        return {"ok": False, "error": f"unknown op {op!r}"}

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
                    self.last_words[server_id] = _log_tail(os.path.join(self.root, server_id, LOG_NAME))
                    self._cleanup(server_id)

    def spawn(self, request: Dict[str, Any]) -> Dict[str, Any]:
        server_id = request["id"]
        uid, gid = int(request["uid"]), int(request["gid"])
        limits = Limits(**request["limits"])
        directory = os.path.join(self.root, server_id)
        os.mkdir(directory, 0o700)
        os.chown(directory, uid, gid)
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
                code = self._child(server_id, directory, cgroups, uid, gid, limits, request.get("env") or {})
            except BaseException as exc:
                print(f"openenv sandbox: server {server_id} could not start: {exc}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        self.children[server_id] = pid
        return {"ok": True}

    def _child(
        self, server_id: str, directory: str, cgroups: list, uid: int, gid: int, limits: Limits, env: Dict[str, str]
    ) -> int:
        """The forked intermediate process: isolate, start the server as pid 1, wait for it."""
        _linux.die_with_parent()
        for path in cgroups:
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        flags = _linux.CLONE_NEWNS | _linux.CLONE_NEWPID | _linux.CLONE_NEWIPC | _linux.CLONE_NEWUTS
        if not self.network:
            flags |= _linux.CLONE_NEWNET
        _linux.unshare(flags)
        _linux.make_mounts_private()
        views = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in self.tmp_views]
        _linux.mount_tmpfs("/tmp", size_mb=limits.tmp_size_mb)
        for path, fd in views:  # the code directories under /tmp, hidden by the fresh tmpfs
            os.makedirs(path, 0o755, exist_ok=True)
            _linux.bind_mount_readonly(f"/proc/self/fd/{fd}", path)
            os.close(fd)
        _linux.bind_mount(directory, SERVER_DIR)
        _linux.mount_tmpfs(self.root, mode="0000", size_mb=1)  # hide the other servers and the control socket
        for path in self.cgroups:
            _linux.mount_tmpfs(path, mode="0000", size_mb=1)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = self._server(uid, gid, limits, env)
            except BaseException as exc:
                print(f"openenv sandbox: server {server_id} failed: {exc}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        signal.signal(signal.SIGTERM, lambda *_: _forward(pid, signal.SIGTERM))
        _linux.close_fds((1, 2))
        _linux.drop_privileges(uid, gid)  # it only waits for the server from here on
        return _exit_code(pid)

    def _server(self, uid: int, gid: int, limits: Limits, env: Dict[str, str]) -> int:
        """The server: pid 1 of its namespace, unprivileged, limited."""
        _linux.die_with_parent()
        _linux.mount_proc()
        if not self.network:
            _linux.loopback_up()
        log = os.open(os.path.join(SERVER_DIR, LOG_NAME), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchown(log, uid, gid)
        os.dup2(log, 1)
        os.dup2(log, 2)
        _linux.close_fds((0, 1, 2))
        os.umask(0o077)
        _linux.drop_privileges(uid, gid)
        _linux.no_new_privileges()
        limits.apply()
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", **env})
        os.chdir("/tmp")
        gc.unfreeze()
        _serve(self.app, os.path.join(SERVER_DIR, SOCKET_NAME), None, self.log_level)
        return 0

    def stop(self, server_id: str, grace_s: float) -> Dict[str, Any]:
        pid = self.children.get(server_id)
        if pid is None:
            self._cleanup(server_id)
            self.last_words.pop(server_id, None)
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
            for _ in range(50):  # the cgroup empties as its last process is reaped
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    time.sleep(0.01)
        shutil.rmtree(os.path.join(self.root, server_id), ignore_errors=True)


def _log_tail(path: str, size: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


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


def _read_line(connection: socket.socket) -> bytes:
    data = b""
    connection.settimeout(10.0)
    try:
        while not data.endswith(b"\n"):
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return b""
    return data


def main() -> None:
    config = json.loads(os.environ.pop("OPENENV_SANDBOX_CONFIG"))
    if config["mode"] == "zygote":
        Zygote(config).run()
    else:
        single(config)


if __name__ == "__main__":
    main()
