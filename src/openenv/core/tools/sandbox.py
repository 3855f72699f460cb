"""Starting one code sandbox here: what to start (:class:`SandboxSpec`), what it is shown of
Python, its cgroup, and the running sandbox itself (:class:`LocalSandbox`: its process, pipes and
kill).

:mod:`.executor` runs code in such sandboxes; :mod:`.broker` starts them for a sandboxed server
that may not start them itself; :mod:`openenv.core.harness.process` starts an agent harness with
the same launcher. Each takes what it needs from here, so none of them reaches into another.
"""

from __future__ import annotations

import base64
import functools
import json
import keyword
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

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
from openenv.core.utils import popen_lasting

logger = logging.getLogger("openenv.tools")

Isolation = Literal["sandbox", "none"]
FileContent = Union[str, bytes]

WORKSPACE = "/workspace"
"""The sandbox's working directory: private, writable, starts with the caller's ``files``."""
CONTROL = "/run/openenv"
"""Where the launcher, its helpers and the code's script are, inside the sandbox."""

_HERE = Path(__file__).resolve().parent
LAUNCHER = str(_HERE / "_launcher.py")
"""The launcher on the host: it reads its configuration from a pipe and starts the program."""
_TREE = str(_HERE / "_tree.py")
_REPL_WORKER = str(_HERE / "_repl_worker.py")
SITE = f"{CONTROL}/site"
"""Where the packages a sandbox was given (``packages=``) appear; it is on the code's ``PYTHONPATH``."""
_MIB = 1024 * 1024
_KILL_WAIT_S = 5.0  # how long a killed tree may take to disappear
START_WAIT_S = 30.0
"""How long bwrap may take to build a sandbox."""


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
class Interpreter:
    """A real interpreter as a code sandbox shows it: its binary, its standard library (with
    ``lib-dynload``) and shared library, none of its site directories (``hidden``), and only the
    ``packages`` asked for (import name -> its directories or module file)."""

    executable: str
    binds: Tuple[str, ...]
    hidden: Tuple[str, ...]
    packages: Tuple[Tuple[str, Tuple[str, ...]], ...]


@functools.lru_cache(maxsize=64)
def resolve_interpreter(python: str, packages: Tuple[str, ...]) -> Interpreter:
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
    return Interpreter(
        executable=info["executable"],
        binds=(info["executable"], info["stdlib"], *info["shared"]),
        hidden=tuple(info["site"]),
        packages=tuple((name, tuple(paths)) for name, paths in info["packages"].items()),
    )


def show_interpreter(
    cmd: BwrapCommand,
    interpreter: Interpreter,
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
                hidden.update(resolve_interpreter(os.path.realpath(other), ()).hidden)
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


def encode_files(files: Optional[Mapping[str, FileContent]]) -> Dict[str, Any]:
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
class SandboxSpec:
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


def keyctl_number() -> Optional[int]:
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


def _remove_when_empty(cgroup: Cgroup, seconds: float = 60.0) -> None:
    """Remove ``cgroup`` once the processes still leaving it have (on a thread of its own)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
        cgroup.remove()
        if not any(os.path.exists(d) for d in cgroup.dirs):
            return
    logger.warning("cgroup %s not removed: processes still in it after %.0f s", cgroup.dirs, seconds)


def make_cgroup(limits: Limits) -> Optional[Cgroup]:
    """A fresh memory/pids cgroup for one sandbox, sized by ``limits``; None where cgroups are not
    writable (the rlimits still hold)."""
    roots = cgroup_roots() if _cgroup_parent is _AUTO else _cgroup_parent
    if roots is None:
        return None
    memory = limits.memory_mb * _MIB if limits.memory_mb is not None else None
    try:
        return Cgroup(roots, f"openenv-tools-{uuid.uuid4().hex[:16]}", memory, limits.max_processes)
    except OSError as exc:
        logger.debug("no cgroup for this sandbox: %s", exc)
        return None


class LocalSandbox:
    """One running sandbox (or, with isolation 'none', one plain process group).

    Owns the process, its pipes, its cgroup and (isolation 'none') its scratch directory.
    ``kill()`` ends the whole tree and waits until it is gone; ``close()`` releases the rest.
    """

    def __init__(self, spec: SandboxSpec) -> None:
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

    def _start(self, spec: SandboxSpec, child_fds: List[int]) -> None:
        python = python_command(spec.python)
        python = shutil.which(python) or python  # the launcher execs it: a path, not a name
        sandboxed = spec.isolation == "sandbox"
        bwrap = require_bwrap() if sandboxed else None
        interpreter = resolve_interpreter(python, tuple(spec.packages)) if sandboxed else None
        self.cgroup = make_cgroup(spec.limits)
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
            pythonpath = show_interpreter(cmd, interpreter, spec.import_paths, spec.import_fds)
            launcher, worker = f"{CONTROL}/launcher.py", f"{CONTROL}/repl_worker.py"
            cmd.ro_bind(LAUNCHER, launcher).ro_bind(_TREE, f"{CONTROL}/_tree.py").ro_bind(_REPL_WORKER, worker)
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
            launcher, worker = LAUNCHER, _REPL_WORKER
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
            "keyctl": keyctl_number(),
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
            self.proc = popen_lasting(  # bwrap dies with the thread that forks it
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
            write_all(config_w, json.dumps(config).encode() + b"\n" + (spec.tree or b""))
        except BrokenPipeError:
            pass  # the launcher is gone: the caller finds out why from launch_error()
        finally:
            self._close_fds([config_w] + ([info_r] if sandboxed else []))

    def _read_info(self, info_r: int) -> None:
        """Learn the sandbox's pid 1 from bwrap (``--info-fd``); no info means bwrap failed."""
        data = b""
        deadline = time.monotonic() + START_WAIT_S
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
            else:  # a killed process still exiting (a loaded machine): its cgroup goes once it has
                threading.Thread(target=_remove_when_empty, args=(self.cgroup,), daemon=True).start()
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


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the (blocking) descriptor ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


__all__ = [
    "CONTROL",
    "LAUNCHER",
    "SITE",
    "START_WAIT_S",
    "WORKSPACE",
    "FileContent",
    "Interpreter",
    "Isolation",
    "LocalSandbox",
    "SandboxSpec",
    "checked_file_name",
    "checked_package_name",
    "close_all",
    "encode_files",
    "keyctl_number",
    "launch_error",
    "make_cgroup",
    "resolve_interpreter",
    "set_cgroup_parent",
    "show_interpreter",
    "write_all",
]
