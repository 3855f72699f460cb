"""The transport limits hold however an environment's app is served: uvicorn's command line (as
upstream's Dockerfiles and Hugging Face Spaces run it), gunicorn's uvicorn workers, OpenEnv's
runner module (what the catalogue's Dockerfiles run) and a package's ``server/app.py`` main.

Each server is a real process serving the echo environment from its directory, with a header
timeout of 1 s and a message limit of 2 MiB: a request head left half-sent is closed after the
timeout (uvicorn alone keeps it for ever), and a WebSocket frame declaring 64 MiB is refused from
its header (uvicorn alone, told ``--ws-max-size 268435456`` as such Dockerfiles do, buffers it
whole before the app sees it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List

import httpx
import pytest

from .test_hostile_clients import MIB, masked_frame

ECHO = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "envs", "echo_env")
LIMITS = {"OPENENV_HEADER_TIMEOUT_S": "1", "OPENENV_MAX_MESSAGE_MB": "2"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


COMMANDS: Dict[str, List[str]] = {
    "uvicorn-command-line": ["-m", "uvicorn", "server.app:app", "--port", "{port}", "--ws-max-size", "268435456"],
    "gunicorn-uvicorn-worker": [
        "-m",
        "gunicorn",
        "-k",
        "uvicorn.workers.UvicornWorker",
        "-b",
        "127.0.0.1:{port}",
        "server.app:app",
    ],
    "runner-module": ["-m", "openenv.core.env_server", "server.app:app", "--port", "{port}"],
    "package-main": ["-m", "server.app", "--port", "{port}"],
}


class Served:
    """A server process started by ``command`` in the echo environment's directory, in a process
    group of its own (gunicorn's workers are its children); its output goes to a file."""

    def __init__(self, command: List[str], extra_env: Dict[str, str]) -> None:
        self.port = free_port()
        argv = [sys.executable, *(part.format(port=self.port) for part in command)]
        env = {**os.environ, **LIMITS, **extra_env}
        env.pop("PYTHONPATH", None)
        self.output = tempfile.TemporaryFile()
        self.log = ""
        self.process = subprocess.Popen(
            argv, cwd=ECHO, env=env, stdout=self.output, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"the server did not start: {self.log}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server and its children (SIGINT, then SIGKILL after 10 s); ``log`` is its output."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.output.seek(0)
        self.log = self.output.read().decode(errors="replace")


@pytest.fixture
def served() -> Iterator:
    started: List[Served] = []

    def start(command: List[str], **extra_env: str) -> Served:
        started.append(Served(command, extra_env))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def half_sent_head_kept_for(port: int, within: float) -> float:
    """Seconds until the server closed a connection whose request head never ends (``within``: it did not)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        sock.settimeout(within)
        try:
            while sock.recv(4096):
                pass
        except TimeoutError:
            return within
        return time.monotonic() - started


def answer_to_a_huge_frame(port: int) -> bytes:
    """What the server sends within 5 s after a WebSocket frame declaring 64 MiB of which 1 MiB came."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        sock.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101"), head
        sock.sendall(masked_frame(1, b"x" * MIB, declared=64 * MIB))
        try:
            return head.split(b"\r\n\r\n", 1)[1] + sock.recv(65536)
        except TimeoutError:
            return b""


@pytest.mark.internals("uvicorn-guard")
@pytest.mark.parametrize("how", list(COMMANDS))
def test_every_way_of_serving_an_app_gets_the_limits(served, how: str) -> None:
    server = served(COMMANDS[how])
    kept = half_sent_head_kept_for(server.port, within=6)
    answer = answer_to_a_huge_frame(server.port)
    assert httpx.get(f"http://127.0.0.1:{server.port}/health").status_code == 200
    server.stop()
    print(f"{how}: a half-sent head closed after {kept:.1f} s; the 64 MiB frame answered {answer[:80]!r}")
    assert kept < 3, f"{how}: a half-sent request head was kept {kept:.1f} s (header timeout 1 s)"
    assert b"MESSAGE_TOO_LARGE" in answer, f"{how}: no refusal from the frame's header ({answer[:200]!r})"
    assert "without OpenEnv's transport limits" not in server.log


def test_uvicorn_with_its_lifespan_off_says_what_is_missing_and_the_command_that_has_it(served) -> None:
    server = served(COMMANDS["uvicorn-command-line"] + ["--lifespan", "off"])
    assert httpx.get(f"http://127.0.0.1:{server.port}/health").status_code == 200
    server.stop()
    assert "without OpenEnv's transport limits" in server.log
    assert "python -m openenv.core.env_server server.app:app" in server.log


def test_without_library_internals_uvicorn_warns_at_start_up(served) -> None:
    server = served(COMMANDS["uvicorn-command-line"], OPENENV_LIBRARY_INTERNALS="0")
    server.stop()
    start_up = server.log.split("Application startup complete")[0]
    assert "uvicorn serves this app without OpenEnv's WebSocket protocol" in start_up
    assert "no header timeout" in start_up and "python -m openenv.core.env_server" in start_up
