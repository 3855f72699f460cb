"""The launcher: the first program run inside a code sandbox (standard library only).

Run as ``python -I -S _launcher.py CONFIG_FD STATUS_FD``. It reads a JSON config from
``CONFIG_FD`` (never from the command line: code and files are not visible in ``ps``), then:
writes the script and the caller's files, joins the per-sandbox cgroups, drops to the sandbox's
own uid (when started as root), sets the resource limits and execs the program. ``STATUS_FD``
is close-on-exec: the host reads ``L`` (the launcher ran) and, only if setting up failed, an
error message after it; end-of-file right after ``L`` means the program was started.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any, Dict, List

PR_SET_PDEATHSIG = 1


def _read_all(fd: int) -> bytes:
    chunks: List[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


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


def _die_with_parent() -> None:
    # Cleared by a change of uid, so set after dropping privileges; best effort.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def launch(config: Dict[str, Any], status_fd: int) -> None:
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
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            raise RuntimeError("could not drop root privileges")
    _die_with_parent()
    _set_limits(config["rlimits"])
    for name, content in config["files"].items():
        _write_file(os.path.join(workspace, name), content)
    os.chdir(workspace)
    keep = set(config["keep_fds"]) | {0, 1, 2, status_fd}
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    for fd in config["keep_fds"]:
        os.set_inheritable(fd, True)
    os.set_inheritable(status_fd, False)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)  # Python ignores them; the program must not inherit that
    argv = config["argv"]
    os.execve(argv[0], argv, dict(os.environ))


def main() -> None:
    config_fd, status_fd = int(sys.argv[1]), int(sys.argv[2])
    os.write(status_fd, b"L")
    try:
        config = json.loads(_read_all(config_fd))
        os.close(config_fd)
        launch(config, status_fd)
    except BaseException as exc:
        os.write(status_fd, f"{type(exc).__name__}: {exc}".encode(errors="replace")[:4000])
        os._exit(126)


if __name__ == "__main__":
    main()
