"""Seccomp filters for every sandbox, built with libseccomp (through the ``pyseccomp`` binding).

In the spirit of Docker's default profile, a filter refuses (``EPERM``) the system calls that a
sandboxed program has no business making and that widen the kernel's attack surface or reach
outside the sandbox:

* kernel keyrings (``keyctl``, ``add_key``, ``request_key``), except joining a fresh anonymous
  session keyring, which every sandbox does first (so the trainer's keyring is never possessed);
* file handles (``open_by_handle_at``, ``name_to_handle_at``: they open files by inode, past
  mount boundaries);
* debugging and reading other processes (``ptrace``, ``process_vm_readv/writev``, ``kcmp``,
  ``pidfd_getfd``), ``perf_event_open``, ``bpf``, ``userfaultfd``, ``io_uring_*``;
* mounts (``mount``, ``umount2``, ``pivot_root``, the new mount API, ``chroot``) and new user
  namespaces (``clone``/``unshare`` with ``CLONE_NEWUSER``, ``setns``; ``clone3``, whose flags a
  filter cannot read, answers ``ENOSYS`` so that the C library falls back to ``clone``);
* the machine's own state: ``kexec_*``, module loading, ``reboot``, ``swapon``, clocks, ``acct``,
  ``quotactl``, ``syslog``, ``iopl``/``ioperm`` and other obsolete calls.

System calls of another architecture (32-bit calls from a 64-bit process) kill the process.

Profiles: ``"strict"`` is all of the above, for code sandboxes and servers. ``"nesting"`` is for a
server whose package runs code in sandboxes of its own (its ``openenv.yaml`` says
``nested_sandboxes: true``): bubblewrap, run by the server, must create a user namespace and
``mount``/``umount2``/``pivot_root`` in it, so those calls (only) stay allowed there; each nested
sandbox then gets the strict filter on top.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from typing import Any, Tuple

PROFILES = ("strict", "nesting")

CLONE_NEWUSER = 0x10000000
KEYCTL_JOIN_SESSION_KEYRING = 1

_ALWAYS = (
    "add_key",
    "request_key",
    "open_by_handle_at",
    "name_to_handle_at",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "stime",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "nfsservctl",
    "uselib",
    "_sysctl",
    "vm86",
    "vm86old",
    "fanotify_init",
)
# What bubblewrap itself needs to build a nested sandbox (allowed by the "nesting" profile only).
_BWRAP_MOUNTS = ("mount", "umount", "umount2", "pivot_root")
_MOUNTS = (
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "setns",
)


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its Python binding) is missing; the message says how to install it."""


def _library() -> Any:
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:
        raise SeccompUnavailable(
            f"cannot build the sandbox's seccomp filter ({exc}): install libseccomp "
            "(Debian/Ubuntu: apt-get install libseccomp2) and the pyseccomp package (pip install pyseccomp)"
        ) from None
    return pyseccomp


def _filter(profile: str) -> Any:
    if profile not in PROFILES:
        raise ValueError(f"seccomp profile must be one of {PROFILES}, not {profile!r}")
    sc = _library()
    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)

    def refuse(name: str, *args: Any, action: int = deny) -> None:
        try:
            f.add_rule(action, name, *args)
        except (OSError, RuntimeError, ValueError):
            pass  # a call this architecture does not have (vm86 off x86, ...)

    for name in _ALWAYS:
        refuse(name)
    # Joining a new anonymous session keyring is the one keyctl allowed: keyctl(1, NULL).
    refuse("keyctl", sc.Arg(0, sc.NE, KEYCTL_JOIN_SESSION_KEYRING))
    refuse("keyctl", sc.Arg(1, sc.NE, 0))
    for name in _MOUNTS:
        refuse(name)
    if profile == "strict":
        for name in _BWRAP_MOUNTS:
            refuse(name)
        refuse("unshare", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
        refuse("clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
        refuse("clone3", action=sc.ERRNO(errno.ENOSYS))
    return f


@functools.cache
def compiled(profile: str = "strict") -> bytes:
    """The BPF program of ``profile``, as bubblewrap's ``--seccomp FD`` reads it."""
    with tempfile.TemporaryFile() as out:
        _filter(profile).export_bpf(out)
        out.seek(0)
        return out.read()


def program_fd(profile: str = "strict") -> int:
    """A fresh descriptor holding the compiled program at offset 0, for one bubblewrap run.

    The caller passes it to the child (``pass_fds``) and closes its own copy after starting it.
    """
    data = compiled(profile)
    fd = os.memfd_create("openenv-seccomp", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def load(profile: str = "strict") -> None:
    """Install ``profile``'s filter on this process (and everything it starts from now on).

    Requires ``no_new_privs`` (or ``CAP_SYS_ADMIN``); filters stack, and none can be removed.
    """
    _filter(profile).load()


def join_fresh_session_keyring() -> None:
    """Give this process a new, empty, anonymous session keyring (the trainer's is left behind)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    number = _syscall_number("keyctl")
    if libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        code = ctypes.get_errno()
        if code != errno.ENOSYS:  # a kernel without keyrings has none to leave behind
            raise OSError(code, f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(code)}")


@functools.cache
def _syscall_number(name: str) -> int:
    sc = _library()
    return int(sc.resolve_syscall(sc.Arch.NATIVE, name))


def available() -> Tuple[bool, str]:
    """Whether filters can be built here, and if not, why."""
    try:
        compiled("strict")
    except SeccompUnavailable as exc:
        return False, str(exc)
    return True, ""
