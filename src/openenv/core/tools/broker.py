"""The sandbox broker: how a sandboxed server, which holds no privilege, still runs code in sandboxes.

A server that :class:`~openenv.core.containers.runtime.SandboxProvider` starts as root runs as a
uid of its own, with no capability, under the strict seccomp filter: it cannot make the
namespaces a code sandbox needs (no new user namespaces, no mounts), and the package it serves is
hostile by assumption. Beside it runs its **broker**: the process that started it, root in the
server's mount and network namespaces but outside its pid namespace, which never imports the
package. When the server's code calls :func:`~openenv.core.tools.run_python` (or a REPL, or a
work-directory run), the description of the run goes to the broker, which checks it, builds and
starts the sandbox itself — exactly as a run started by root directly: its own uid, its own
memory/pids cgroup under the server's, the strict seccomp filter, a fresh keyring — and hands
the run's pipes back. The server then talks to the code as it would to a sandbox it started.

Whatever could give a request privilege is the broker's choice, never the server's: the uid,
the cgroups, the limits (never above the server's own), the interpreter (one of those the broker
knows), what the code sees (the standard library, packages the broker finds by name, and
directories the *server* opened itself, passed as descriptors, so that nothing out of the
server's own reach can be shown), and the environment bubblewrap and the launcher start with.

Protocol, over ``SOCK_SEQPACKET`` socket pairs, JSON messages, descriptors with ``SCM_RIGHTS``:

* server → broker socket: ``run`` with descriptors ``[memfd, run socket, import dirs...]``; the
  memfd holds one JSON line (the run) and the packed work directory, if any, after it;
* broker → run socket: ``{"ok": true, "fds": [names]}`` with the run's pipes, or ``{"ok": false,
  "error": ...}``; later ``{"exited": true}`` once the program's process has ended;
* server → run socket: ``{"op": "kill"}``; the broker kills every process of the run, waits until
  they are gone and answers ``{"killed": true, "returncode": N}``;
* the server closes the run socket (or dies): the broker kills what is left and frees the run.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import socket
import stat
import sys
import threading
from dataclasses import asdict, fields
from typing import Any, Dict, List, Optional, Tuple

from openenv.core.containers.runtime.isolation import CgroupRoots, IsolationError, Limits

from .sandbox import (
    START_WAIT_S,
    LocalSandbox,
    SandboxSpec,
    checked_file_name,
    checked_package_name,
    close_all,
    launch_error,
    set_cgroup_parent,
    write_all,
)

BROKER_FD_ENV = "OPENENV_SANDBOX_BROKER_FD"
"""The descriptor of a sandboxed server's connection to its broker (set by the server's start-up)."""
MAX_REQUEST_BYTES = 512 * 1024 * 1024
MAX_RUNS = 64
"""Runs one server may have at once; more are refused (each holds a thread and a sandbox here)."""
MAX_IMPORT_DIRS = 16
_MESSAGE = 65536
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_SYSTEM_PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3")
_KILL_ANSWER_S = 30.0


class RunRefused(ValueError):
    """The broker refused to start a run (the message says why)."""


# --- the server's side ---------------------------------------------------------------------------

_client_lock = threading.Lock()
_client: Optional[socket.socket] = None


def available() -> bool:
    """Whether this process is a sandboxed server with a broker."""
    return os.environ.get(BROKER_FD_ENV, "").isdigit()


def _broker() -> socket.socket:
    global _client
    with _client_lock:
        if _client is None:
            fd = int(os.environ[BROKER_FD_ENV])
            try:
                sock = socket.socket(fileno=fd)
            except OSError as exc:
                raise IsolationError(f"{BROKER_FD_ENV}={fd} is not this server's sandbox broker: {exc}") from None
            if sock.type != socket.SOCK_SEQPACKET:
                sock.detach()
                raise IsolationError(f"{BROKER_FD_ENV}={fd} is not this server's sandbox broker (not a packet socket)")
            _client = sock
        return _client


def _describe(spec: Any) -> Dict[str, Any]:
    described = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name not in ("tree", "import_fds")}
    described["limits"] = asdict(spec.limits)
    described["env"] = dict(spec.env)
    described["packages"] = list(spec.packages)
    described["import_paths"] = []
    described["tree"] = spec.tree is not None
    return described


class BrokeredSandbox:
    """A sandbox the broker started for this server: the same interface as a local one (pipes,
    exit notice, ``kill``, ``returncode``, ``close``)."""

    isolation = "sandbox"

    def __init__(self, spec: Any) -> None:
        self.exited = False
        self._dead = False
        self._returncode: Optional[int] = None
        self.status_r = self.result_r = self.request_w = self.reply_r = None
        self._stdout = self._stderr = self._stdin = None
        import_fds: List[int] = []
        described = _describe(spec)
        try:
            for path in spec.import_paths:
                real = os.path.realpath(path)
                try:
                    import_fds.append(os.open(real, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
                except OSError:
                    raise ValueError(f"import path {path!r} is not a directory") from None
                described["import_paths"].append(real)
            if len(import_fds) > MAX_IMPORT_DIRS:
                raise ValueError(f"at most {MAX_IMPORT_DIRS} import paths, not {len(import_fds)}")
            payload = json.dumps(described).encode() + b"\n" + (spec.tree or b"")
            if len(payload) > MAX_REQUEST_BYTES:
                raise ValueError(f"the run is {len(payload)} bytes: more than the {MAX_REQUEST_BYTES} a run may carry")
            memfd = os.memfd_create("openenv-run", os.MFD_CLOEXEC)
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                write_all(memfd, payload)
                del payload
                try:
                    socket.send_fds(_broker(), [b"run"], [memfd, theirs.fileno(), *import_fds])
                except OSError as exc:
                    mine.close()
                    raise IsolationError(f"the server's sandbox broker is gone ({exc}): restart the server") from None
            finally:
                os.close(memfd)
                theirs.close()
        finally:
            close_all(import_fds)
        self.run_sock = mine
        self.exit_fd: Optional[int] = mine.fileno()
        try:
            self._receive_pipes()
        except BaseException:
            self.close()
            raise

    def _receive_pipes(self) -> None:
        self.run_sock.settimeout(START_WAIT_S + 30.0)
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.run_sock, _MESSAGE, 8)
        except OSError as exc:
            raise IsolationError(f"the sandbox broker did not answer: {exc}") from None
        self.run_sock.settimeout(None)
        reply = json.loads(data) if data else {"ok": False, "error": "the sandbox broker closed the run unanswered"}
        if not reply.get("ok"):
            close_all(fds)
            error = reply.get("error", "no reason given")
            raise (RunRefused if reply.get("refused") else IsolationError)(error)
        names = reply["fds"]
        if len(names) != len(fds):
            close_all(fds)
            raise IsolationError("the sandbox broker sent a malformed answer")
        for name, fd in zip(names, fds, strict=True):
            setattr(self, {"stdout": "_stdout", "stderr": "_stderr", "stdin": "_stdin"}.get(name, name), fd)

    @property
    def stdout(self) -> int:
        assert self._stdout is not None
        return self._stdout

    @property
    def stderr(self) -> int:
        assert self._stderr is not None
        return self._stderr

    @property
    def stdin(self) -> int:
        assert self._stdin is not None
        return self._stdin

    def close_stdin(self) -> None:
        if self._stdin is not None:
            os.close(self._stdin)
            self._stdin = None

    def poll_exit(self) -> bool:
        if not self.exited:
            ready, _, _ = select.select([self.run_sock], [], [], 0)
            self.exited = bool(ready)
        return self.exited

    def kill(self) -> None:
        """Have the broker kill every process of the run; returns once they are gone."""
        if self._dead:
            return
        self._dead = self.exited = True
        try:
            self.run_sock.sendall(b'{"op": "kill"}')
            self.run_sock.settimeout(_KILL_ANSWER_S)
            while True:
                data = self.run_sock.recv(_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                if message.get("killed"):
                    self._returncode = int(message["returncode"])
                    break
        except (OSError, ValueError):
            pass
        if self._returncode is None:
            self._returncode = 137  # the broker is gone, and the run with it

    @property
    def returncode(self) -> int:
        assert self._returncode is not None, "ask once the run has been killed"
        return self._returncode

    def launch_error(self) -> Optional[str]:
        assert self.status_r is not None
        return launch_error(self.status_r)

    def close(self) -> None:
        for name in ("status_r", "result_r", "request_w", "reply_r", "_stdout", "_stderr", "_stdin"):
            fd = getattr(self, name)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, None)
        if self.run_sock is not None:
            self.run_sock.close()
            self.exit_fd = None


# --- the broker's side ---------------------------------------------------------------------------


def _clamp(asked: Optional[int], ceiling: Optional[int]) -> Optional[int]:
    if ceiling is None:
        return asked
    return ceiling if asked is None else min(asked, ceiling)


def _allowed_pythons() -> Dict[str, str]:
    """realpath -> the path to run, of the interpreters a run may use: the broker's own and the system's."""
    allowed: Dict[str, str] = {}
    for path in (sys.executable, *_SYSTEM_PYTHONS):
        if path and os.path.exists(path):
            allowed.setdefault(os.path.realpath(path), path)
    return allowed


class Broker:
    """Starts the sandboxes its server asks for, as described in the module's documentation."""

    def __init__(self, sock: socket.socket, limits: Limits, cgroups: Optional[CgroupRoots]) -> None:
        self.sock = sock
        self.limits = limits
        self.pythons = _allowed_pythons()
        self.runs: Dict[int, _Run] = {}
        self.lock = threading.Lock()
        set_cgroup_parent(cgroups)

    def serve(self, server_pid: int) -> int:
        """Serve until the server ``server_pid`` exits; end every run; its exit status."""
        try:
            pidfd: Optional[int] = os.pidfd_open(server_pid)
        except (AttributeError, OSError):
            pidfd = None
        watched = [self.sock] + ([pidfd] if pidfd is not None else [])
        code: Optional[int] = None
        while code is None:
            ready, _, _ = select.select(watched, [], [], None if pidfd is not None else 0.5)
            if self.sock in ready and not self._accept():
                watched.remove(self.sock)  # the server closed its end: wait for it to exit
            done, status = os.waitpid(server_pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status) & 0xFF
        with self.lock:
            runs = list(self.runs.values())
        for run in runs:
            run.end()
        return code

    def _accept(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 64, 2 + MAX_IMPORT_DIRS)
        except OSError:
            return False
        if not data and not fds:
            return False
        if data != b"run" or len(fds) < 2:
            close_all(fds)
            return True
        memfd, run_fd, import_fds = fds[0], fds[1], fds[2:]
        try:
            run_sock = socket.socket(fileno=run_fd)
        except OSError:
            close_all(fds)
            return True
        with self.lock:
            busy = len(self.runs) >= MAX_RUNS
        if busy:
            close_all([memfd, *import_fds])
            _answer(run_sock, {"ok": False, "refused": True, "error": f"this server already has {MAX_RUNS} runs going"})
            run_sock.close()
            return True
        run = _Run(self, memfd, run_sock, import_fds)
        with self.lock:
            self.runs[id(run)] = run
        run.start()
        return True

    def finished(self, run: _Run) -> None:
        with self.lock:
            self.runs.pop(id(run), None)

    # --- checking what was asked -----------------------------------------------------------------

    def spec(self, memfd: int, import_fds: List[int]) -> Any:
        """The run described in ``memfd``, checked, with the broker's choices in it."""
        info = os.fstat(memfd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_REQUEST_BYTES:
            raise RunRefused(f"the run's description is not a file of at most {MAX_REQUEST_BYTES} bytes")
        data = os.pread(memfd, info.st_size, 0)
        line, _, tree = data.partition(b"\n")
        del data
        try:
            asked = json.loads(line)
        except ValueError as exc:
            raise RunRefused(f"the run's description is not JSON: {exc}") from None
        if not isinstance(asked, dict):
            raise RunRefused("the run's description is not an object")
        get = _Getter(asked)
        if get.text("isolation") != "sandbox":
            raise RunRefused("a server's broker starts sandboxed runs only")
        limits = get.obj("limits")
        ceiling = self.limits
        try:
            asked_limits = Limits(**{f.name: _Getter(limits).number(f.name, optional=True) for f in fields(Limits)})
        except TypeError as exc:
            raise RunRefused(f"limits: {exc}") from None
        checked_limits = Limits(
            memory_mb=_clamp(asked_limits.memory_mb, ceiling.memory_mb),
            cpu_seconds=_clamp(asked_limits.cpu_seconds, ceiling.cpu_seconds),
            max_processes=_clamp(asked_limits.max_processes, ceiling.max_processes),
            max_open_files=_clamp(asked_limits.max_open_files, ceiling.max_open_files),
            max_file_size_mb=_clamp(asked_limits.max_file_size_mb, ceiling.max_file_size_mb),
            tmp_size_mb=min(asked_limits.tmp_size_mb or ceiling.tmp_size_mb, ceiling.tmp_size_mb),
        )
        script_name = get.text("script_name")
        if not _FILE_NAME.match(script_name):
            raise RunRefused(f"script name {script_name!r} is not a plain file name")
        packages = get.texts("packages")
        for name in packages:  # where each is found, and whether it may be shown, LocalSandbox checks
            try:
                checked_package_name(name)
            except ValueError as exc:
                raise RunRefused(str(exc)) from None
        import_paths = get.texts("import_paths")
        if len(import_paths) != len(import_fds):
            raise RunRefused("each import path needs its open directory")
        for path, fd in zip(import_paths, import_fds, strict=True):
            if not os.path.isabs(path) or os.path.normpath(path) != path or path == "/":
                raise RunRefused(f"import path {path!r} is not a normalised absolute path")
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise RunRefused(f"import path {path!r} is not an open directory")
        has_tree = get.flag("tree")
        spec = SandboxSpec(
            argv=get.texts("argv"),
            isolation="sandbox",
            limits=checked_limits,
            network=get.flag("network"),
            python=self.python(asked.get("python")),
            script=get.text("script", optional=True),
            script_name=script_name,
            files=_files(get.obj("files")),
            env=_strings(get.obj("env"), "env"),
            stdin=get.flag("stdin"),
            channels=get.flag("channels"),
            packages=tuple(packages),
            import_fds=tuple(zip(import_fds, import_paths, strict=True)),
            tree=tree if has_tree else None,
            tree_timeout_s=float(get.number("tree_timeout_s", real=True)),
            max_tree_bytes=int(get.number("max_tree_bytes")),
            max_tree_entries=int(get.number("max_tree_entries")),
        )
        if not spec.argv or len(spec.argv) > 256:
            raise RunRefused("argv must hold 1 to 256 strings")
        if has_tree and not 0 < spec.tree_timeout_s <= 7 * 86400:
            raise RunRefused(f"tree_timeout_s {spec.tree_timeout_s} is out of range")
        return spec

    def python(self, asked: Any) -> str:
        """The interpreter to run: the broker's own by default, else one it knows (never the server's path)."""
        if asked is None:
            return self.pythons[os.path.realpath(sys.executable)]
        if not isinstance(asked, str):
            raise RunRefused("python must be a path")
        found = shutil.which(asked) or asked
        real = os.path.realpath(found) if os.path.isabs(found) else None
        if real not in self.pythons:
            known = ", ".join(sorted(set(self.pythons.values())))
            raise RunRefused(
                f"python {asked!r} is not an interpreter the sandbox broker runs code on (those are: {known})"
            )
        return self.pythons[real]


class _Getter:
    """Typed fields of a JSON object, refusing what has the wrong type."""

    def __init__(self, obj: Dict[str, Any]) -> None:
        self.obj_ = obj

    def _get(self, name: str, optional: bool) -> Any:
        if name not in self.obj_ or self.obj_[name] is None:
            if optional:
                return None
            raise RunRefused(f"the run's {name!r} is missing")
        return self.obj_[name]

    def text(self, name: str, optional: bool = False) -> Any:
        value = self._get(name, optional)
        if value is not None and not isinstance(value, str):
            raise RunRefused(f"the run's {name!r} must be a string")
        return value

    def texts(self, name: str) -> List[str]:
        value = self._get(name, False)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RunRefused(f"the run's {name!r} must be a list of strings")
        return value

    def flag(self, name: str) -> bool:
        value = self._get(name, False)
        if not isinstance(value, bool):
            raise RunRefused(f"the run's {name!r} must be true or false")
        return value

    def number(self, name: str, optional: bool = False, real: bool = False) -> Any:
        value = self._get(name, optional)
        kinds = (int, float) if real else (int,)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds) or value < 0):
            raise RunRefused(f"the run's {name!r} must be a non-negative number")
        return value

    def obj(self, name: str) -> Dict[str, Any]:
        value = self._get(name, False)
        if not isinstance(value, dict):
            raise RunRefused(f"the run's {name!r} must be an object")
        return value


def _strings(mapping: Dict[str, Any], what: str) -> Dict[str, str]:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise RunRefused(f"the run's {what} must map strings to strings")
    return dict(mapping)


def _files(mapping: Dict[str, Any]) -> Dict[str, Any]:
    """The run's files as sent (text, or ``{"b64": ...}``), names checked as a local run checks them."""
    checked: Dict[str, Any] = {}
    for name, content in mapping.items():
        if not (isinstance(content, str) or (isinstance(content, dict) and isinstance(content.get("b64"), str))):
            raise RunRefused(f"the content of file {name!r} is neither text nor base64")
        checked[checked_file_name(name)] = content if isinstance(content, str) else {"b64": content["b64"]}
    return checked


def _answer(sock: socket.socket, message: Dict[str, Any], fds: Tuple[int, ...] = ()) -> bool:
    data = json.dumps(message).encode()
    try:
        if fds:
            socket.send_fds(sock, [data], list(fds))
        else:
            sock.sendall(data)
        return True
    except OSError:
        return False


class _Run(threading.Thread):
    """One run: start its sandbox, hand its pipes over, report its end, kill it when asked."""

    def __init__(self, broker: Broker, memfd: int, run_sock: socket.socket, import_fds: List[int]) -> None:
        super().__init__(name="openenv-broker-run", daemon=True)
        self.broker, self.memfd, self.run_sock, self.import_fds = broker, memfd, run_sock, import_fds
        self.sandbox: Optional[LocalSandbox] = None
        self.lock = threading.Lock()
        self.ended = False

    def run(self) -> None:
        try:
            self._start_sandbox()
            if self.sandbox is not None:
                self._watch()
        finally:
            self.end()
            self.run_sock.close()
            self.broker.finished(self)

    def _start_sandbox(self) -> None:
        try:
            spec = self.broker.spec(self.memfd, self.import_fds)
            os.close(self.memfd)
            self.memfd = -1
            sandbox = LocalSandbox(spec)
        except ValueError as exc:  # RunRefused, or what LocalSandbox refuses (a package not found)
            _answer(self.run_sock, {"ok": False, "refused": True, "error": str(exc)})
            return
        except Exception as exc:
            _answer(self.run_sock, {"ok": False, "error": f"{exc}"})
            return
        finally:
            close_all([fd for fd in (self.memfd, *self.import_fds) if fd >= 0])
            self.memfd, self.import_fds = -1, []
        with self.lock:
            self.sandbox = sandbox
            if self.ended:  # the broker is shutting down
                return
        proc = sandbox.proc
        assert proc is not None
        handed: List[Tuple[str, Any]] = [("stdout", proc.stdout), ("stderr", proc.stderr), ("stdin", proc.stdin)]
        handed += [(name, getattr(sandbox, name)) for name in ("status_r", "result_r", "request_w", "reply_r")]
        present = [(name, item) for name, item in handed if item is not None]
        fds = tuple(item if isinstance(item, int) else item.fileno() for _name, item in present)
        _answer(self.run_sock, {"ok": True, "fds": [name for name, _item in present]}, fds)
        # The server holds them now; the run's end is all this side still watches.
        for name, item in present:
            if isinstance(item, int):
                os.close(item)
                setattr(sandbox, name, None)
            else:
                item.close()

    def _watch(self) -> None:
        sandbox = self.sandbox
        assert sandbox is not None
        told = False
        while True:
            watched: List[Any] = [self.run_sock]
            if not told and sandbox.exit_fd is not None:
                watched.append(sandbox.exit_fd)
            ready, _, _ = select.select(watched, [], [], None if sandbox.exit_fd is not None or told else 0.05)
            if not told and (sandbox.exit_fd in ready or (sandbox.exit_fd is None and sandbox.poll_exit())):
                told = True
                _answer(self.run_sock, {"exited": True})
            if self.run_sock not in ready:
                continue
            try:
                data = self.run_sock.recv(_MESSAGE)
            except OSError:
                data = b""
            if not data:
                return  # the server closed the run (or died): end() kills what is left
            try:
                op = json.loads(data).get("op")
            except (ValueError, AttributeError):
                op = None
            if op == "kill":
                with self.lock:
                    sandbox.kill()
                _answer(self.run_sock, {"killed": True, "returncode": sandbox.returncode})

    def end(self) -> None:
        """Kill and release the run's sandbox (idempotent; also called as the broker stops)."""
        with self.lock:
            self.ended = True
            sandbox, self.sandbox = self.sandbox, None
            if sandbox is not None:
                try:
                    sandbox.kill()
                finally:
                    sandbox.close()


def cgroups_under(server_cgroups: List[str]) -> Optional[CgroupRoots]:
    """Where a server's runs get cgroups of their own: under the server's cgroup v1 directories
    (``.../memory/<server>``, ``.../pids/<server>``). None on cgroup v2, where a cgroup with
    processes (the server's) may not have children with controllers: its runs share its limits."""
    memory = next((p for p in server_cgroups if "/memory" in p), None)
    pids = next((p for p in server_cgroups if "/pids" in p), None)
    if memory is None and pids is None:
        return None
    return CgroupRoots(1, memory=memory, pids=pids)


def serve(sock: socket.socket, server_pid: int, limits: Limits, cgroups: Optional[CgroupRoots]) -> int:
    """Be the broker of ``server_pid`` until it exits; its exit status."""
    return Broker(sock, limits, cgroups).serve(server_pid)


__all__ = ["BROKER_FD_ENV", "Broker", "BrokeredSandbox", "RunRefused", "available", "serve"]
