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
import base64
import functools
import json
import keyword
import logging
import math
import os
import re
import select
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from openenv.core.containers.runtime import seccomp
from openenv.core.containers.runtime.isolation import (
    BwrapCommand,
    Cgroup,
    CgroupRoots,
    IsolationError,
    Limits,
    cgroup_roots,
    privileged,
    python_command,
    require_bwrap,
    sandbox_environment,
    sandbox_uid,
)
from openenv.core.env_server.types import CodeExecResult

logger = logging.getLogger("openenv.tools")

Isolation = Literal["sandbox", "none"]
FileContent = Union[str, bytes]

CODE_LIMITS = Limits(
    memory_mb=512, cpu_seconds=None, max_processes=64, max_open_files=256, max_file_size_mb=64, tmp_size_mb=256
)
"""Default limits for code: 512 MiB of address space per process (and for the whole sandbox where
cgroups allow), 64 processes/threads, 256 open files, 64 MiB per file, 256 MiB for each of
``/tmp`` and ``/workspace``. One-shot calls also get ``cpu_seconds`` = the timeout rounded up,
plus one."""

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
TIMEOUT_EXIT_CODE = 124
WORKSPACE = "/workspace"
"""The sandbox's working directory: private, writable, starts with the caller's ``files``."""
CONTROL = "/run/openenv"

_HERE = Path(__file__).resolve().parent
_LAUNCHER = str(_HERE / "_launcher.py")
_TREE = str(_HERE / "_tree.py")
_REPL_WORKER = str(_HERE / "_repl_worker.py")
SITE = f"{CONTROL}/site"
"""Where the packages a sandbox was given (``packages=``) appear; it is on the code's ``PYTHONPATH``."""
_MIB = 1024 * 1024
_KILL_WAIT_S = 5.0  # how long a killed tree may take to disappear
_DRAIN_S = 2.0  # how long output may keep arriving once the tree is dead or killed
_START_WAIT_S = 30.0  # how long bwrap may take to build the sandbox


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


# --- starting sandboxes ------------------------------------------------------------------------

_spawner: Optional[ThreadPoolExecutor] = None
_spawner_lock = threading.Lock()
_warned_unsandboxed = False


def _popen(argv: List[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` run on one long-lived thread.

    bwrap's ``--die-with-parent`` (and the launcher's parent-death signal) fire when the *thread*
    that forked them exits; a server's worker thread may exit while a REPL's sandbox lives on.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openenv-sandbox-spawner")
    return _spawner.submit(subprocess.Popen, argv, **kwargs).result()


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


# --- what the code sees of Python ------------------------------------------------------------

_INTERPRETER_PROBE = r"""
import importlib.util, json, os, site, sys, sysconfig
shared = []
if sysconfig.get_config_var("Py_ENABLE_SHARED"):
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    for name in {sysconfig.get_config_var("INSTSONAME"), sysconfig.get_config_var("LDLIBRARY")}:
        if name and os.path.exists(os.path.join(libdir, name)):
            shared.append(os.path.realpath(os.path.join(libdir, name)))
site_dirs = site.getsitepackages([sys.base_prefix, sys.prefix])
paths = sysconfig.get_paths()
# Where a package may be found: the standard library (os's directory, lib-dynload under it) and
# the site directories. Not "platstdlib": in a virtual environment that is the venv's lib/pythonX.Y.
roots = [os.path.dirname(os.__file__), *site_dirs, *(paths.get(k) for k in ("stdlib", "purelib", "platlib"))]
packages, missing = {}, []
for name in json.loads(sys.argv[1]):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or (not spec.submodule_search_locations and not (spec.origin and os.path.isfile(spec.origin))):
        missing.append(name)
        continue
    found = list(spec.submodule_search_locations or [spec.origin])
    found += [p + ".libs" for p in found if os.path.isdir(p + ".libs")]  # wheels' vendored libraries
    packages[name] = [os.path.realpath(p) for p in found]
print(json.dumps({
    "executable": os.path.realpath(sys.executable),
    "stdlib": os.path.realpath(os.path.dirname(os.__file__)),
    "shared": shared,
    "site": sorted({os.path.realpath(p) for p in site_dirs if os.path.isdir(p)}),
    "roots": sorted({os.path.realpath(p) for p in roots if p and os.path.isdir(p)}),
    "packages": packages,
    "missing": missing,
}))
"""

_PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def checked_package_name(name: Any) -> str:
    """``name`` if it is a top-level module name (an ASCII identifier, not a keyword); else ValueError.

    A sandbox is shown whole top-level packages, so a dotted name has nothing to add (and
    resolving one would import its parent package), and a name like ``"."``, ``"/proc"`` or
    ``"proc/self"`` is a path, never a module: none of them reaches the resolver."""
    if not isinstance(name, str) or not _PACKAGE_NAME.match(name) or keyword.iskeyword(name):
        raise ValueError(f"package {name!r} is not a top-level module name (such as 'numpy', not 'numpy.linalg')")
    return name


_SYSTEM_PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3")


@dataclass(frozen=True)
class _Interpreter:
    """A real interpreter as a code sandbox shows it: its binary, its standard library (with
    ``lib-dynload``) and shared library, none of its site directories (``hidden``), and only the
    ``packages`` asked for (import name -> its directories or module file)."""

    executable: str
    binds: Tuple[str, ...]
    hidden: Tuple[str, ...]
    packages: Tuple[Tuple[str, Tuple[str, ...]], ...]


@functools.lru_cache(maxsize=64)
def _interpreter(python: str, packages: Tuple[str, ...]) -> _Interpreter:
    """What a sandbox running ``python`` is shown: ValueError if a package name is not a module
    name, is not found, or is found outside ``python``'s standard library and site-packages."""
    for name in packages:
        checked_package_name(name)
    # Isolated mode (-I): no PYTHONPATH, no user site-packages, neither the current nor the
    # script's directory on sys.path; and an empty current directory all the same. Run from "/",
    # every top-level directory (/proc, /etc, /root) was a namespace package, bound as asked.
    try:
        with tempfile.TemporaryDirectory(prefix="openenv-resolve-") as empty:
            out = subprocess.run(
                [python, "-I", "-c", _INTERPRETER_PROBE, json.dumps(list(packages))],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=empty,
                check=True,
            )
        info = json.loads(out.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise IsolationError(f"cannot inspect the Python {python!r} the code is to run on: {exc}") from None
    if info["missing"]:
        raise ValueError(
            f"packages {info['missing']} are not importable by {python} from its standard library or "
            "site-packages: install them, name the top-level module, or pass a directory as import_paths="
        )
    roots = info["roots"]
    for name, paths in info["packages"].items():
        for path in paths:  # real paths: a link out of site-packages is judged by where it leads
            if not any(path.startswith(root.rstrip("/") + "/") for root in roots):
                raise ValueError(
                    f"package {name!r} is found at {path}, outside the standard library and site-packages of "
                    f"{python} ({', '.join(roots)}): a sandbox is shown installed packages only "
                    "(pass a directory of your own as import_paths=)"
                )
    return _Interpreter(
        executable=info["executable"],
        binds=(info["executable"], info["stdlib"], *info["shared"]),
        hidden=tuple(info["site"]),
        packages=tuple((name, tuple(paths)) for name, paths in info["packages"].items()),
    )


def _show_interpreter(
    cmd: BwrapCommand,
    interpreter: _Interpreter,
    import_paths: Sequence[str],
    import_fds: Sequence[Tuple[int, str]] = (),
) -> List[str]:
    """Bind the interpreter's standard library (read-only), hide its site directories, put each
    package under :data:`SITE`; the ``PYTHONPATH`` entries that make them importable."""
    from openenv.core.containers.runtime.isolation import SYSTEM_DIRS

    def shown(path: str) -> bool:
        return any(path == d or path.startswith(d.rstrip("/") + "/") for d in (*SYSTEM_DIRS, *cmd.views))

    for path in interpreter.binds:
        if not shown(path):
            cmd.ro_bind(path)
            if os.path.isdir(path):
                cmd.views.append(path)
    hidden = set(interpreter.hidden)
    for other in _SYSTEM_PYTHONS:  # what a shell command's `python3` runs: its site directories too
        if os.path.exists(other):
            try:
                hidden.update(_interpreter(os.path.realpath(other), ()).hidden)
            except (IsolationError, ValueError):
                pass  # a broken system Python shows nothing it could hide
    for path in sorted(hidden):
        if shown(path):
            cmd.tmpfs(path, size_mb=1, perms="0555")  # an empty directory the code cannot write
    pythonpath = []
    for _name, paths in interpreter.packages:
        for path in paths:
            cmd.ro_bind(path, f"{SITE}/{os.path.basename(path)}")
        pythonpath = [SITE]
    for path in import_paths:
        real = os.path.realpath(path)
        if not os.path.isdir(real):
            raise ValueError(f"import path {path!r} is not a directory")
        cmd.ro_bind(real)
        pythonpath.append(real)
    for fd, path in import_fds:  # opened by whoever asked (a server, through the broker): bound as is
        cmd.ro_bind_fd(fd, path)
        pythonpath.append(path)
    return pythonpath


def checked_file_name(name: str) -> str:
    """``name``, normalised, if it is a relative path inside the working directory; else ValueError."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or str(path) == ".":
        raise ValueError(f"file name {name!r} must be a relative path inside the working directory")
    return str(path)


def _encode_files(files: Optional[Mapping[str, FileContent]]) -> Dict[str, Any]:
    """Check the names (relative, inside the working directory) and make the contents JSON-safe."""
    encoded: Dict[str, Any] = {}
    for name, content in (files or {}).items():
        path = checked_file_name(name)
        if isinstance(content, bytes):
            encoded[str(path)] = {"b64": base64.b64encode(content).decode()}
        elif isinstance(content, str):
            encoded[str(path)] = content
        else:
            raise TypeError(f"content of file {name!r} must be str or bytes, not {type(content).__name__}")
    return encoded


@dataclass
class _Spec:
    """What to start. ``argv`` may name ``{python}``, ``{control}``, ``{worker}``, ``{request}``
    and ``{reply}``; ``script`` (if any) is written to ``{control}/{script_name}``."""

    argv: List[str]
    isolation: Isolation
    limits: Limits
    network: bool = False
    python: Optional[str] = None
    script: Optional[str] = None
    script_name: str = "main"
    files: Dict[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: bool = False
    channels: bool = False  # a request and a reply pipe (the REPL's protocol)
    packages: Tuple[str, ...] = ()  # importable in the sandbox besides the standard library
    import_paths: Tuple[str, ...] = ()
    tree: Optional[bytes] = None  # a packed work directory (_tree): the launcher's tree mode
    import_fds: Tuple[Tuple[int, str], ...] = ()  # (open directory, where) bound read-only: the broker's
    tree_timeout_s: float = 0.0  # the program's own timeout in tree mode
    max_tree_bytes: int = 0
    max_tree_entries: int = 100_000


def _keyctl_number() -> Optional[int]:
    """keyctl's system call number here, for the launcher (stdlib only) to join a fresh keyring."""
    try:
        return seccomp._syscall_number("keyctl")
    except (seccomp.SeccompUnavailable, OSError, ValueError, RuntimeError):
        return None


_AUTO = object()
_cgroup_parent: Any = _AUTO  # where per-sandbox cgroups go: found from /proc/self/cgroup unless set


def set_cgroup_parent(roots: Optional[CgroupRoots]) -> None:
    """Make per-sandbox cgroups under ``roots`` (None: none at all) instead of this process's own
    cgroups (the broker, whose cgroups are its server's)."""
    global _cgroup_parent
    _cgroup_parent = roots


def _make_cgroup(limits: Limits) -> Optional[Cgroup]:
    roots = cgroup_roots() if _cgroup_parent is _AUTO else _cgroup_parent
    if roots is None:
        return None
    memory = limits.memory_mb * _MIB if limits.memory_mb is not None else None
    try:
        return Cgroup(roots, f"openenv-tools-{uuid.uuid4().hex[:16]}", memory, limits.max_processes)
    except OSError as exc:
        logger.debug("no cgroup for this sandbox: %s", exc)
        return None


class _Sandbox:
    """One running sandbox (or, with isolation 'none', one plain process group).

    Owns the process, its pipes, its cgroup and (isolation 'none') its scratch directory.
    ``kill()`` ends the whole tree and waits until it is gone; ``close()`` releases the rest.
    """

    def __init__(self, spec: _Spec) -> None:
        self.isolation = spec.isolation
        self.proc: Optional[subprocess.Popen] = None
        self.cgroup: Optional[Cgroup] = None
        self.scratch: Optional[str] = None
        self.init_pid: Optional[int] = None  # the sandbox's pid 1, as the host sees it
        self.init_pidfd: Optional[int] = None
        self.exit_fd: Optional[int] = None  # readable once the process we started has exited
        self.status_r: Optional[int] = None
        self.result_r: Optional[int] = None  # tree mode: the launcher's result pipe
        self.request_w: Optional[int] = None
        self.reply_r: Optional[int] = None
        self.exited = False
        self._dead = False
        child_fds: List[int] = []
        try:
            self._start(spec, child_fds)
        except BaseException:
            self._close_fds(child_fds)
            self.kill()
            self.close()
            raise
        self._close_fds(child_fds)

    @staticmethod
    def _close_fds(fds: List[int]) -> None:
        close_all(fds)
        fds.clear()

    def _pipe(self, child_fds: List[int], child_reads: bool) -> tuple:
        r, w = os.pipe()
        child_fds.append(r if child_reads else w)
        return r, w

    def _start(self, spec: _Spec, child_fds: List[int]) -> None:
        python = python_command(spec.python)
        python = shutil.which(python) or python  # the launcher execs it: a path, not a name
        sandboxed = spec.isolation == "sandbox"
        bwrap = require_bwrap() if sandboxed else None
        interpreter = _interpreter(python, tuple(spec.packages)) if sandboxed else None
        self.cgroup = _make_cgroup(spec.limits)
        cgroup_fds = []
        for path in self.cgroup.dirs if self.cgroup else []:
            cgroup_fds.append(os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY))
            child_fds.append(cgroup_fds[-1])
        config_r, config_w = self._pipe(child_fds, child_reads=True)
        self.status_r, status_w = self._pipe(child_fds, child_reads=False)
        keep_fds: List[int] = []
        request_r = reply_w = result_w = -1
        if spec.channels:
            request_r, self.request_w = self._pipe(child_fds, child_reads=True)
            self.reply_r, reply_w = self._pipe(child_fds, child_reads=False)
            keep_fds = [request_r, reply_w]
        if spec.tree is not None:
            self.result_r, result_w = self._pipe(child_fds, child_reads=False)
        info_r = -1
        pythonpath: List[str] = []
        if sandboxed:
            assert bwrap is not None and interpreter is not None
            python = interpreter.executable  # the real binary: no venv, no site-packages
            control, workspace = CONTROL, WORKSPACE
            script_bytes = len(spec.script.encode()) if spec.script else 0
            cmd = BwrapCommand(bwrap, network=spec.network, tmp_size_mb=spec.limits.tmp_size_mb)
            cmd.tmpfs(CONTROL, size_mb=script_bytes // _MIB + 1, perms="0755")
            pythonpath = _show_interpreter(cmd, interpreter, spec.import_paths, spec.import_fds)
            launcher, worker = f"{CONTROL}/launcher.py", f"{CONTROL}/repl_worker.py"
            cmd.ro_bind(_LAUNCHER, launcher).ro_bind(_TREE, f"{CONTROL}/_tree.py").ro_bind(_REPL_WORKER, worker)
            cmd.tmpfs(WORKSPACE, size_mb=spec.limits.tmp_size_mb, perms="0755")
            info_r, info_w = self._pipe(child_fds, child_reads=False)
            cmd.info_fd(info_w)
            cmd.chdir(WORKSPACE)
            try:
                cmd.seccomp("strict")
            except seccomp.SeccompUnavailable as exc:
                raise IsolationError(str(exc)) from None
            child_fds.extend(cmd.pass_fds)
            cmd.pass_fds.clear()  # closed with the other child descriptors once bwrap has started
            argv = cmd.command([python, "-I", "-S", launcher, str(config_r), str(status_w)])
            cwd = "/"
        else:
            self.scratch = tempfile.mkdtemp(prefix="openenv-exec-")
            control, workspace = self.scratch, os.path.join(self.scratch, "workspace")
            os.mkdir(workspace)
            launcher, worker = _LAUNCHER, _REPL_WORKER
            argv = [python, "-I", "-S", launcher, str(config_r), str(status_w)]
            cwd = workspace
        names = {"python": python, "control": control, "worker": worker, "request": request_r, "reply": reply_w}
        home = {} if sandboxed else {"HOME": workspace}  # not the host's /tmp
        config = {
            "control": control,
            "workspace": workspace,
            "script": spec.script,
            "script_name": spec.script_name,
            "files": spec.files,
            "cgroup_fds": cgroup_fds,
            "uid": sandbox_uid() if sandboxed and privileged() else None,
            "rlimits": spec.limits.rlimits(),
            "keep_fds": keep_fds,
            "argv": [part.format(**names) for part in spec.argv],
            "keyctl": _keyctl_number(),
            "env": sandbox_environment({"PYTHONPATH": ":".join([workspace, *pythonpath]), **home, **spec.env}),
        }
        if spec.tree is not None:
            config.update(
                tree=True,
                result_fd=result_w,
                timeout_s=spec.tree_timeout_s,
                kill_all=sandboxed,
                max_tree_bytes=spec.max_tree_bytes,
                max_tree_entries=spec.max_tree_entries,
            )
        try:
            self.proc = _popen(
                argv,
                stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=[*child_fds, *(fd for fd, _path in spec.import_fds)],
                start_new_session=True,
                # The code's own variables travel in its configuration: bwrap (root, perhaps)
                # and the launcher start with nothing of the caller's (no LD_PRELOAD, say).
                env=sandbox_environment(),
                cwd=cwd,
            )
            self._close_fds(child_fds)
            try:
                self.exit_fd = os.pidfd_open(self.proc.pid)
            except (AttributeError, OSError):
                self.exit_fd = None  # no pidfds (Linux < 5.3): exits are polled
            if sandboxed:
                self._read_info(info_r)
            _write_all(config_w, json.dumps(config).encode() + b"\n" + (spec.tree or b""))
        except BrokenPipeError:
            pass  # the launcher is gone: the caller finds out why from launch_error()
        finally:
            self._close_fds([config_w] + ([info_r] if sandboxed else []))

    def _read_info(self, info_r: int) -> None:
        """Learn the sandbox's pid 1 from bwrap (``--info-fd``); no info means bwrap failed."""
        data = b""
        deadline = time.monotonic() + _START_WAIT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([info_r], [], [], deadline - time.monotonic())
            chunk = os.read(info_r, 4096) if ready else b""
            if not chunk:
                break
            data += chunk
        if not data:
            assert self.proc is not None
            self.kill()
            stderr = self.proc.stderr.read().decode(errors="replace").strip() if self.proc.stderr else ""
            raise IsolationError(f"the sandbox could not be set up: {stderr or 'bwrap gave no reason'}")
        self.init_pid = int(json.loads(data)["child-pid"])
        try:
            self.init_pidfd = os.pidfd_open(self.init_pid)
        except (AttributeError, OSError):
            self.init_pidfd = None

    @property
    def stdout(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.fileno()

    @property
    def stdin(self) -> int:
        assert self.proc is not None and self.proc.stdin is not None
        return self.proc.stdin.fileno()

    def close_stdin(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()

    @property
    def stderr(self) -> int:
        assert self.proc is not None and self.proc.stderr is not None
        return self.proc.stderr.fileno()

    def poll_exit(self) -> bool:
        """Whether the process has exited; it stays unreaped, so its pid (and group id) stay ours."""
        if not self.exited and self.proc is not None:
            try:
                self.exited = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            except ChildProcessError:
                self.exited = True
        return self.exited

    def kill(self) -> None:
        """Kill every process of the sandbox and wait (a few seconds at most) until they are gone.

        Idempotent. Until the process is reaped here its pid cannot be reused, so signalling its
        process group cannot hit a stranger."""
        if self._dead:
            return
        if self.init_pidfd is not None:
            try:
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            except OSError:
                pass  # already gone
        elif self.init_pid is not None and not self.poll_exit():
            _signal(self.init_pid)
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        if self.init_pidfd is not None:
            # pid 1 of a pid namespace exits only after every other process in it is gone.
            select.select([self.init_pidfd], [], [], _KILL_WAIT_S)
        self._kill_cgroup()
        if self.proc is not None:
            try:
                self.proc.wait(_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                logger.error("sandbox process %d did not die within %.0f s of SIGKILL", self.proc.pid, _KILL_WAIT_S)
                return
            self.exited = True
        self._reap_init()
        self._dead = True

    def _reap_init(self) -> None:
        """Reap the sandbox's init if it was re-parented to this process.

        When bubblewrap dies before its child (the sandbox's pid 1), that child goes to the nearest
        subreaper or to this pid namespace's init. On a host that is the system's init; but a server
        started by SandboxProvider is itself pid 1 of its namespace, and a zombie it never waits for
        counts against its process limit: a few hundred killed sandboxes later, none could start.
        """
        if self.init_pidfd is not None and hasattr(os, "P_PIDFD"):
            try:
                os.waitid(os.P_PIDFD, self.init_pidfd, os.WEXITED | os.WNOHANG)
            except OSError:
                pass  # not our child (bubblewrap reaped it, or the host's init will)
        elif self.init_pid is not None and os.getpid() == 1:
            try:
                os.waitpid(self.init_pid, os.WNOHANG)
            except OSError:
                pass

    def _kill_cgroup(self) -> None:
        if self.cgroup is None:
            return
        deadline = time.monotonic() + _KILL_WAIT_S
        while time.monotonic() < deadline:
            pids = [int(p) for d in self.cgroup.dirs for p in _read_lines(os.path.join(d, "cgroup.procs"))]
            if not pids:
                return
            for pid in pids:
                _signal(pid)
            time.sleep(0.005)

    @property
    def returncode(self) -> int:
        """The exit status, shell style: ``128 + N`` for a process killed by signal N."""
        assert self.proc is not None and self.proc.returncode is not None
        code = self.proc.returncode
        return 128 - code if code < 0 else code

    def launch_error(self) -> Optional[str]:
        """Why the code could not be started, or None if it was (ask only once the process ended)."""
        assert self.status_r is not None
        return launch_error(self.status_r)

    def close(self) -> None:
        """Release pipes, cgroup and scratch directory (after :meth:`kill`)."""
        for fd in (self.status_r, self.result_r, self.request_w, self.reply_r, self.init_pidfd, self.exit_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.status_r = self.result_r = self.request_w = self.reply_r = self.init_pidfd = self.exit_fd = None
        if self.proc is not None:
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
        if self.cgroup is not None:
            for _ in range(100):
                self.cgroup.remove()
                if not any(os.path.exists(d) for d in self.cgroup.dirs):
                    break
                time.sleep(0.01)
            else:
                logger.warning("cgroup %s not removed: processes still in it", self.cgroup.dirs)
            self.cgroup = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def close_all(fds: Sequence[int]) -> None:
    """Close each descriptor, ignoring those already closed."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def launch_error(status_r: int) -> Optional[str]:
    """What the launcher said on its status pipe: None if it started the program, else why not."""
    os.set_blocking(status_r, False)
    try:
        status = os.read(status_r, 8192)
    except BlockingIOError:
        status = b""
    if status == b"L":
        return None
    if status.startswith(b"L"):
        return status[1:].decode(errors="replace")
    return "the launcher did not run"


def _signal(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _read_lines(path: str) -> List[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def new_sandbox(spec: _Spec) -> Any:
    """Start ``spec``: here, or, in a sandboxed server that has one, through its broker (the
    server has no privilege, and may not make the namespaces a sandbox needs itself)."""
    if spec.isolation == "sandbox" and not privileged():
        from . import broker

        if broker.available():
            return broker.BrokeredSandbox(spec)
    return _Sandbox(spec)


# --- moving bytes ------------------------------------------------------------------------------


class _Streams:
    """Reads a sandbox's output pipes and feeds its input pipes, never blocking on any one of them."""

    def __init__(self, sandbox: _Sandbox) -> None:
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


def _run(spec: _Spec, *, stdin: Union[str, bytes, None], timeout_s: float, max_output_bytes: int) -> CodeExecResult:
    return _execute(spec, stdin=stdin, timeout_s=timeout_s, max_output_bytes=max_output_bytes)[0]


def _execute(
    spec: _Spec, *, stdin: Union[str, bytes, None], timeout_s: float, max_output_bytes: int, max_result_bytes: int = 0
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
    package's directory, read-only under :data:`SITE`; list dependencies too); ``import_paths``
    adds directories, read-only and on its ``PYTHONPATH``; both are ignored without a sandbox,
    where everything installed is importable. ``stdin`` is fed to it; ``env`` adds environment variables (the place for secrets). ``limits`` default to
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
    spec = _Spec(
        argv=["{python}", "{control}/main.py"],
        isolation=isolation,
        limits=_one_shot_limits(limits, timeout_s),
        network=network,
        python=python,
        script=code,
        script_name="main.py",
        files=_encode_files(files),
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
    spec = _Spec(
        argv=[_shell(), "{control}/main.sh"],
        isolation=isolation,
        limits=_one_shot_limits(limits, timeout_s),
        network=network,
        python=python,
        script=command,
        script_name="main.sh",
        files=_encode_files(files),
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
