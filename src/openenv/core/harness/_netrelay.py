"""The first program in a harness sandbox: it starts the agent and relays its only network.

Standard library only; run inside the sandbox as ``python -I -S _netrelay.py CONFIG_FD STATUS_FD``
next to the code sandbox's ``_launcher.py`` (whose set-up steps it reuses). The sandbox has a
network namespace of its own with nothing but loopback, so the agent reaches no host port. For
each service the host offers (the capture proxy, the environment's MCP bridge) the host's Unix
socket is bound into the sandbox under ``/run/openenv/services`` and this program listens on
``127.0.0.1:<port>`` *inside* the sandbox: every connection accepted there is spliced to a fresh
connection to that socket, bytes both ways, half-closes passed on. The agent is only configured
with ``http://127.0.0.1:<port>``.

Steps: read the JSON config from ``CONFIG_FD`` (never a command line); join a fresh session
keyring; join the per-sandbox cgroups; hand the workspace and home mount points to the agent's
uid; listen on the service ports; fork the agent, which takes its own session, becomes the
kernel's first choice when memory runs out, drops to its own uid (as root), sets the rlimits and
execs the command (its failure, e.g. a command not on ``PATH``, comes back on a close-on-exec
pipe). Then this process says ``R`` (or ``E<why>``) on ``STATUS_FD``, drops every capability,
makes itself undumpable (a same-uid agent cannot open its descriptors through ``/proc``), relays,
and exits with the agent's status once the agent's main process has exited: being the sandbox's
pid 2, its exit ends the sandbox's init, and the kernel then kills every process left in it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import sys
import threading
from typing import Any, Dict, List, Optional

PR_SET_DUMPABLE = 4
_CAP_VERSION_3 = 0x20080522
_CHUNK = 65536
_STATUS_CODES = {errno.ENOENT: "not found", errno.EACCES: "permission denied", errno.ENOEXEC: "not an executable"}


def _read_all(fd: int) -> bytes:
    chunks: List[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _drop_capabilities() -> None:
    """Give up every capability (the relay, as root, keeps its uid and so the sockets it may open)."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(_CAP_VERSION_3, 0), (Data * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"capset: {os.strerror(code)}")


def _listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    return listener


def _exec_agent(config: Dict[str, Any], base: Any, exec_w: int) -> None:
    """In the forked child: become the agent (never returns)."""
    try:
        os.setsid()  # a process group of its own, apart from the relay
        base._first_to_die_when_out_of_memory()
        base._drop_privileges(config["uid"])
        base._die_with_parent()
        base._set_limits(config["rlimits"])
        try:
            os.chdir(config["cwd"])
        except OSError as exc:
            raise OSError(exc.errno, f"cannot enter the working directory {config['cwd']!r}: {exc.strerror}") from None
        os.closerange(3, exec_w)
        os.closerange(exec_w + 1, 1 << 16)
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)  # Python ignores them; the agent must not inherit that
        argv, env = config["argv"], config["env"]
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            what = _STATUS_CODES.get(exc.errno or 0, exc.strerror or str(exc))
            where = "" if "/" in argv[0] else f" on the sandbox's PATH ({env.get('PATH', '')})"
            raise OSError(exc.errno, f"command {argv[0]!r}: {what}{where}") from None
    except BaseException as exc:  # every failure must reach the host
        message = exc.args[1] if isinstance(exc, OSError) and len(exc.args) > 1 else f"{type(exc).__name__}: {exc}"
        try:
            os.write(exec_w, str(message).encode(errors="replace")[:4000])
        except OSError:
            pass
    os._exit(127)


class _Relay:
    """Accepts on one loopback port and splices each connection to one Unix socket."""

    def __init__(self, listener: socket.socket, target: str, slots: threading.BoundedSemaphore) -> None:
        self.listener, self.target, self.slots = listener, target, slots
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            self.slots.acquire()  # bounded: more connections wait in the listen backlog
            try:
                client, _ = self.listener.accept()
            except OSError:
                self.slots.release()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Replies arrive in pieces (headers, then body): Nagle would hold the second one back
            # until the agent's delayed ACK, some 40 ms later.
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                upstream.connect(self.target)
            except OSError as exc:
                print(f"[openenv sandbox] cannot reach {self.target}: {exc}", file=sys.stderr, flush=True)
                return
            other = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            other.start()
            _pump(client, upstream)
            other.join()
        finally:
            client.close()
            upstream.close()
            self.slots.release()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until end of stream, then pass the half-close on."""
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    try:
        while True:
            n = source.recv_into(buffer)
            if not n:
                break
            sink.sendall(view[:n])
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for end in (source, sink):  # a reset on one side: end both directions
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _exit_status(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main() -> None:
    config_fd, status_fd = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(status_fd, False)
    pid: Optional[int] = None
    try:
        config = json.loads(_read_all(config_fd))
        os.close(config_fd)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _launcher as base  # the code sandbox's launcher, bound next to this file

        base._join_fresh_session_keyring(config.get("keyctl"))
        for fd in config["cgroup_fds"]:
            try:
                os.write(fd, b"0")  # this process, and everything it starts, into the sandbox's cgroups
            except OSError:
                pass  # best effort: the rlimits still hold
            os.close(fd)
        uid = config["uid"]
        if uid is not None:
            for path in config["chown"]:
                os.chown(path, uid, uid)
        relays = [(_listen(service["port"]), service["socket"]) for service in config["services"]]
        exec_r, exec_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            os.close(exec_r)
            _exec_agent(config, base, exec_w)
        os.close(exec_w)
        failure = _read_all(exec_r)  # end of file: the exec succeeded
        os.close(exec_r)
        if failure:
            os.waitpid(pid, 0)
            os.write(status_fd, b"E" + failure)
            os._exit(126)
        _drop_capabilities()
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        for fd in (0, 1):  # the agent's pipes: the host sees end of file when the agent's side closes
            os.dup2(os.open(os.devnull, os.O_RDWR), fd)
        threading.stack_size(256 * 1024)
        slots = threading.BoundedSemaphore(int(config.get("max_connections", 256)))
        for listener, target in relays:
            _Relay(listener, target, slots)
        os.write(status_fd, b"R")
        os.close(status_fd)
    except BaseException as exc:  # every failure must reach the host
        try:
            os.write(status_fd, f"E{type(exc).__name__}: {exc}".encode(errors="replace")[:4000])
        except OSError:
            pass
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(126)
    _, status = os.waitpid(pid, 0)
    sys.stderr.flush()
    os._exit(_exit_status(status))  # the sandbox ends with its pid 2: everything left in it is killed


if __name__ == "__main__":
    main()
