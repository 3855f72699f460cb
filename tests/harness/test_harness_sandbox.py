"""HarnessProcess, plainly and in the harness sandbox: an agent's only network is the services it is given.

The stand-in proxy is a real HTTP server on a host Unix socket; the stand-in engine (any host
service) a real HTTP server on the host's 127.0.0.1. The same probe script runs inside the sandbox
and without it: inside it reaches the proxy through ``http://127.0.0.1:<relay port>`` and nothing
else; outside, the attack on the host's services works.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.harness.errors import HarnessError, HarnessNotRunningError, HarnessStartupError
from openenv.core.harness.process import SERVICE_DIR, HarnessProcess, HarnessSandbox
from openenv.testing.escape import planted_secret, wait_for

needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)
PYTHON = os.path.realpath(sys.executable)  # the base interpreter: the sandbox shows it (it runs the relay)


# --- stand-in services ---------------------------------------------------------------------------


def _service_app(name: str) -> Starlette:
    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"service": name, "path": request.url.path})

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/octet-stream")

    return Starlette(routes=[Route("/hello", hello), Route("/echo", echo, methods=["POST"])])


@pytest.fixture
def service_dir() -> Iterator[Path]:
    # Short, so that Unix socket paths stay under 108 bytes.
    path = Path(f"/tmp/oe-harness-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def proxy(service_dir: Path) -> Iterator[str]:
    """The capture proxy's stand-in: HTTP on a host Unix socket; yields the socket's path."""
    path = str(service_dir / "proxy.sock")
    with BackgroundServer(_service_app("proxy"), uds=path):
        yield path


@pytest.fixture
def engine() -> Iterator[int]:
    """The engine's (any host service's) stand-in: HTTP on the host's 127.0.0.1; yields its port."""
    with BackgroundServer(_service_app("engine")) as server:
        yield server.port


class _UnixListener:
    """A host Unix socket (at a path, or abstract) that answers ``b"secret"`` to each connection."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(3)
                try:
                    conn.recv(1024)  # the request, then the answer
                    conn.sendall(b"secret")
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def other_sockets(service_dir: Path) -> Iterator[Dict[str, str]]:
    """Unix sockets an agent might guess: another service's (a path on the host) and an abstract one."""
    path = str(service_dir / "other.sock")
    abstract = f"\0openenv-test-{uuid.uuid4().hex[:12]}"
    listeners = [_UnixListener(path), _UnixListener(abstract)]
    yield {"path": path, "abstract": abstract[1:]}
    for listener in listeners:
        listener.close()


def _host_addresses() -> List[str]:
    """The host's own non-loopback IPv4 addresses (the kernel's local routes)."""
    found, previous = set(), ""
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        if "/32 host LOCAL" in line and previous.strip().startswith("|--"):
            found.add(previous.split()[-1])
        previous = line
    return sorted(a for a in found if not a.startswith("127."))


# --- the probe an agent would run ---------------------------------------------------------------

PROBE = r"""
import errno, hashlib, http.client, json, os, socket, stat, sys
targets = json.loads(sys.argv[1])
out = {}

def attempt(key, fn):
    try:
        out[key] = {"ok": True, "value": fn()}
    except OSError as exc:
        out[key] = {"ok": False, "errno": exc.errno, "error": repr(exc)}

def get(host, port, path="/hello"):
    conn = http.client.HTTPConnection(host, port, timeout=3)
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())

def unix(address):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(address)
    s.sendall(b"GET /hello HTTP/1.0\r\n\r\n")
    return s.recv(15).decode()

if targets.get("proxy_port"):
    attempt("proxy", lambda: get("127.0.0.1", targets["proxy_port"]))
    body = os.urandom(1 << 20)
    def echo():
        conn = http.client.HTTPConnection("127.0.0.1", targets["proxy_port"], timeout=10)
        conn.request("POST", "/echo", body=body)
        return hashlib.sha256(conn.getresponse().read()).hexdigest() == hashlib.sha256(body).hexdigest()
    attempt("proxy_echo", echo)
for host in ["127.0.0.1", "0.0.0.0", "localhost", *targets["addresses"]]:
    attempt("tcp " + host, lambda: get(host, targets["engine_port"]))
for path in targets["unix_paths"]:
    attempt("unix " + path, lambda: unix(path))
attempt("abstract", lambda: unix("\0" + targets["abstract"]))
found = []
for top in ("/tmp", "/run", "/var/run", "/dev/shm", "/home", "/root"):
    for directory, subdirs, files in os.walk(top, onerror=lambda e: None):
        if directory.count("/") - top.count("/") >= 3:
            subdirs[:] = []  # a guess goes a few levels deep, not through the whole host
        for name in files:
            try:
                if stat.S_ISSOCK(os.lstat(os.path.join(directory, name)).st_mode):
                    found.append(os.path.join(directory, name))
            except OSError:
                pass
out["sockets_seen"] = sorted(found)
print(json.dumps(out), flush=True)
"""


async def _run_probe(process: HarnessProcess) -> Dict[str, Any]:
    await process.start()
    try:
        line = await process.read_line(timeout_s=60)
        assert line is not None, f"the probe printed nothing; stderr:\n{process.drain_stderr()}"
        return json.loads(line)
    finally:
        await process.stop()


def _probe_args(engine: int, other: Dict[str, str], proxy_port: int = 0, extra: List[str] = ()) -> str:
    return json.dumps(
        {
            "proxy_port": proxy_port,
            "engine_port": engine,
            "addresses": _host_addresses(),
            "unix_paths": [other["path"], *extra],
            "abstract": other["abstract"],
        }
    )


# --- the attack test -------------------------------------------------------------------------------


@needs_bwrap
async def test_in_the_sandbox_an_agent_reaches_the_proxy_and_nothing_else(
    tmp_path: Path, proxy: str, engine: int, other_sockets: Dict[str, str]
) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    sandbox = HarnessSandbox(workspace=tmp_path, services={"proxy": proxy})
    args = _probe_args(engine, other_sockets, sandbox.port("proxy"), extra=[proxy])
    result = await _run_probe(HarnessProcess([PYTHON, "-I", "probe.py", args], None, sandbox=sandbox))

    assert result["proxy"] == {"ok": True, "value": {"service": "proxy", "path": "/hello"}}
    assert result["proxy_echo"] == {"ok": True, "value": True}  # 1 MiB both ways, byte for byte
    # The host's loopback is not the sandbox's: nothing listens on the engine's port there.
    for host in ("127.0.0.1", "0.0.0.0", "localhost"):
        assert result[f"tcp {host}"]["ok"] is False and result[f"tcp {host}"]["errno"] == errno.ECONNREFUSED, host
    for address in _host_addresses():  # no route off the sandbox's loopback at all
        assert result[f"tcp {address}"]["errno"] in (errno.ENETUNREACH, errno.EHOSTUNREACH), result[f"tcp {address}"]
    # Neither the host's Unix sockets (the proxy's own path, another one) nor its abstract ones.
    for path in (other_sockets["path"], proxy):
        assert result[f"unix {path}"]["errno"] == errno.ENOENT, result[f"unix {path}"]
    assert result["abstract"]["errno"] == errno.ECONNREFUSED
    assert set(result["sockets_seen"]) <= {f"{SERVICE_DIR}/proxy.sock"}


async def test_without_the_sandbox_the_same_probe_reaches_the_host(
    tmp_path: Path, proxy: str, engine: int, other_sockets: Dict[str, str]
) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    args = _probe_args(engine, other_sockets, extra=[proxy])
    result = await _run_probe(HarnessProcess([PYTHON, "-I", "probe.py", args], tmp_path))

    for host in ("127.0.0.1", "0.0.0.0", "localhost"):
        assert result[f"tcp {host}"] == {"ok": True, "value": {"service": "engine", "path": "/hello"}}, host
    for address in _host_addresses():  # routed: the host answers (the stand-in listens on 127.0.0.1 only)
        assert result[f"tcp {address}"]["errno"] not in (errno.ENETUNREACH, errno.EHOSTUNREACH)
    assert result[f"unix {other_sockets['path']}"] == {"ok": True, "value": "secret"}
    assert result["abstract"] == {"ok": True, "value": "secret"}
    assert result[f"unix {proxy}"] == {"ok": True, "value": "HTTP/1.1 200 OK"}
    assert other_sockets["path"] in result["sockets_seen"]


@needs_bwrap
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
async def test_a_node_agent_reaches_the_proxy_through_its_relay_port(tmp_path: Path, proxy: str) -> None:
    sandbox = HarnessSandbox(workspace=tmp_path, services={"proxy": proxy}, ports={"proxy": 8080})
    script = f"fetch('{sandbox.url('proxy')}/hello').then(r => r.text()).then(t => console.log(t))"
    process = HarnessProcess(["node", "-e", script], None, sandbox=sandbox)
    await process.start()
    line = await process.read_line(timeout_s=30)
    await process.stop()
    assert sandbox.url("proxy") == "http://127.0.0.1:8080"
    assert line is not None and json.loads(line) == {"service": "proxy", "path": "/hello"}, process.drain_stderr()


@needs_bwrap
async def test_a_python_agent_runs_from_a_virtual_environment_bound_read_only(tmp_path: Path, proxy: str) -> None:
    sandbox = HarnessSandbox(workspace=tmp_path, services={"proxy": proxy}, ro_paths=[sys.prefix])
    code = f"import httpx; print(httpx.get('{sandbox.url('proxy')}/hello').text)"
    process = HarnessProcess([os.path.join(sys.prefix, "bin", "python"), "-c", code], None, sandbox=sandbox)
    await process.start()
    line = await process.read_line(timeout_s=60)
    await process.stop()
    assert line is not None and json.loads(line)["service"] == "proxy", process.drain_stderr()


# --- the filesystem ------------------------------------------------------------------------------

FS_PROBE = r"""
import json, os, sys
out = {}
def write(path):
    try:
        with open(path, "w") as f:
            f.write("agent was here")
        return "written"
    except OSError as exc:
        return exc.errno
for path in ["/workspace/notes/out.txt", os.environ["HOME"] + "/.config", "/tmp/scratch", "/usr/evil",
             "/etc/evil", "/evil", "/run/evil", "/home/evil"]:
    if path.endswith("notes/out.txt"):
        os.makedirs("/workspace/notes", exist_ok=True)
    out[path] = write(path)
out["secret"] = os.path.exists(sys.argv[1])
out["cwd"] = os.getcwd()
out["home"] = os.environ["HOME"]
out["host_env"] = sorted(k for k in os.environ if k.startswith("OPENENV_TEST_"))
print(json.dumps(out), flush=True)
"""


@needs_bwrap
async def test_the_workspace_is_writable_and_persists_and_the_rest_is_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "fs_probe.py").write_text(FS_PROBE)
    monkeypatch.setenv("OPENENV_TEST_HOST_SECRET", "x")  # the host's environment never enters the sandbox
    with planted_secret() as secret:
        process = HarnessProcess(
            [PYTHON, "-I", "fs_probe.py", str(secret)], workspace, sandbox=HarnessSandbox(workspace)
        )
        await process.start()
        line = await process.read_line(timeout_s=30)
        await process.stop()
    assert line is not None, process.drain_stderr()
    result = json.loads(line)
    assert result["/workspace/notes/out.txt"] == "written"
    assert (workspace / "notes" / "out.txt").read_text() == "agent was here"  # on the host
    assert result["/home/agent/.config"] == "written" and result["home"] == "/home/agent"
    assert result["/tmp/scratch"] == "written" and not Path("/tmp/scratch").exists()  # a private /tmp
    for path in ("/usr/evil", "/etc/evil", "/evil", "/run/evil", "/home/evil"):
        assert result[path] in (errno.EROFS, errno.EACCES), (path, result[path])
    assert result["secret"] is False
    assert result["cwd"] == "/workspace"  # the host path of the workspace, translated
    assert result["host_env"] == []


# --- stopping ------------------------------------------------------------------------------------

SPAWNER = r"""
import signal, subprocess, sys, time
if sys.argv[1] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen(["sleep", "300"])                          # in the agent's group
subprocess.Popen(["sleep", "301"], start_new_session=True)  # escaped into a session of its own
print("ready", flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie waiting for its reaper has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _all_gone(pids: List[int]) -> bool:
    return not any(_alive(pid) for pid in pids)


@needs_bwrap
@pytest.mark.parametrize("mode", ["graceful", "ignore-term"])
async def test_stop_leaves_no_process_of_the_sandbox(tmp_path: Path, mode: str) -> None:
    process = HarnessProcess(
        [PYTHON, "-I", "-c", SPAWNER, mode], None, terminate_grace_s=0.5, sandbox=HarnessSandbox(tmp_path)
    )
    await process.start(ready_check=lambda line: line == "ready")
    pids = process.pids()
    assert len(pids) >= 6  # bwrap, its init, the relay, the agent, two sleeps
    await process.stop()
    assert wait_for(lambda: _all_gone(pids), timeout_s=5), [p for p in pids if _alive(p)]
    # A cooperative agent got SIGTERM (status 128+15, passed on by the relay); the other one, SIGKILL
    # (bwrap reports it as 128+9, or is itself killed by it first).
    if mode == "graceful":
        assert process.returncode == 128 + signal.SIGTERM
    else:
        assert process.returncode in (128 + signal.SIGKILL, -signal.SIGKILL)
    assert not process.is_running()
    await process.stop()  # idempotent


async def test_stop_kills_the_plain_process_group(tmp_path: Path) -> None:
    process = HarnessProcess([PYTHON, "-I", "-c", SPAWNER, "ignore-term"], tmp_path, terminate_grace_s=0.3)
    await process.start(ready_check=lambda line: line == "ready")
    pids = process.pids()
    escaped = [p for p in pids[1:] if os.getsid(p) == p]
    await process.stop()
    in_group = [p for p in pids if p not in escaped]
    assert wait_for(lambda: _all_gone(in_group), timeout_s=5)
    assert process.returncode == -signal.SIGKILL
    for pid in escaped:  # upstream's contract is the group: what left it is not ours to kill
        os.kill(pid, signal.SIGKILL)


# --- start-up errors -----------------------------------------------------------------------------


@needs_bwrap
async def test_a_missing_command_fails_to_start_in_the_sandbox(tmp_path: Path) -> None:
    process = HarnessProcess(["no-such-agent-cli"], None, sandbox=HarnessSandbox(tmp_path))
    with pytest.raises(HarnessStartupError, match="'no-such-agent-cli': not found on the sandbox's PATH"):
        await process.start()
    assert not process.is_running() and process.pid is None


async def test_a_missing_command_fails_to_start_plainly(tmp_path: Path) -> None:
    with pytest.raises(HarnessStartupError, match="command 'no-such-agent-cli' not found on PATH"):
        await HarnessProcess(["no-such-agent-cli"], tmp_path).start()


@needs_bwrap
async def test_a_service_that_is_not_running_fails_the_start(tmp_path: Path) -> None:
    sandbox = HarnessSandbox(tmp_path, services={"mcp": tmp_path / "absent.sock"})
    with pytest.raises(HarnessStartupError, match="service 'mcp': no Unix socket"):
        await HarnessProcess([PYTHON, "-c", "pass"], None, sandbox=sandbox).start()


@needs_bwrap
async def test_an_agent_that_exits_before_it_is_ready_fails_with_its_stderr(tmp_path: Path) -> None:
    code = "import sys; print('config missing', file=sys.stderr); sys.exit(3)"
    process = HarnessProcess([PYTHON, "-I", "-c", code], None, sandbox=HarnessSandbox(tmp_path))
    with pytest.raises(HarnessStartupError, match=r"exited with code 3 before it was ready; stderr:\nconfig missing"):
        await process.start(ready_check=lambda line: line == "ready")


# --- talking (upstream's behaviour) --------------------------------------------------------------

ECHO = "import sys\nprint('ready', flush=True)\nfor line in sys.stdin:\n    print(line.strip().upper(), flush=True)"


@pytest.mark.parametrize("sandboxed", [False, pytest.param(True, marks=needs_bwrap)], ids=["plain", "sandbox"])
async def test_lines_go_in_and_come_out(tmp_path: Path, sandboxed: bool) -> None:
    sandbox = HarnessSandbox(tmp_path) if sandboxed else None
    process = HarnessProcess([PYTHON, "-I", "-c", ECHO], tmp_path, sandbox=sandbox)
    await process.start(ready_check=lambda line: line == "ready")
    with pytest.raises(HarnessStartupError, match="already running"):
        await process.start()
    await process.write_line("héllo")
    assert await process.read_line(timeout_s=10) == "HÉLLO"
    assert await process.read_line(timeout_s=0.05) is None  # nothing more yet
    await process.stop()
    with pytest.raises(HarnessNotRunningError):
        await process.write_line("again")
    assert await process.read_line(timeout_s=0.05) is None


@pytest.mark.parametrize("sandboxed", [False, pytest.param(True, marks=needs_bwrap)], ids=["plain", "sandbox"])
async def test_a_one_shot_cli_gets_its_input_closed(tmp_path: Path, sandboxed: bool) -> None:
    """A CLI run for one task reads its input to the end before it starts (codex exec does)."""
    reads_all = "import sys\ndata = sys.stdin.read()\nprint(f'read {len(data)} bytes, starting', flush=True)"
    sandbox = HarnessSandbox(tmp_path) if sandboxed else None
    closed = HarnessProcess([PYTHON, "-I", "-c", reads_all], tmp_path, sandbox=sandbox, stdin="closed")
    await closed.start()
    assert await closed.read_line(timeout_s=20) == "read 0 bytes, starting"
    await closed.stop()
    piped = HarnessProcess(
        [PYTHON, "-I", "-c", reads_all], tmp_path, sandbox=HarnessSandbox(tmp_path) if sandboxed else None
    )
    await piped.start()
    assert await piped.read_line(timeout_s=1.0) is None  # still waiting for its input to end
    piped.close_stdin()
    assert await piped.read_line(timeout_s=20) == "read 0 bytes, starting"
    await piped.stop()


async def test_start_times_out_without_a_ready_line(tmp_path: Path) -> None:
    process = HarnessProcess([PYTHON, "-c", "import time; time.sleep(30)"], tmp_path, startup_timeout_s=0.5)
    with pytest.raises(HarnessStartupError, match=r"not ready within 0\.5 s"):
        await process.start(ready_check=lambda line: True)
    assert not process.is_running()


async def test_drain_stderr_keeps_the_last_lines(tmp_path: Path) -> None:
    code = "import sys\nfor i in range(80): print(f'line {i}', file=sys.stderr)"
    process = HarnessProcess([PYTHON, "-c", code], tmp_path)
    await process.start()
    assert await process.wait(timeout_s=10) == 0
    assert wait_for(lambda: "line 79" in process._stderr_tail(), timeout_s=5)
    lines = process.drain_stderr().splitlines()
    assert lines == [f"line {i}" for i in range(30, 80)]
    assert process.drain_stderr() == ""
    await process.stop()


def test_errors_are_one_family() -> None:
    assert issubclass(HarnessStartupError, HarnessError) and issubclass(HarnessNotRunningError, HarnessError)


def test_services_get_distinct_ports_known_before_start(tmp_path: Path) -> None:
    sandbox = HarnessSandbox(tmp_path, services={"proxy": "/a.sock", "mcp": "/b.sock"}, ports={"mcp": 41001})
    assert sandbox.ports == {"proxy": 41002, "mcp": 41001}
    assert sandbox.url("mcp") == "http://127.0.0.1:41001"
    with pytest.raises(ValueError, match="share a port"):
        HarnessSandbox(tmp_path, services={"a": "/a", "b": "/b"}, ports={"a": 5000, "b": 5000})
