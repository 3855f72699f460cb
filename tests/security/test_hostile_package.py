"""A hostile environment package: what its code can do at import time and while it serves.

``escape_env`` runs probes (:mod:`escape_env.server.probes`) when its module is imported — with
the privileges package code has then — and exposes them, and the probes, to the code of each
action. Every attack runs in the sandbox, where it must fail, and where it is safe to show, with
``isolation="none"`` (as root on a CI machine), where it must succeed: proof that it is real.
"""

from __future__ import annotations

import ctypes
import os
import socket
import uuid
from pathlib import Path

import pytest

from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.containers.runtime.sandbox import MAX_LOG_BYTES, _tail
from openenv.core.generic_client import GenericEnvClient

ESCAPE_ENV = Path(__file__).resolve().parent / "escape_env"
ROOT_ONLY = os.geteuid() == 0

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")

MODES = {"warm": {"warm": True}, "cold": {"warm": False}, "none": {"isolation": "none"}}


class Served:
    def __init__(self, mode: str, **kwargs) -> None:
        self.mode = mode
        self.provider = SandboxProvider(str(ESCAPE_ENV), **MODES[mode], **kwargs)
        self.url = self.provider.start()
        self.provider.wait_for_ready(30)
        self.client = GenericEnvClient(base_url=self.url, message_timeout_s=60).sync()
        self.client.reset()

    def run(self, code: str) -> dict:
        return self.client.step({"code": code}).observation

    def value(self, code: str):
        observation = self.run(code)
        assert not observation["error"], observation["error"]
        return eval(observation["result"])

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.provider.stop()


@pytest.fixture(params=list(MODES))
def served(request):
    running = Served(request.param)
    yield running
    running.close()


def test_package_code_runs_without_privileges_from_its_import_on(served):
    at_import = served.value("result = IMPORT_PROBES")
    now = served.value("result = probes.all_probes()")
    if served.mode == "none":
        if ROOT_ONLY:  # the same code, unsandboxed, as root: every attack works
            assert at_import["euid"] == "0" and at_import["CapEff"] != "0000000000000000"
            assert at_import["shadow"].startswith("ok") and at_import["name_to_handle_at"].startswith("ok")
            assert at_import["open_by_handle_at"] != "EPERM" and at_import["userns"].startswith("ok")
        return
    for probes in (at_import, now):
        assert probes["euid"] != "0"
        assert probes["CapEff"] == "0000000000000000"  # no capability at all
        assert probes["Seccomp"] == "2" and probes["NoNewPrivs"] == "1"  # a seccomp filter, for good
        assert probes["shadow"] in ("PermissionError", "FileNotFoundError")
        assert probes["name_to_handle_at"] == probes["open_by_handle_at"] == "EPERM"
        assert probes["userns"] == "EPERM"


def _memory_holds(needle: bytes) -> str:
    """Code that searches the server's own heap (every readable anonymous mapping) for ``needle``.

    The needle travels in two halves that are never joined, so the search itself adds no copy of
    it. It reads with ctypes: a server that dropped privileges is not dumpable, so even its own
    ``/proc/self/mem`` is closed to it."""
    half = len(needle) // 2
    return f"""
import ctypes
head = {needle[:half]!r}
found = False
tail = {needle[half:]!r}
for line in open('/proc/self/maps'):
    fields = line.split()
    name = fields[5] if len(fields) > 5 else ''
    if not fields[1].startswith('r') or name not in ('', '[heap]', '[stack]'):
        continue
    start, end = (int(x, 16) for x in fields[0].split('-'))
    chunk = ctypes.string_at(start, end - start)
    at = chunk.find(head)
    while at >= 0 and not found:
        found = chunk[at + len(head):at + len(head) + len(tail)] == tail
        at = chunk.find(head, at + 1)
    if found:
        break
result = found
"""


def test_a_warm_server_holds_nothing_of_the_servers_started_before_it():
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    first = Served("warm", env_vars={"FIRST_SECRET": secret})
    try:
        first.run(f"print('the first server logs its secret:', {secret!r}, flush=True)")
        assert first.value(_memory_holds(secret.encode()))  # the search finds what is there
        second = Served("warm")
        try:
            assert not second.value(_memory_holds(secret.encode()))
            assert second.value("import os; result = 'FIRST_SECRET' in os.environ") is False
        finally:
            second.close()
    finally:
        first.close()


_libc = ctypes.CDLL(None, use_errno=True)
_KEYCTL, _ADD_KEY = {"x86_64": (250, 248), "aarch64": (219, 217)}.get(os.uname().machine, (None, None))


def _add_session_key(description: str) -> int:
    payload = b"the trainer's token"
    key = _libc.syscall(_ADD_KEY, b"user", description.encode(), payload, len(payload), -3)  # the session keyring
    if key < 0:
        pytest.skip(f"cannot add a key to this session's keyring (errno {ctypes.get_errno()})")
    return key


@pytest.mark.skipif(_KEYCTL is None, reason="keyctl's number is known for x86_64 and aarch64 only")
@pytest.mark.parametrize("mode", list(MODES))
def test_the_trainers_session_keyring_is_out_of_reach(mode):
    description = f"openenv-test-{uuid.uuid4().hex}"
    key = _add_session_key(description)
    try:
        served = Served(mode)
        try:
            found = served.value(f"result = probes.search_session_keyring({description!r})")
        finally:
            served.close()
    finally:
        _libc.syscall(_KEYCTL, 3, key)  # KEYCTL_REVOKE
    if mode == "none":
        assert found == f"ok: key {key}"  # an unsandboxed server possesses the trainer's keyring
    else:
        assert found == "EPERM"


def test_the_host_run_directory_is_out_of_a_sandboxed_servers_reach():
    served = Served("warm")
    try:
        directory = str(served.provider.socket_path.parent)
        seen = served.value(
            f"import os\nd = {directory!r}\n"
            "try:\n    os.symlink('/etc/shadow', d + '/server.log.new'); wrote = True\nexcept OSError:\n    wrote = False\n"
            "result = (os.path.exists(d), wrote)"
        )
        assert seen == (False, False)
    finally:
        served.close()


def test_the_client_refuses_a_socket_that_an_unsandboxed_server_replaced_with_a_link(tmp_path):
    served = Served("none")  # no sandbox: the server can reach its run directory
    decoy = tmp_path / "decoy.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(decoy))
    listener.listen(1)
    try:
        path = str(served.provider.socket_path)
        served.value(
            f"import os\nos.rename({path!r}, {path!r} + '.real')\nos.symlink({str(decoy)!r}, {path!r})\nresult = 1"
        )
        with pytest.raises(ConnectionError, match="symbolic link"):
            GenericEnvClient(base_url=served.url).sync().reset()
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing was sent to the decoy
    finally:
        listener.close()
        served.close()


def test_host_side_log_reads_never_follow_a_link_or_block_on_a_fifo(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root only")
    link = tmp_path / "server.log"
    link.symlink_to(secret)
    assert _tail(link) == ""
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    assert _tail(fifo) == ""  # returns at once: no writer would ever come


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_a_server_cannot_grow_its_log_past_the_bound(mode):
    served = Served(mode)
    try:
        chunk = 1024 * 1024
        served.value(
            f"import os\nfor _ in range({(MAX_LOG_BYTES * 2) // chunk + 4}):\n    os.write(1, b'x' * {chunk})\nresult = 1"
        )
        served.value("result = 1")  # the copier keeps up; its bound holds
        size = served.provider.log_path.stat().st_size
        assert 0 < size <= MAX_LOG_BYTES
        assert served.value("result = 6 * 7") == 42
    finally:
        served.close()
