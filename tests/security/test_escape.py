"""Escape attempts from inside a sandboxed environment server.

The environment (``escape_env``) runs the Python code of each action inside its server process.
Every attack that is safe to try on this machine runs twice: in the sandbox, where it must fail,
and with ``isolation="none"``, where it must succeed — proof that it is a real attack. After each,
the server still answers (or is cleanly replaced) and the host shows no trace.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from openenv.core.client_errors import StepTimeoutError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime._linux import descendants
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.generic_client import GenericEnvClient
from openenv.testing import host_listener, planted_secret

ESCAPE_ENV = Path(__file__).resolve().parent / "escape_env"

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


class Server:
    """A running escape_env server and a session on it."""

    def __init__(self, isolation: str, **limits) -> None:
        self.provider = SandboxProvider(
            str(ESCAPE_ENV), isolation=isolation, env_vars={"OPENENV_STEP_TIMEOUT_S": "2"}, **limits
        )
        self.url = self.provider.start()
        self.provider.wait_for_ready(30)
        self.client = GenericEnvClient(base_url=self.url, message_timeout_s=30).sync()
        self.client.reset()

    def run(self, code: str) -> dict:
        return self.client.step({"code": code}).observation

    def healthy(self) -> bool:
        with GenericEnvClient(base_url=self.url).sync() as other:
            other.reset()
            return other.step({"code": "result = 6 * 7"}).observation["result"] == "42"

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.provider.stop()


@pytest.fixture(params=["sandbox", "none"])
def server(request):
    running = Server(request.param)
    running.isolation = request.param
    yield running
    running.close()


@pytest.fixture
def sandboxed():
    running = Server("sandbox", memory_mb=1024, max_processes=64)
    yield running
    running.close()


def test_reading_a_secret_in_the_hosts_home(server):
    with planted_secret() as secret:
        observation = server.run(f"result = open({str(secret)!r}).read()")
    if server.isolation == "none":
        assert observation["result"] == repr("the trainer's secret")
    else:
        assert observation["result"] == "" and (
            "FileNotFoundError" in observation["error"] or "PermissionError" in observation["error"]
        )
    assert server.healthy()


def test_connecting_to_a_listener_on_the_hosts_loopback(server):
    with host_listener() as listener:
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {listener.port}), timeout=2)\nresult = s.recv(4)"
        observation = server.run(code)
    accepted = listener.accepted
    if server.isolation == "none":
        assert observation["result"] == repr(b"pong") and accepted
    else:
        assert "ConnectionRefusedError" in observation["error"] or "OSError" in observation["error"]
        assert not accepted
    assert server.healthy()


def test_a_server_accepting_on_a_host_tcp_port_still_cannot_connect_out():
    """``listen=``: the host binds the TCP port and hands the socket in; accepting on it gives
    the sandbox no network of its own."""
    provider = SandboxProvider(str(ESCAPE_ENV), listen=("127.0.0.1", 0), env_vars={"OPENENV_STEP_TIMEOUT_S": "2"})
    url = provider.start()
    try:
        provider.wait_for_ready(30)
        with host_listener() as listener, GenericEnvClient(base_url=url).sync() as env:
            env.reset()
            code = f"import socket\ns = socket.create_connection(('127.0.0.1', {listener.port}), timeout=2)\nresult = s.recv(4)"
            observation = env.step({"code": code}).observation
        assert "ConnectionRefusedError" in observation["error"] or "OSError" in observation["error"]
        assert not listener.accepted
    finally:
        provider.stop()


def test_writing_into_the_environment_package(server):
    target = ESCAPE_ENV / f"pwned-{uuid.uuid4().hex}.txt"
    observation = server.run(f"open({str(target)!r}, 'w').write('pwned'); result = 'written'")
    try:
        if server.isolation == "none":
            assert target.exists()
        else:
            assert not target.exists()
            assert "Read-only file system" in observation["error"] or "Permission" in observation["error"]
    finally:
        target.unlink(missing_ok=True)
    assert server.healthy()


def test_writing_into_etc(server):
    target = Path("/etc") / f"openenv-pwned-{uuid.uuid4().hex}"
    observation = server.run(f"open({str(target)!r}, 'w').write('pwned'); result = 'written'")
    try:
        if server.isolation == "none" and os.geteuid() == 0:
            assert target.exists()
        else:
            assert not target.exists()
            assert observation["error"]
    finally:
        target.unlink(missing_ok=True)
    assert server.healthy()


def test_writing_into_the_hosts_tmp(server):
    target = Path("/tmp") / f"openenv-pwned-{uuid.uuid4().hex}"
    observation = server.run(f"open({str(target)!r}, 'w').write('pwned'); result = 'written'")
    try:
        if server.isolation == "none":
            assert target.exists()
        else:
            assert (
                observation["result"] == repr("written")
                or observation["result"] == "'written'"
                or observation["error"] == ""
            )
            assert not target.exists()  # it went to the sandbox's private /tmp
    finally:
        target.unlink(missing_ok=True)
    assert server.healthy()


def test_seeing_host_processes(server):
    code = f"import os\nresult = (os.path.exists('/proc/{os.getpid()}'), len([p for p in os.listdir('/proc') if p.isdigit()]))"
    visible, count = eval(server.run(code)["result"])
    if server.isolation == "none":
        assert visible and count > 10
    else:
        assert not visible
        assert count <= 3  # the server and what it started, nothing else
    assert server.healthy()


# --- sandbox only: attacks that would hurt this machine without one -------------------------------


def _processes_of_uid(uid: int) -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if any(line.startswith("Uid:") and int(line.split()[1]) == uid for line in status.splitlines()):
            count += 1
    return count


def test_a_fork_bomb_is_bounded_by_the_process_limit(sandboxed):
    uid = eval(sandboxed.run("import os\nresult = os.getuid()")["result"])
    # processes below this one: a sandbox's all are (other test runs on the machine are not)
    host_processes = len(descendants(os.getpid()))
    observation = sandboxed.run("import os\nwhile True:\n    os.fork()")
    assert "BlockingIOError" in observation["error"] or "Resource temporarily unavailable" in observation["error"]
    assert _processes_of_uid(uid) <= 64 + 1
    assert len(descendants(os.getpid())) <= host_processes + 66
    sandboxed.provider.stop()  # replace the server: its pid namespace goes, every forked copy with it
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _processes_of_uid(uid):
        time.sleep(0.05)
    assert _processes_of_uid(uid) == 0
    replacement = Server("sandbox")
    try:
        assert replacement.healthy()
    finally:
        replacement.close()


def test_allocating_8_gb_is_bounded_by_the_memory_limit(sandboxed):
    observation = sandboxed.run("block = bytearray(8 * 1024 ** 3)\nresult = len(block)")
    assert "MemoryError" in observation["error"]
    assert sandboxed.healthy()


def test_an_infinite_loop_hits_the_step_timeout_and_other_sessions_are_served(sandboxed):
    started = time.monotonic()
    with pytest.raises(StepTimeoutError):
        sandboxed.run("while True:\n    pass")
    assert time.monotonic() - started < 10
    assert sandboxed.healthy()  # another session on the same server, answered while the loop spins
    sandboxed.client.reset()  # this session goes on, with a fresh environment
    assert sandboxed.run("result = 'alive'")["result"] == repr("alive")
