"""Building blocks of the sandbox: limits, the filesystem view, bubblewrap arguments, cgroups.

The sandbox shows a process the system's read-only ``/usr`` and ``/etc``, the Python runtime it
runs on and the directories its imports come from (read-only), an empty private ``/tmp``, a fresh
``/proc`` and a minimal ``/dev`` — nothing of the host's home directories, other users' files or
the trainer's working tree. It runs in its own pid, ipc, uts, cgroup, mount and (unless asked
otherwise) network namespaces, under resource limits.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

logger = logging.getLogger("openenv.sandbox")

INSTALL_HINT = (
    "bwrap not found: install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: "
    "dnf install bubblewrap) or pass isolation='none' to run without a sandbox"
)

# Parts of the system every sandbox sees, read-only (absent ones are skipped).
SYSTEM_DIRS = ("/usr", "/etc", "/opt/conda")
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class IsolationError(RuntimeError):
    """The sandbox cannot be set up on this machine (the message says what to do)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of a sandbox. ``None`` leaves a resource unlimited.

    ``memory_mb`` bounds each process's address space (``RLIMIT_AS``) and, where cgroups allow,
    the whole sandbox's memory. ``cpu_seconds`` bounds each process's CPU time (off by default for
    servers, which live long). ``max_processes`` bounds processes and threads (``RLIMIT_NPROC`` on
    the sandbox's own uid, and the cgroup pids limit).
    """

    memory_mb: Optional[int] = 2048
    cpu_seconds: Optional[int] = None
    max_processes: Optional[int] = 256
    max_open_files: Optional[int] = 4096
    max_file_size_mb: Optional[int] = 1024
    tmp_size_mb: int = 512

    def rlimits(self) -> List[Tuple[int, int]]:
        """``(resource, value)`` pairs for :func:`resource.setrlimit`."""
        mib = 1024 * 1024
        pairs = [(resource.RLIMIT_CORE, 0)]
        if self.memory_mb is not None:
            pairs.append((resource.RLIMIT_AS, self.memory_mb * mib))
        if self.cpu_seconds is not None:
            pairs.append((resource.RLIMIT_CPU, self.cpu_seconds))
        if self.max_processes is not None:
            pairs.append((resource.RLIMIT_NPROC, self.max_processes))
        if self.max_open_files is not None:
            pairs.append((resource.RLIMIT_NOFILE, self.max_open_files))
        if self.max_file_size_mb is not None:
            pairs.append((resource.RLIMIT_FSIZE, self.max_file_size_mb * mib))
        return pairs

    def apply(self) -> None:
        """Set the rlimits on this process (and so on everything it starts)."""
        for which, value in self.rlimits():
            _soft, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY and value > hard:
                value = hard
            resource.setrlimit(which, (value, value))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Limits:
        return cls(**json.loads(text))


def find_bwrap() -> Optional[str]:
    return shutil.which("bwrap")


def require_bwrap() -> str:
    """The path of ``bwrap``, or :class:`IsolationError` saying how to install it."""
    path = find_bwrap()
    if path is None:
        raise IsolationError(INSTALL_HINT)
    return path


def privileged() -> bool:
    """Running as root: the sandbox is built without a user namespace and drops to its own uid."""
    return os.geteuid() == 0


def sandbox_uid() -> int:
    """A fresh, unprivileged uid for one sandbox (only used when running as root).

    Different sandboxes get different uids, so they cannot signal each other and ``RLIMIT_NPROC``
    counts each one's processes alone.
    """
    return 1_000_000 + uuid.uuid4().int % 1_000_000_000


_PROBE = r"""
import json, os, sys
paths = [p for p in sys.path if p and os.path.isdir(p)]
mapped = []
for finder in sys.meta_path:
    module = sys.modules.get(getattr(finder, "__module__", None) or "")
    mapping = getattr(module, "MAPPING", None)
    if isinstance(mapping, dict):
        mapped.extend(str(v) for v in mapping.values())
print(json.dumps({"executable": os.path.realpath(sys.executable), "python": sys.executable, "base_prefix": sys.base_prefix,
                  "prefix": sys.prefix, "paths": paths, "mapped": mapped}))
"""


@dataclass(frozen=True)
class RuntimeView:
    """What a Python interpreter needs to see: its runtime, its environment and its imports.

    ``executable`` is the interpreter to run in the sandbox: the one ``sys.executable`` names (a
    venv's own path, so the venv stays active; never a launcher shim such as pyenv's).
    """

    executable: str
    paths: Tuple[str, ...]


@functools.cache
def runtime_view(python: str) -> RuntimeView:
    """Directories ``python`` loads code from (found by asking it once; cached)."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60, cwd="/", check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise IsolationError(f"cannot run the environment's Python {python!r}: {exc}") from None
    info = json.loads(out.stdout)
    candidates = [info["base_prefix"], info["prefix"], os.path.dirname(os.path.dirname(info["executable"]))]
    candidates += info["paths"] + info["mapped"]
    return RuntimeView(
        executable=info["python"], paths=tuple(_outermost(os.path.realpath(p) for p in candidates if os.path.exists(p)))
    )


def _outermost(paths: Iterable[str]) -> List[str]:
    """The paths not inside another of them, in sorted order."""
    kept: List[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count(os.sep), p)):
        if not any(path == k or path.startswith(k.rstrip(os.sep) + os.sep) for k in kept):
            kept.append(path)
    return sorted(kept)


class BwrapCommand:
    """The ``bwrap`` argument list of one sandbox."""

    def __init__(self, bwrap: str, *, network: bool, tmp_size_mb: int = 512, shm_size_mb: int = 64) -> None:
        self.args: List[str] = [bwrap, "--die-with-parent", "--new-session"]
        self.pass_fds: List[int] = []  # descriptors bwrap reads (the seccomp program): pass, then close_fds()
        if privileged():
            # Root builds the namespaces directly; the sandboxed program drops to its own uid.
            self.args += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            self.args += ["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        if not network:
            self.args.append("--unshare-net")
        self._dirs: set = {"/"}
        self.views: List[str] = []  # the read-only code directories bound by view()
        for path in SYSTEM_LINKS:
            if os.path.islink(path):
                self.args += ["--symlink", os.readlink(path), path]
                self._dirs.add(path)
            elif os.path.isdir(path):
                self.ro_bind(path)
        for path in SYSTEM_DIRS:
            if os.path.isdir(path):
                self.ro_bind(path)
        self.args += ["--proc", "/proc", "--dev", "/dev"]
        self._dirs.update(("/proc", "/dev"))
        # bwrap's /dev is an unbounded tmpfs, and its /dev/shm a directory in it: code that fills
        # shared memory would take the host's RAM (and the OOM killer the server). Sized instead.
        self.tmpfs("/dev/shm", shm_size_mb)
        self.tmpfs("/tmp", tmp_size_mb)

    def _parents(self, dest: str) -> None:
        # bwrap makes missing parents mode 0700; a sandbox that drops to its own uid needs 0755.
        parts = Path(dest).parts[1:-1]
        current = ""
        for part in parts:
            current += "/" + part
            if current not in self._dirs:
                self.args += ["--perms", "0755", "--dir", current]
                self._dirs.add(current)

    def ro_bind(self, source: str, dest: Optional[str] = None) -> BwrapCommand:
        dest = dest or source
        self._parents(dest)
        self.args += ["--ro-bind", source, dest]
        self._dirs.add(dest)
        return self

    def bind(self, source: str, dest: Optional[str] = None) -> BwrapCommand:
        dest = dest or source
        self._parents(dest)
        self.args += ["--bind", source, dest]
        self._dirs.add(dest)
        return self

    def ro_bind_fd(self, fd: int, dest: str) -> BwrapCommand:
        """Bind the directory open at ``fd`` (opened by whoever asked for it) read-only at ``dest``;
        the caller keeps ``fd`` and must pass it to bwrap."""
        self._parents(dest)
        self.args += ["--ro-bind-fd", str(fd), dest]
        self._dirs.add(dest)
        return self

    def dir(self, path: str, perms: str = "0755") -> BwrapCommand:
        self._parents(path)
        self.args += ["--perms", perms, "--dir", path]
        self._dirs.add(path)
        return self

    def tmpfs(self, path: str, size_mb: Optional[int] = None, perms: str = "1777") -> BwrapCommand:
        """A private, size-bounded tmpfs at ``path``."""
        self._parents(path)
        self.args += ["--perms", perms]
        if size_mb is not None:
            self.args += ["--size", str(size_mb * 1024 * 1024)]
        self.args += ["--tmpfs", path]
        self._dirs.add(path)
        return self

    def info_fd(self, fd: int) -> BwrapCommand:
        """bwrap writes the sandbox's pid (as JSON) to ``fd``."""
        self.args += ["--info-fd", str(fd)]
        return self

    def seccomp(self, profile: str = "strict") -> BwrapCommand:
        """Run the sandboxed program under seccomp ``profile`` (see :mod:`.seccomp`), and, in a
        user namespace, with no way to create another one (``--disable-userns``)."""
        from . import seccomp

        fd = seccomp.program_fd(profile)
        self.pass_fds.append(fd)
        self.args += ["--seccomp", str(fd)]
        if not privileged() and profile == "strict":
            self.args.append("--disable-userns")
        return self

    def close_fds(self) -> None:
        """Close this process's copies of :attr:`pass_fds` (once the sandbox has started)."""
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pass_fds.clear()

    def chdir(self, path: str) -> BwrapCommand:
        self.args += ["--chdir", path]
        return self

    def view(self, runtime: RuntimeView, extra: Sequence[str] = ()) -> BwrapCommand:
        """Bind a runtime's directories and ``extra`` ones, read-only."""
        for path in _outermost([*runtime.paths, *(os.path.realpath(p) for p in extra)]):
            if not any(path == d or path.startswith(d.rstrip("/") + "/") for d in SYSTEM_DIRS if os.path.isdir(d)):
                self.ro_bind(path)
                self.views.append(path)
        return self

    def command(self, argv: Sequence[str]) -> List[str]:
        # The sandbox's root is a tmpfs of bwrap's; read-only, nothing can be written outside the
        # binds and tmpfs mounts (and memory cannot be filled through it).
        return [*self.args, "--remount-ro", "/dev", "--remount-ro", "/", "--", *argv]


def sandbox_environment(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """A clean environment for a sandboxed process (secrets go here, never on a command line)."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra or {})
    return env


# --- cgroups -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupRoots:
    """Directories under which this process may create cgroups: v1 ``memory``/``pids`` or v2."""

    version: int
    memory: Optional[str] = None
    pids: Optional[str] = None

    @property
    def dirs(self) -> List[str]:
        return [d for d in (self.memory, self.pids) if d] if self.version == 1 else [self.memory] if self.memory else []

    def sweep(self) -> None:
        """Remove empty cgroups left by sandboxes of processes that have died (named openenv-<pid>-...)."""
        for root in self.dirs:
            for path in Path(root).glob("openenv-*"):
                parts = path.name.split("-")
                if len(parts) < 3 or not parts[1].isdigit() or _pid_exists(int(parts[1])):
                    continue
                for child in sorted(path.glob("*/"), reverse=True):
                    if (child / "cgroup.procs").exists():
                        _rmdir(str(child))
                _rmdir(str(path))


_CGROUP_WARNED = False


def cgroup_roots() -> Optional[CgroupRoots]:
    """Where per-sandbox cgroups can be made, or None (logged once) when nowhere."""
    global _CGROUP_WARNED
    reason = None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        lines, reason = [], str(exc)
    v1: Dict[str, str] = {}
    v2: Optional[str] = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = path
        for controller in controllers.split(","):
            if controller in ("memory", "pids"):
                v1[controller] = path
    roots: Optional[CgroupRoots] = None
    if v1:
        memory = f"/sys/fs/cgroup/memory{v1['memory']}" if "memory" in v1 else None
        pids = f"/sys/fs/cgroup/pids{v1['pids']}" if "pids" in v1 else None
        usable = [d for d in (memory, pids) if d and os.access(d, os.W_OK)]
        if usable:
            roots = CgroupRoots(1, memory if memory in usable else None, pids if pids in usable else None)
        else:
            reason = "the cgroup v1 memory/pids hierarchies are not writable"
    elif v2 is not None:
        base = "/sys/fs/cgroup" + v2
        if os.access(base, os.W_OK) and "memory" in _read(os.path.join(base, "cgroup.controllers")):
            roots = CgroupRoots(2, memory=base)
        else:
            reason = f"cgroup v2 at {base} is not delegated to this user"
    else:
        reason = reason or "no cgroup hierarchy found"
    if roots is None and not _CGROUP_WARNED:
        _CGROUP_WARNED = True
        logger.warning(
            "cgroup limits unavailable (%s): sandbox memory and process limits rely on rlimits alone", reason
        )
    return roots


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


class Cgroup:
    """One cgroup (per controller hierarchy) with memory and pids limits; best effort."""

    def __init__(self, roots: CgroupRoots, name: str, memory_bytes: Optional[int], pids_max: Optional[int]) -> None:
        self.dirs: List[str] = []
        for root in roots.dirs:
            path = os.path.join(root, name)
            os.makedirs(path, exist_ok=True)
            self.dirs.append(path)
        if roots.version == 2:
            parent = roots.memory
            assert parent is not None
            _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
            if memory_bytes is not None:
                _write(os.path.join(self.dirs[0], "memory.max"), str(memory_bytes))
                _write(os.path.join(self.dirs[0], "memory.swap.max"), "0")
            if pids_max is not None:
                _write(os.path.join(self.dirs[0], "pids.max"), str(pids_max))
        else:
            for path in self.dirs:
                if memory_bytes is not None and path.startswith("/sys/fs/cgroup/memory"):
                    _write(os.path.join(path, "memory.limit_in_bytes"), str(memory_bytes))
                    _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(memory_bytes))
                if pids_max is not None and path.startswith("/sys/fs/cgroup/pids"):
                    _write(os.path.join(path, "pids.max"), str(pids_max))

    def add(self, pid: int) -> None:
        for path in self.dirs:
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def remove(self) -> None:
        for path in self.dirs:
            for child in sorted(Path(path).glob("*/"), reverse=True):
                if (child / "cgroup.procs").exists():
                    _rmdir(str(child))
            _rmdir(path)


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        if not path.endswith("memsw.limit_in_bytes") and not path.endswith("swap.max"):
            logger.debug("cgroup write %s=%s failed: %s", path, value, exc)


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError as exc:
        logger.debug("cgroup %s not removed: %s", path, exc)


def python_command(python: Optional[str]) -> str:
    return python or sys.executable
