"""Linux system calls the sandbox's warden and servers need, through ctypes (Python 3.10 has no os.unshare)."""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import struct
from pathlib import Path
from typing import Iterable, List, Optional

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def open_pid_namespace() -> int:
    """This process's pid namespace, to go back to with :func:`children_in` after unsharing one."""
    return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)


def children_in(pid_namespace_fd: int) -> None:
    """Start children (and threads: the kernel refuses a thread to a process whose children go to
    another pid namespace) in the pid namespace ``pid_namespace_fd`` again; closes it."""
    try:
        setns(pid_namespace_fd, CLONE_NEWPID)
    finally:
        os.close(pid_namespace_fd)


def mount(source: str, target: str, fstype: Optional[str], flags: int, data: Optional[str] = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def make_mounts_private() -> None:
    mount("none", "/", None, MS_REC | MS_PRIVATE)


def mount_tmpfs(target: str, mode: str = "1777", size_mb: Optional[int] = None) -> None:
    options = f"mode={mode}" + (f",size={size_mb}m" if size_mb else "")
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options)


def mount_proc(target: str = "/proc") -> None:
    mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def bind_mount(source: str, target: str) -> None:
    mount(source, target, None, MS_BIND | MS_REC)


def bind_mount_readonly(source: str, target: str) -> None:
    mount(source, target, None, MS_BIND | MS_REC)
    mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def no_new_privileges() -> None:
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def loopback_up() -> None:
    """Bring ``lo`` up in a fresh network namespace (it starts down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


def drop_privileges(uid: int, gid: int) -> None:
    """Become ``uid``/``gid`` for good (no supplementary groups, no way back)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def close_fds(keep: Iterable[int] = (0, 1, 2)) -> None:
    """Close every inherited descriptor not in ``keep``."""
    keep = sorted(set(keep))
    low = 0
    for fd in [*keep, 1 << 20]:
        if fd > low:
            os.closerange(low, min(fd, os.sysconf("SC_OPEN_MAX")))
        low = fd + 1


def descendants(pid: int) -> List[int]:
    """Host pids of every process below ``pid`` (through each of its threads' children lists)."""
    found: List[int] = []
    frontier = [pid]
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
