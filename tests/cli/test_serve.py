"""``openenv serve`` and ``openenv list``: real servers in real sandboxes behind a real TCP port."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, List, Optional

import httpx
import pytest

from openenv.core.client_errors import CapacityReachedError
from openenv.core.containers.runtime._linux import descendants
from openenv.core.generic_client import GenericEnvClient

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "envs" / "echo_env"
OPENENV = [sys.executable, "-m", "openenv.cli"]


class Served:
    """``openenv serve ...`` in a subprocess; ``url`` and ``snippet`` come from its stdout.

    Both pipes are drained by threads for as long as the command runs, so its log can never fill
    a pipe and stall it; :meth:`wait_for` waits for a line on stderr."""

    def __init__(self, *args: str, cwd: Optional[Path] = None, env: Optional[dict] = None) -> None:
        self.process = subprocess.Popen(
            [*OPENENV, "serve", *args, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
        )
        self._out: List[str] = []
        self._err: List[str] = []
        self._next = 0  # the next stdout line to hand out
        self._grew = threading.Condition()
        self._readers = [
            threading.Thread(target=self._drain, args=(self.process.stdout, self._out), daemon=True),
            threading.Thread(target=self._drain, args=(self.process.stderr, self._err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.url = self._stdout_line(60).strip()
        if not self.url.startswith("http://"):
            self.process.kill()
            raise AssertionError(f"serve did not start: {self.url!r}\n{self.stop()[2]}")
        lines: List[str] = []
        self._stdout_line(10)  # the blank line
        while True:  # the snippet ends with a blank line after its `with` block
            line = self._stdout_line(10)
            if not line or (not line.strip() and any(x.startswith("with ") for x in lines)):
                break
            lines.append(line)
        self.snippet = "".join(lines)

    def _drain(self, pipe: Any, into: List[str]) -> None:
        for line in pipe:
            with self._grew:
                into.append(line)
                self._grew.notify_all()
        with self._grew:
            into.append("")  # end of file
            self._grew.notify_all()

    def _stdout_line(self, timeout: float) -> str:
        """The next line the command prints on stdout ("" at its end or after ``timeout``)."""
        index = self._next
        with self._grew:
            self._grew.wait_for(lambda: len(self._out) > index, timeout)
            if len(self._out) <= index:
                return ""
        self._next = index + 1
        return self._out[index]

    @property
    def err(self) -> str:
        """What the command printed on stderr so far."""
        with self._grew:
            return "".join(self._err)

    def wait_for(self, text: str, timeout: float = 60) -> bool:
        """Wait until ``text`` appears on stderr; False if it has not within ``timeout`` seconds."""
        with self._grew:
            return self._grew.wait_for(lambda: text in "".join(self._err), timeout)

    def stop(self, sig: int = signal.SIGINT) -> tuple:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(10)
        with self._grew:
            return self.process.returncode, "".join(self._out), "".join(self._err)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def test_the_printed_snippet_works_when_pasted_and_ctrl_c_stops_everything():
    served = Served(str(ECHO))
    try:
        assert served.url.startswith("http://127.0.0.1:")
        assert "from echo_env import EchoEnv" in served.snippet
        pasted = subprocess.run([sys.executable, "-c", served.snippet], capture_output=True, text=True, timeout=60)
        assert pasted.returncode == 0, pasted.stderr
        assert "echoed_message='Echo environment ready!'" in pasted.stdout
        assert "['echo_message', 'echo_with_length']" in pasted.stdout
        assert httpx.get(f"{served.url}/health", timeout=10).json() == {"status": "healthy"}
        below = descendants(served.process.pid)
        assert below  # the sandbox runs under the command
    finally:
        code, _, err = served.stop(signal.SIGINT)
    assert code == 0, err
    assert "Serving echo_env at" in err and "sandboxed: no network" in err and "Stopped." in err
    assert '"POST /mcp HTTP/1.1" 200' in err  # the server's own log is shown
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in below) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in below if Path(f"/proc/{pid}").exists()]
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{served.url}/health", timeout=2)


def test_sigterm_stops_it_too():
    served = Served(str(ECHO))
    code, _, err = served.stop(signal.SIGTERM)
    assert code == 0 and "Stopped." in err


def test_websocket_sessions_and_large_frames_pass_through_the_tcp_front():
    with Served(str(ECHO)) as served, GenericEnvClient(base_url=served.url).sync() as env:
        env.reset()
        big = "x" * (8 * 1024 * 1024)
        result = env.step({"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": big}})
        assert len(result.observation["result"]["data"]) == len(big)
        for _ in range(50):
            assert env.step({"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}})


def test_max_sessions_bounds_the_server():
    with Served(str(ECHO), "--max-sessions", "2") as served:
        first = GenericEnvClient(base_url=served.url).sync()
        second = GenericEnvClient(base_url=served.url).sync()
        third = GenericEnvClient(base_url=served.url).sync()
        try:
            first.reset()
            second.reset()
            with pytest.raises(CapacityReachedError):
                third.reset()
            first.close()
            third.reset()  # the freed slot is usable
        finally:
            for client in (first, second, third):
                client.close()


def test_without_the_sandbox_it_says_so():
    with Served(str(ECHO), "--no-sandbox") as served:
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200
        code, _, err = served.stop()
    assert code == 0 and "NOT isolated" in err


def test_reload_restarts_the_server_on_a_change(tmp_path):
    project = tmp_path / "echo_copy"
    shutil.copytree(ECHO, project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "tests"))
    with Served(str(project), "--reload") as served:
        with GenericEnvClient(base_url=served.url).sync() as env:
            assert env.reset().observation["echoed_message"] == "Echo environment ready!"
        source = project / "server" / "echo_environment.py"
        source.write_text(source.read_text().replace("Echo environment ready!", "Reloaded and ready!"))
        deadline = time.monotonic() + 60
        seen = None
        while time.monotonic() < deadline:
            try:
                with GenericEnvClient(base_url=served.url).sync() as env:
                    seen = env.reset().observation["echoed_message"]
            except Exception:
                seen = None  # between two servers
            if seen == "Reloaded and ready!":
                break
            time.sleep(0.2)
        assert seen == "Reloaded and ready!"
        # the new server answers before the old one is stopped; "Reloaded." follows that stop
        assert served.wait_for("Reloaded.", 60), served.err
        source.write_text("this is not python (")  # a broken change keeps the last good server
        assert served.wait_for("does not start", 60), served.err
        with GenericEnvClient(base_url=served.url).sync() as env:
            assert env.reset().observation["echoed_message"] == "Reloaded and ready!"
        code, _, err = served.stop()
    assert code == 0
    assert "restarting the server" in err and "Reloaded." in err and "does not start" in err


def test_a_taken_port_and_a_bad_package_are_clear_errors(tmp_path):
    with Served(str(ECHO)) as served:
        port = served.url.rsplit(":", 1)[1]
        taken = subprocess.run(
            [*OPENENV, "serve", str(ECHO), "--port", port], capture_output=True, text=True, timeout=60
        )
    assert taken.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in " ".join(taken.stderr.split())
    missing = subprocess.run([*OPENENV, "serve", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no openenv.yaml" in missing.stderr
    bad_env = subprocess.run([*OPENENV, "serve", str(ECHO), "--env", "NOEQUALS"], capture_output=True, text=True)
    assert bad_env.returncode == 1 and "KEY=VALUE" in bad_env.stderr


def test_a_package_that_does_not_import_reports_its_error(tmp_path):
    project = tmp_path / "broken_env"
    project.mkdir()
    (project / "openenv.yaml").write_text("spec_version: 1\nname: broken_env\napp: server.app:app\n")
    (project / "server").mkdir()
    (project / "server" / "__init__.py").write_text("")
    (project / "server" / "app.py").write_text("import no_such_module_here\n")
    result = subprocess.run(
        [*OPENENV, "serve", str(project), "--port", "0"], capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 1
    assert "No module named 'no_such_module_here'" in result.stderr
    assert result.stdout == ""  # no URL, no snippet


def test_list_shows_installed_environment_packages():
    listed = subprocess.run([*OPENENV, "list", "--json"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    echo = rows["echo"]
    assert echo["client"] == "echo_env.EchoEnv" and echo["distribution"] == "openenv-echo-env"
    assert Path(echo["path"]).resolve() == ECHO.resolve()
    table = subprocess.run(
        [*OPENENV, "list"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"}
    )
    assert table.returncode == 0 and "echo_env.EchoEnv" in table.stdout
    narrow = subprocess.run(
        [*OPENENV, "list"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "100"}
    )
    assert max(len(line.rstrip()) for line in narrow.stdout.splitlines()) <= 100, narrow.stdout
    assert not any(ch in narrow.stdout for ch in "┏┃│└━"), narrow.stdout
    assert any(line.split()[:3] == ["echo", "0.1.0", "echo_env.EchoEnv"] for line in narrow.stdout.splitlines())


def _env(*args):
    """``_server_env`` without the snapshot key (drawn at random; see the test of it below)."""
    from openenv.cli.commands.serve import _server_env

    env = _server_env(*args)
    assert len(env.pop("OPENENV_SNAPSHOT_KEY")) >= 32
    return env


def test_the_servers_of_one_command_share_a_snapshot_key_this_shell_may_give(monkeypatch):
    """Every server of one ``openenv serve`` (the workers of --workers, each reload) gets the
    same key, so that their snapshots restore on each other; the shell's key wins."""
    from openenv.cli.commands.serve import _server_env

    monkeypatch.delenv("OPENENV_SNAPSHOT_KEY", raising=False)
    drawn = _server_env("127.0.0.1", [], None)["OPENENV_SNAPSHOT_KEY"]
    assert len(drawn) == 64 and drawn != _server_env("127.0.0.1", [], None)["OPENENV_SNAPSHOT_KEY"]
    monkeypatch.setenv("OPENENV_SNAPSHOT_KEY", "the-cluster-key")
    assert _server_env("127.0.0.1", [], None)["OPENENV_SNAPSHOT_KEY"] == "the-cluster-key"
    assert _server_env("127.0.0.1", ["OPENENV_SNAPSHOT_KEY=given"], None)["OPENENV_SNAPSHOT_KEY"] == "given"


def test_listening_beyond_this_machine_keeps_exception_texts_from_clients(monkeypatch):
    """What ``--host`` implies for the server's environment. (The tests may not listen on a
    public interface, so this checks the decision, not a server on 0.0.0.0.)"""
    for name in ("OPENENV_AUTH_TOKEN", "OPENENV_ALLOWED_HOSTS", "OPENENV_ALLOWED_ORIGINS", "OPENENV_SNAPSHOT_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert _env("127.0.0.1", [], None) == {}
    assert _env("localhost", ["A=1"], 3) == {"A": "1", "OPENENV_MAX_SESSIONS": "3"}
    assert _env("::1", [], None) == {}
    for host in ("0.0.0.0", "::", "192.0.2.4"):
        assert _env(host, [], None) == {"OPENENV_ERROR_DETAILS": "0"}, host
    assert _env("0.0.0.0", ["OPENENV_ERROR_DETAILS=1"], None) == {"OPENENV_ERROR_DETAILS": "1"}


def test_what_browsers_may_use_is_handed_to_the_sandboxed_server(monkeypatch):
    """The server in the sandbox sees only the environment the command gives it: the names and
    origins this shell allows reach it, and a name given as --host is one browsers may use."""
    monkeypatch.delenv("OPENENV_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("OPENENV_ALLOWED_ORIGINS", "https://trainer.example.org")
    monkeypatch.setenv("OPENENV_ALLOWED_HOSTS", "envs.lan")
    assert _env("127.0.0.1", [], None) == {
        "OPENENV_ALLOWED_ORIGINS": "https://trainer.example.org",
        "OPENENV_ALLOWED_HOSTS": "envs.lan",
    }
    named = _env("envs.example.org", [], None)
    assert named["OPENENV_ALLOWED_HOSTS"] == "envs.lan,envs.example.org"
    assert named["OPENENV_ERROR_DETAILS"] == "0"


def test_web_serves_the_playground_too():
    with Served(str(ECHO), "--web") as served:
        page = httpx.get(f"{served.url}/web/", timeout=10)
        assert page.status_code == 200 and "playground.js" in page.text
        assert httpx.get(f"{served.url}/web/metadata", timeout=10).json()["mcp"] is True
        code, _, err = served.stop()
    assert code == 0 and f"{served.url}/web/" in err


def test_a_token_in_the_commands_environment_guards_the_sandboxed_server():
    token = "serve-token-0123456789abcdef"
    with Served(str(ECHO), env={"OPENENV_AUTH_TOKEN": token}) as served:
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200
        assert httpx.get(f"{served.url}/schema", timeout=10).status_code == 401
        assert httpx.get(f"{served.url}/schema", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        with GenericEnvClient(base_url=served.url, headers={"Authorization": f"Bearer {token}"}).sync() as client:
            assert client.reset().observation is not None
        code, out, err = served.stop()
    assert code == 0 and "Authorization: Bearer $OPENENV_AUTH_TOKEN" in err
    assert token not in out + err  # never printed


def test_workers_serve_several_sandboxed_processes_behind_one_address():
    token = "workers-token-0123456789abcdef"
    auth = {"Authorization": f"Bearer {token}"}
    with Served(str(ECHO), "--workers", "2", "--max-sessions", "3", env={"OPENENV_AUTH_TOKEN": token}) as served:
        assert httpx.get(f"{served.url}/health", timeout=10).json() == {"status": "healthy"}  # no token: no counts
        from echo_env import EchoEnv

        clients = [EchoEnv(base_url=served.url, headers=auth).sync() for _ in range(6)]
        try:
            for client in clients:
                client.reset()
            owners = sorted(client._client.session_id.split("-")[0] for client in clients)
            assert owners == ["w0", "w0", "w0", "w1", "w1", "w1"]
            health = httpx.get(f"{served.url}/health", headers=auth, timeout=10).json()
            assert health["max_sessions"] == 6 and health["active_sessions"] == 6
            assert [w["status"] for w in health["workers"]] == ["healthy", "healthy"]
            with pytest.raises(CapacityReachedError):  # the whole is full
                EchoEnv(base_url=served.url, headers=auth).sync().reset()
        finally:
            for client in clients:
                client.close()
        code, _, err = served.stop()
    assert code == 0 and "2 processes" in err and "[w0]" in err and "[w1]" in err


def test_reload_does_not_go_with_workers():
    refused = subprocess.run(
        [*OPENENV, "serve", str(ECHO), "--workers", "2", "--reload"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1 and "--reload" in refused.stderr and "--workers" in refused.stderr


# --- names, start-up, missing dependencies, the access log ---------------------------------------

DICE = Path(__file__).resolve().parent / "fixtures" / "dice_env"


def test_an_installed_package_is_served_by_its_name():
    with Served("echo") as served:
        assert "from echo_env import EchoEnv" in served.snippet
        with GenericEnvClient(base_url=served.url).sync() as env:
            assert env.reset().observation["echoed_message"] == "Echo environment ready!"
        code, _, err = served.stop()
    assert code == 0 and "Serving echo_env at" in err


def test_a_name_nothing_installed_has_suggests_the_near_one(tmp_path):
    result = subprocess.run([*OPENENV, "serve", "ech"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 1
    assert "ech is not a directory, and no installed environment package matches 'ech': did you mean 'echo'?" in (
        result.stderr
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _raw_get(port: int, path: str) -> bytes:
    """The whole answer to ``GET path`` on a fresh connection (the server closes it after)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_a_client_that_comes_while_the_server_starts_gets_a_whole_503(tmp_path):
    project = tmp_path / "slow_env"
    shutil.copytree(DICE, project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    go = project / "go"
    app = project / "server" / "app.py"
    # The server starts only once the test has seen the answer to a client during its start.
    waiting = (
        "import pathlib, time\n"
        "_go, _deadline = pathlib.Path(__file__).resolve().parents[1] / 'go', time.monotonic() + 90\n"
        "while not _go.exists() and time.monotonic() < _deadline:\n"
        "    time.sleep(0.05)\n"
    )
    app.write_text(app.read_text() + waiting)
    port = _free_port()
    process = subprocess.Popen(
        [*OPENENV, "serve", str(project), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # serve listens before it starts the server
            try:
                answer = _raw_get(port, "/health")
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "serve never listened"
                time.sleep(0.05)
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        assert lines[0] == "HTTP/1.1 503 Service Unavailable"
        assert int(headers["content-length"]) == len(body)
        assert json.loads(body) == {
            "detail": "the environment server is starting; retry in a moment",
            "code": "SERVER_BUSY",
        }
        assert headers["retry-after"] == "1"
        go.write_text("")
        assert process.stdout is not None
        assert process.stdout.readline().startswith(f"http://127.0.0.1:{port}")  # now it serves
        assert _raw_get(port, "/health").startswith(b"HTTP/1.1 200 OK")
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "cannot reach the environment server" not in err


def _needing(tmp_path: Path, declared: List[str]) -> Path:
    """A copy of the dice package whose server imports a module nothing installs; its
    pyproject.toml declares ``declared``."""
    project = tmp_path / "needy_env"
    shutil.copytree(DICE, project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    app = project / "server" / "app.py"
    app.write_text(app.read_text() + "\nimport openenv_test_absent_dependency  # noqa: E402, F401\n")
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text()
    start = text.index("dependencies = [")
    end = text.index("]", start) + 1
    pyproject.write_text(text[:start] + f"dependencies = {json.dumps(declared)}" + text[end:])
    return project


def _serve_failing(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*OPENENV, "serve", project.name, "--port", "0"], capture_output=True, text=True, timeout=90, cwd=project.parent
    )


def test_a_missing_dependency_is_named_with_the_requirement_and_the_install_command(tmp_path):
    project = _needing(tmp_path, ["openenv>=0.10", "openenv-test-absent-dependency>=1.2"])
    result = _serve_failing(project)
    assert result.returncode == 1 and result.stdout == ""
    error = " ".join(result.stderr.split())
    assert "No module named 'openenv_test_absent_dependency'" in error
    assert (
        "The package dice_env needs the module 'openenv_test_absent_dependency', from its dependency "
        "openenv-test-absent-dependency>=1.2 (declared in needy_env/pyproject.toml)"
    ) in error
    assert f"{Path(sys.executable).parent / 'pip'} install -e needy_env" in error


def test_an_undeclared_module_is_said_to_be_missing_from_the_pyproject(tmp_path):
    project = _needing(tmp_path, ["openenv>=0.10"])
    result = _serve_failing(project)
    assert result.returncode == 1
    error = " ".join(result.stderr.split())
    assert "needy_env/pyproject.toml does not declare it" in error
    assert f"{Path(sys.executable).parent / 'pip'} install -e needy_env" in error


def test_workers_keep_their_polls_out_of_the_access_log():
    with Served(str(ECHO), "--workers", "2") as served:
        for worker in ("w0", "w1"):
            assert served.wait_for(f"[{worker}] INFO:     Application startup complete.")
        time.sleep(3)  # idle: the front asks each worker for its sessions about once a second
        assert "/openenv/capacity" not in served.err
        assert httpx.get(f"{served.url}/openenv/capacity", timeout=10).status_code == 200  # a client's own
        assert httpx.post(f"{served.url}/reset", json={}, timeout=10).status_code == 200
        assert served.wait_for('"POST /reset HTTP/1.1" 200')
        assert served.wait_for('"GET /openenv/capacity HTTP/1.1" 200')
        code, _, err = served.stop()
    assert code == 0
    assert err.count("/openenv/capacity") == 1
