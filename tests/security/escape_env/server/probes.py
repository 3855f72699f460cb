"""What hostile package code tries, at import time and from an action: each probe says what it got.

Every probe returns a short string: ``"ok..."`` when the attack worked, otherwise the error's
name (``EPERM``, ``EACCES``, ``PermissionError``, ...). Nothing read is ever returned.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Dict

_libc = ctypes.CDLL(None, use_errno=True)
# x86_64 / aarch64 system call numbers of what the C library may not wrap.
_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
KEYCTL_SEARCH = 10
KEY_SPEC_SESSION_KEYRING = -3
CLONE_NEWUSER = 0x10000000


def _errno_name() -> str:
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def status_field(name: str) -> str:
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return ""


def read_shadow() -> str:
    try:
        with open("/etc/shadow", "rb") as f:
            f.read(1)
        return "ok: read /etc/shadow"
    except OSError as exc:
        return type(exc).__name__


def file_handle_of_etc() -> str:
    """name_to_handle_at on /etc: the first half of the open_by_handle_at escape."""

    class FileHandle(ctypes.Structure):
        _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_char * 128)]

    handle = FileHandle(128, 0)
    mount_id = ctypes.c_int()
    AT_FDCWD = -100
    if _libc.name_to_handle_at(AT_FDCWD, b"/etc", ctypes.byref(handle), ctypes.byref(mount_id), 0) == 0:
        return "ok: got a file handle"
    return _errno_name()


def open_by_handle() -> str:
    """open_by_handle_at on the root's handle: the call that walks past mount boundaries."""
    fd = os.open("/etc", os.O_RDONLY)
    try:
        buffer = (ctypes.c_char * 136)()
        ctypes.memmove(buffer, (ctypes.c_uint * 2)(8, 1), 8)
        result = _libc.open_by_handle_at(fd, buffer, os.O_RDONLY)
        if result >= 0:
            os.close(result)
            return "ok: opened by handle"
        return _errno_name()
    finally:
        os.close(fd)


def search_session_keyring(description: str) -> str:
    """Find a ``user`` key of the session keyring this process possesses."""
    if _KEYCTL is None:
        return "unknown architecture"
    key = _libc.syscall(_KEYCTL, KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", description.encode(), 0)
    return f"ok: key {key}" if key >= 0 else _errno_name()


def new_user_namespace() -> str:
    """unshare(CLONE_NEWUSER) in a child process (this one stays as it is)."""
    pid = os.fork()
    if pid == 0:
        code = 0 if _libc.unshare(CLONE_NEWUSER) == 0 else ctypes.get_errno()
        os._exit(min(code, 255))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return "ok: new user namespace" if code == 0 else errno.errorcode.get(code, str(code))


def all_probes() -> Dict[str, str]:
    return {
        "euid": str(os.geteuid()),
        "CapEff": status_field("CapEff"),
        "Seccomp": status_field("Seccomp"),
        "NoNewPrivs": status_field("NoNewPrivs"),
        "shadow": read_shadow(),
        "name_to_handle_at": file_handle_of_etc(),
        "open_by_handle_at": open_by_handle(),
        "userns": new_user_namespace(),
    }


def brokered(code: str, spec_limits=None, **overrides):
    """Run ``code`` through this server's sandbox broker with the description forged by ``overrides``
    (any field, extra ones included): what the code printed and its exit code, or the refusal."""
    from openenv.core.tools import broker, executor
    from openenv.core.tools.sandbox import SandboxSpec

    spec = SandboxSpec(
        argv=["{python}", "{control}/main.py"],
        isolation="sandbox",
        limits=spec_limits or executor.CODE_LIMITS,
        script=code,
        script_name="main.py",
    )
    honest = broker._describe
    broker._describe = lambda s: {**honest(s), **overrides}
    try:
        result = executor._execute(spec, stdin=None, timeout_s=20, max_output_bytes=65536)[0]
        return {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}
    except Exception as exc:
        return {"refused": f"{type(exc).__name__}: {exc}"}
    finally:
        broker._describe = honest
