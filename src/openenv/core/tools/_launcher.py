"""The launcher: the first program run inside a code sandbox (standard library only).

Run as ``python -I -S _launcher.py CONFIG_FD STATUS_FD``. It reads a JSON config line from
``CONFIG_FD`` (never from the command line: code and files are not visible in ``ps``), then: gives
itself a fresh anonymous session keyring (the trainer's keys are left behind), marks itself and
everything it starts as the kernel's first choice when memory runs out (``oom_score_adj`` 1000:
the agent's code dies, not the server), writes the script and the caller's files, joins the
per-sandbox cgroups, drops to the sandbox's own uid (when started as root), sets the resource
limits and execs the program. ``STATUS_FD`` is close-on-exec: the host reads ``L`` (the launcher
ran) and, only if setting up failed, an error message after it; end-of-file right after ``L``
means the program was started.

With ``"tree": true`` the launcher does not exec but stays, as the only holder of the result
pipe (``result_fd``): it unpacks the work directory that follows the config line into the
workspace (format: :mod:`_tree`), forks the program, waits for it (``timeout_s``), kills every
process left (the whole sandbox, when ``kill_all``), then packs the workspace without following
a link and writes ``length(header) | header JSON | tree`` to the result pipe. It is not
dumpable, so a same-uid program cannot open its descriptors through ``/proc``; as root (the
program runs as another uid) it cannot be signalled by the program either.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import resource
import select
import signal
import struct
import sys
import time
from typing import Any, Dict, List, Optional

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
KEYCTL_JOIN_SESSION_KEYRING = 1
TIMEOUT_EXIT_CODE = 124
_ENOSYS, _EPERM = 38, 1

_libc: Optional[Any] = None


def _c() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _read_all(fd: int) -> bytes:
    chunks: List[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_file(path: str, content: Any) -> None:
    data = base64.b64decode(content["b64"]) if isinstance(content, dict) else str(content).encode()
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}") from None


def _set_limits(pairs: List[List[int]]) -> None:
    for which, value in pairs:
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY and value > hard:
            value = hard
        resource.setrlimit(which, (value, value))


def _prctl(option: int, value: int) -> None:
    try:
        _c().prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    # Cleared by a change of uid, so set after dropping privileges; best effort.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _join_fresh_session_keyring(number: Optional[int]) -> None:
    """keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): a new, empty, anonymous session keyring."""
    if number is None:
        return
    libc = _c()
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(number), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_void_p(None)) < 0:
        code = ctypes.get_errno()
        if code not in (_ENOSYS, _EPERM):  # no keyrings in this kernel, or a filter that forbids them all
            raise OSError(code, f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(code)}")


def _first_to_die_when_out_of_memory() -> None:
    # Raising one's own oom_score_adj needs no privilege; children inherit it.
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")


def _drop_privileges(uid: Optional[int]) -> None:
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            raise RuntimeError("could not drop root privileges")


def _exec(config: Dict[str, Any], keep: set) -> None:
    """Become the program (privileges dropped, limits set): only the descriptors in ``keep``,
    default signals, then exec."""
    os.chdir(config["workspace"])
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    for fd in config["keep_fds"]:
        os.set_inheritable(fd, True)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)  # Python ignores them; the program must not inherit that
    argv = config["argv"]
    os.execve(argv[0], argv, config["env"])


def launch(config: Dict[str, Any], status_fd: int, tree: bytes) -> None:
    _join_fresh_session_keyring(config.get("keyctl"))
    _first_to_die_when_out_of_memory()
    workspace = config["workspace"]
    if config.get("script") is not None:
        _write_file(os.path.join(config["control"], config["script_name"]), config["script"])
    for fd in config["cgroup_fds"]:
        try:
            os.write(fd, b"0")  # "0" moves the writing process; everything it starts follows
        except OSError:
            pass  # cgroups are best effort: the rlimits below still hold
        os.close(fd)
    uid = config["uid"]
    if uid is not None:
        os.chown(workspace, uid, uid)
    if config.get("tree"):
        _run_on_tree(config, status_fd, tree)
        return
    _drop_privileges(uid)
    _die_with_parent()
    _set_limits(config["rlimits"])
    for name, content in config["files"].items():
        _write_file(os.path.join(workspace, name), content)
    os.set_inheritable(status_fd, False)
    _exec(config, set(config["keep_fds"]) | {0, 1, 2, status_fd})


# --- tree mode ---------------------------------------------------------------------------------


def _run_on_tree(config: Dict[str, Any], status_fd: int, tree: bytes) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _tree  # next to this file, in the sandbox too

    _prctl(PR_SET_DUMPABLE, 0)  # no same-uid process may open /proc/<this>/fd/* or read its memory
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans come back here, so that all of them are reaped
    workspace, result_fd = config["workspace"], config["result_fd"]
    os.set_inheritable(result_fd, False)
    limit, entries = config["max_tree_bytes"], config["max_tree_entries"]
    _tree.unpack(tree, workspace, limit, entries, uid=config["uid"])
    del tree
    pid = os.fork()
    if pid == 0:
        try:
            os.close(result_fd)
            if not config["kill_all"]:
                os.setpgid(0, 0)
            _drop_privileges(config["uid"])
            _die_with_parent()
            _set_limits(config["rlimits"])
            _exec(config, {0, 1, 2})
        except BaseException as exc:
            os.write(2, f"[the command could not be started: {type(exc).__name__}: {exc}]\n".encode(errors="replace"))
        os._exit(126)
    os.close(status_fd)  # set up: the host reads "L" and end-of-file
    status, timed_out = _wait(pid, config["timeout_s"])
    _kill_the_rest(pid, config["kill_all"])
    header: Dict[str, Any] = {"exit_code": status, "timed_out": timed_out}
    packed = b""
    try:
        packed, refused = _tree.pack(workspace, limit, entries)
        header["refused"] = refused[:100]
    except (OSError, _tree.TreeError) as exc:
        header["error"] = str(exc)
    encoded = json.dumps(header).encode()
    _write_all(result_fd, struct.pack(">I", len(encoded)) + encoded + packed)
    os.close(result_fd)


def _exit_status(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _wait(pid: int, timeout_s: float) -> tuple:
    """The program's exit status (shell style), and whether it ran out of time and was killed."""
    deadline = time.monotonic() + timeout_s
    try:
        pidfd: Optional[int] = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return _exit_status(status), False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if pidfd is not None:
                select.select([pidfd], [], [], remaining)
            else:
                time.sleep(min(remaining, 0.01))
    finally:
        if pidfd is not None:
            os.close(pidfd)
    _kill_group(pid)
    os.waitpid(pid, 0)
    return TIMEOUT_EXIT_CODE, True


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _kill_the_rest(pid: int, kill_all: bool) -> None:
    """Kill and reap every process the program left, so that the workspace holds still."""
    if not kill_all:  # no sandbox: only the program's own process group is ours to kill
        _kill_group(pid)
        for _ in range(100):
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        return
    while True:
        try:
            os.kill(-1, signal.SIGKILL)  # in the sandbox's pid namespace: all but its init and us
        except OSError:
            pass
        try:
            os.waitpid(-1, 0)  # a subreaper: every process left is, or becomes, our child
        except ChildProcessError:
            return


def main() -> None:
    config_fd, status_fd = int(sys.argv[1]), int(sys.argv[2])
    os.write(status_fd, b"L")
    try:
        data = _read_all(config_fd)
        os.close(config_fd)
        line, _, tree = data.partition(b"\n")
        config = json.loads(line)
        if config.get("kill_all") and os.getpid() != 2:
            raise RuntimeError(f"not the first process of a sandbox (pid {os.getpid()}): refusing to kill all")
        launch(config, status_fd, tree)
    except BaseException as exc:
        try:
            os.write(status_fd, f"{type(exc).__name__}: {exc}".encode(errors="replace")[:4000])
        except OSError:
            pass
        os._exit(126)


if __name__ == "__main__":
    main()
