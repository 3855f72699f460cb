"""Real agent CLIs, unchanged, inside the harness sandbox, through the real capture proxy, in front
of the tiny real engine (issue 38, point 4 and the second bullet of its "done when").

Each agent runs in a :class:`HarnessSandbox` (the workspace bound read-write, a home of its own,
the harness install and the system read-only) whose only network is the capture proxy: a
:class:`CaptureServer` on a host Unix socket, offered inside as ``http://127.0.0.1:41001``. The
agent is told only that base URL and its key (a session minted for it). The tiny model's text is
nonsense, so an agent may give up after a turn or two; the session's budget (``max_model_calls``)
and a timeout bound each run, and what is checked is the capture: every turn's ids and logprobs
aligned, loss masks exactly over the sampled tokens, and the engine's prompt ids equal to a local
render of the same messages (re-tokenisation skew 0).

The attack: one probe program, run as an agent would be, tries the engine's port, another host
service, the proxy's admin routes (with its key, none, and the admin key from the proxy's journal
directory) and another agent's session. Sandboxed, all it reaches is its own session through the
proxy; the same probe run as a plain process on the host gets through.

The harnesses come from ``bash scripts/install-harnesses.sh npm`` (``$OPENENV_HARNESS_DIR``, default
``.harnesses/``); each test skips, saying so, when its harness, node or bubblewrap is missing.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.harness import agents
from openenv.core.harness.capture import CaptureServer
from openenv.core.harness.capture.export import export_session, measure_retokenization_skew
from openenv.core.harness.capture.settings import state_dir
from openenv.core.harness.process import HarnessProcess, HarnessSandbox
from openenv.testing.tiny_engine import TinyEngine

ROOT = Path(__file__).resolve().parents[2]
HARNESS_ROOT = agents.harness_dir(ROOT / ".harnesses")
PYTHON = os.path.realpath(sys.executable)  # the base interpreter: the sandbox shows it (it runs the relay)
NODE = shutil.which("node")
MODEL = "tiny"  # what the agents ask for; the proxy serves the engine's model whatever they name
TASK = "List the files in this directory, then say done."
MAX_CALLS = 3  # the session's budget: after it the proxy answers a final text and the agent ends
RUN_TIMEOUT_S = 120.0
HOME = "/home/agent"

needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)


# --- the real parts -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Any:
    return TinyEngine.build()


@pytest.fixture(scope="module")
def engine_server(engine: Any) -> Iterator[Any]:
    with engine.serve() as server:
        yield server


@pytest.fixture(scope="module")
def proxy_dir() -> Iterator[Path]:
    # On the host, short (a Unix socket path stays under 108 bytes), 0700. The sandbox's /tmp is a
    # private tmpfs, so nothing here (the journal, its admin_key file) is visible to an agent.
    path = Path(f"/tmp/oe-agents-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def proxy(engine_server: Any, proxy_dir: Path) -> Iterator[CaptureServer]:
    server = CaptureServer(
        llm_url=engine_server.base_url,
        model=engine_server.model,
        uds=str(proxy_dir / "proxy.sock"),
        journal_dir=str(proxy_dir / "journal"),
        max_output_tokens=96,  # the tiny model's answers are short; a bound keeps each call quick on CPU
    )
    with server:
        yield server


# --- real agents ----------------------------------------------------------------------------------


def _sandbox_for(name: str, workspace: Path, home: Path, proxy: CaptureServer) -> HarnessSandbox:
    ro_paths: List[Any] = list(agents.HARNESSES[name].install_paths(HARNESS_ROOT))
    path: List[str] = []
    if agents.HARNESSES[name].kind == "npm" and NODE:
        node_dir = os.path.dirname(os.path.realpath(NODE))
        if not node_dir.startswith(("/usr/", "/bin", "/sbin")):  # the system is shown anyway
            ro_paths.append(os.path.dirname(node_dir))
            path.append(node_dir)
    return HarnessSandbox(
        workspace=workspace, services={"proxy": proxy.uds}, home=home, home_path=HOME, ro_paths=ro_paths, path=path
    )


async def _run_agent(process: HarnessProcess, timeout_s: float) -> Dict[str, Any]:
    """Run to its end (or the timeout); its exit status, time and the last of its output."""
    started = time.monotonic()
    await process.start()
    try:
        code = await process.wait(timeout_s)
        elapsed = time.monotonic() - started
        stdout: List[str] = []
        while True:
            line = await process.read_line(timeout_s=2.0 if code is not None else 0.1)
            if line is None:
                break
            stdout.append(line)
    finally:
        await process.stop()
    return {
        "exit": code if code is not None else "timeout",
        "time_s": round(elapsed, 1),
        "stdout": "\n".join(stdout)[-2000:],
        "stderr": process.drain_stderr()[-3000:],
    }


def _check_capture(proxy: CaptureServer, session_id: str, engine: Any, dialect: str) -> Dict[str, Any]:
    """What a trainer gets from the session: ids and logprobs aligned, masks over the sampled
    tokens only, prompts that re-render to the engine's own ids."""
    rollout = proxy.rollout(session_id)
    assert rollout["metadata"].get("api_type") == dialect, rollout["metadata"]
    trace = proxy.training_trace(session_id)
    assert len(trace.turns) >= 1, rollout
    assert rollout["trainable"], rollout["validation"]
    for turn in trace.turns:
        n_prompt, n_completion = len(turn.prompt_token_ids), len(turn.completion_token_ids)
        assert n_prompt > 0 and n_completion > 0
        assert len(turn.per_token_logps) == n_completion
        assert turn.loss_mask == [0] * n_prompt + [1] * n_completion
        assert all(lp <= 0 for lp in turn.per_token_logps)
    session = proxy.registry.get(session_id)
    document = export_session(session, include_messages=True)
    skew = measure_retokenization_skew(session.graph, document, engine.tokenizer)
    assert skew["n_turns"] == len(trace.turns), skew
    assert skew["n_errors"] == 0, skew
    assert skew["exact_match_frac"] == 1.0 and skew["max_abs_delta"] == 0, skew
    # Turns of one conversation extend each other's tokens: count how many do.
    extended = 0
    for before, after in zip(trace.turns, trace.turns[1:], strict=False):
        seen = before.prompt_token_ids + before.completion_token_ids
        extended += after.prompt_token_ids[: len(seen)] == seen
    return {
        "turns": len(trace.turns),
        "extending": extended,
        "roots": rollout["stats"].get("n_roots"),
        "budget_stops": rollout["budget_stop_count"],
        "prompt_tokens": [len(t.prompt_token_ids) for t in trace.turns],
        "skew": skew["max_abs_delta"],
    }


def _case(name: str) -> Any:
    """A harness as a test case, skipped (before the engine is built) when it cannot run here."""
    why = None
    if agents.HARNESSES[name].kind == "npm" and NODE is None:
        why = "node is not installed (the npm harnesses need node >= 20)"
    elif agents.installed(name, HARNESS_ROOT) is None:
        why = f"{name} is not installed in {HARNESS_ROOT}: run `{agents.HARNESSES[name].install_command}`"
    return pytest.param(name, id=name, marks=[pytest.mark.skipif(why is not None, reason=why or "")])


# The npm harnesses (one per dialect but chat, which opencode speaks) are what `make test` installs;
# the Python ones run when installed too (`bash scripts/install-harnesses.sh python`).
HARNESS_CASES = [
    _case(name)
    for name in ("claude-code", "gemini-cli", "opencode", "codex", "mini-swe-agent", "smolagents", "aider-chat")
]


@needs_bwrap
@pytest.mark.parametrize("name", HARNESS_CASES)
async def test_a_real_agent_in_the_sandbox_is_captured_exactly(
    name: str, proxy: CaptureServer, engine: Any, tmp_path: Path
) -> None:
    executable = agents.installed(name, HARNESS_ROOT)
    assert executable is not None
    session = proxy.create_session(max_model_calls=MAX_CALLS, metadata={"harness": name})
    workspace, home = tmp_path / "workspace", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    (workspace / "README.md").write_text("A small project.\n")
    sandbox = _sandbox_for(name, workspace, home, proxy)
    run = agents.launch(
        name,
        base_url=sandbox.url("proxy"),
        api_key=session["api_key"],
        model=MODEL,
        task=TASK,
        executable=executable,
        home=HOME,
    )
    run.write_files(home)
    # stdin closed: run once, a CLI given its task as an argument still reads its input to the end
    # first (codex waits for it; claude waits 3 s)
    process = HarnessProcess(run.argv, None, env_vars=run.env, sandbox=sandbox, startup_timeout_s=60, stdin="closed")
    outcome = await _run_agent(process, RUN_TIMEOUT_S)
    result = {"dialect": run.dialect, **{k: outcome[k] for k in ("exit", "time_s")}}
    print(
        f"\n[{name}] exit={outcome['exit']} time={outcome['time_s']}s\nstdout: {outcome['stdout']}\n"
        f"stderr: {outcome['stderr']}"
    )
    captured = _check_capture(proxy, session["session_id"], engine, run.dialect)
    result.update(captured)
    print(f"[{name}] {json.dumps(result)}")


# --- the attack -----------------------------------------------------------------------------------

PROBE = r"""
import errno, http.client, json, os, socket, sys
t = json.loads(sys.argv[1])
out = {}


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def call(conn, method, path, key=None, body=None):
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = "Bearer " + key
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    response = conn.getresponse()
    data = response.read()
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    return {"status": response.status, "json": parsed}


def proxy(method, path, key=None, body=None):
    where = t["proxy"]
    if "unix" in where:
        conn = UnixHTTP(where["unix"])
    else:
        conn = http.client.HTTPConnection(where["host"], where["port"], timeout=10)
    return call(conn, method, path, key, body)


def attempt(name, fn):
    try:
        out[name] = {"ok": True, **fn()}
    except (OSError, http.client.HTTPException) as exc:
        out[name] = {"ok": False, "errno": getattr(exc, "errno", None), "error": repr(exc)}
    return out[name]


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

# The proxy, as this agent may use it: its own key works.
attempt("proxy own key call", lambda: proxy("POST", "/v1/chat/completions", t["key"], CHAT))
# (a) the engine directly, at its host port
for host in ("127.0.0.1", "0.0.0.0", "localhost", *t["addresses"]):
    conn = lambda host=host: http.client.HTTPConnection(host, t["engine_port"], timeout=5)
    attempt("engine models " + host, lambda: call(conn(), "GET", "/v1/models"))
    attempt("engine chat " + host, lambda: call(conn(), "POST", "/v1/chat/completions", None, dict(CHAT, model=t["model"])))
# (b) another service on the host
for host in ("127.0.0.1", "0.0.0.0", "localhost", *t["addresses"]):
    attempt("host service " + host, lambda: call(http.client.HTTPConnection(host, t["service_port"], timeout=5), "GET", "/secret"))
attempt("proxy socket by host path", lambda: call(UnixHTTP(t["proxy_socket"]), "GET", "/health"))
# (c) the admin routes: with its own key, with none, with the admin key if it can be found
for label, key in (("own key", t["key"]), ("no key", None)):
    attempt("GET /sessions " + label, lambda: proxy("GET", "/sessions", key))
    attempt("POST /sessions " + label, lambda: proxy("POST", "/sessions", key, {}))
attempt("GET /sessions/own/rollout own key", lambda: proxy("GET", "/sessions/" + t["key"] + "/rollout", t["key"]))
attempt("GET /health own key", lambda: proxy("GET", "/health", t["key"]))
admin_key = None
def read_admin_key():
    with open(t["admin_key_file"]) as handle:
        return {"value": handle.read().strip()}
if attempt("read admin_key file", read_admin_key)["ok"]:
    admin_key = out["read admin_key file"].pop("value")
for name, value in os.environ.items():  # the environment, in case the key was left there
    if "ADMIN" in name.upper():
        admin_key = admin_key or value
out["admin key found"] = admin_key is not None
if admin_key:
    attempt("GET /sessions admin key", lambda: proxy("GET", "/sessions", admin_key))
    attempt("POST /sessions admin key", lambda: proxy("POST", "/sessions", admin_key, {}))
# (d) another session: learn an id (the journal's file names, the admin listing), then use it
ids = set()
def list_journal():
    return {"names": sorted(os.listdir(t["journal_dir"]))}
attempt("list default journal root", lambda: {"names": os.listdir(t["default_journal_root"])})
if attempt("list journal dir", list_journal)["ok"]:
    ids.update(n[: -len(".jsonl")] for n in out["list journal dir"]["names"] if n.endswith(".jsonl"))
listing = out.get("GET /sessions admin key", {}).get("json") or {}
ids.update(s.get("session_id") for s in listing.get("sessions", []) if isinstance(s, dict))
ids.discard(t["key"])
ids.discard(None)
out["other ids learned"] = sorted(ids)
for other in sorted(ids):
    attempt("rollout of other, own key " + other, lambda: proxy("GET", f"/sessions/{other}/rollout", t["key"]))
    if admin_key:
        attempt("rollout of other, admin key " + other, lambda: proxy("GET", f"/sessions/{other}/rollout", admin_key))
    attempt("call as other " + other, lambda: proxy("POST", "/v1/chat/completions", other, CHAT))
attempt("call with a made-up key", lambda: proxy("POST", "/v1/chat/completions", "guess-" + os.urandom(6).hex(), CHAT))
print(json.dumps(out), flush=True)
"""


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


@pytest.fixture(scope="module")
def host_service() -> Iterator[int]:
    """Some other service on the host's 127.0.0.1 (a metadata endpoint, a database's HTTP port)."""

    async def secret(request: Request) -> JSONResponse:
        return JSONResponse({"secret": "host-only"})

    with BackgroundServer(Starlette(routes=[Route("/secret", secret)])) as server:
        yield server.port


@pytest.fixture
def attack_proxy(engine_server: Any) -> Iterator[CaptureServer]:
    """A proxy of the attack's own (the probe, run plainly, uses every session id it learns)."""
    path = Path(f"/tmp/oe-attack-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o700)
    server = CaptureServer(
        llm_url=engine_server.base_url,
        model=engine_server.model,
        uds=str(path / "proxy.sock"),
        journal_dir=str(path / "journal"),
        max_output_tokens=8,
    )
    with server:
        yield server
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim(attack_proxy: CaptureServer) -> str:
    """Another agent's session, with one answered turn."""
    import httpx

    session = attack_proxy.create_session(metadata={"role": "victim"})
    transport = httpx.HTTPTransport(uds=attack_proxy.uds)
    with httpx.Client(transport=transport, base_url=attack_proxy.url, timeout=60) as client:
        reply = client.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {session['api_key']}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
        )
    assert reply.status_code == 200, reply.text
    return session["session_id"]


def _turns(proxy: CaptureServer, session_id: str) -> int:
    return len(proxy.training_trace(session_id).turns)


async def _probe(
    proxy: CaptureServer, engine_server: Any, host_service: int, tmp_path: Path, *, sandboxed: bool
) -> Dict[str, Any]:
    from urllib.parse import urlsplit

    own = proxy.create_session(metadata={"role": "probe", "sandboxed": sandboxed})
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "probe.py").write_text(PROBE)
    sandbox = HarnessSandbox(workspace=workspace, services={"proxy": proxy.uds}) if sandboxed else None
    where = {"host": "127.0.0.1", "port": sandbox.port("proxy")} if sandbox else {"unix": proxy.uds}
    targets = {
        "proxy": where,
        "key": own["api_key"],
        "model": engine_server.model,
        "engine_port": urlsplit(engine_server.base_url).port,
        "service_port": host_service,
        "addresses": _host_addresses(),
        "proxy_socket": proxy.uds,
        "journal_dir": str(proxy.journal_dir),
        "admin_key_file": str(proxy.journal_dir / "admin_key"),
        "default_journal_root": str(state_dir()),  # where a proxy given no journal_dir keeps them
    }
    cwd = None if sandbox else workspace
    process = HarnessProcess([PYTHON, "-I", "probe.py", json.dumps(targets)], cwd, sandbox=sandbox)
    await process.start()
    try:
        line = await process.read_line(timeout_s=120)
        assert line is not None, f"the probe printed nothing; stderr:\n{process.drain_stderr()}"
        return json.loads(line)
    finally:
        await process.stop()


def _summary(result: Dict[str, Any]) -> str:
    """One line per attempt: its HTTP status or the error that stopped it."""
    lines = []
    for key, value in result.items():
        if isinstance(value, dict):
            value = (
                value.get("status", "read") if value.get("ok") else errno.errorcode.get(value["errno"], value["error"])
            )
        lines.append(f"  {key}: {value}")
    return "\n" + "\n".join(lines)


def _refused(result: Dict[str, Any]) -> bool:
    return result["ok"] is False


@needs_bwrap
async def test_in_the_sandbox_the_agent_reaches_only_its_own_session(
    attack_proxy: CaptureServer, engine_server: Any, host_service: int, victim: str, tmp_path: Path
) -> None:
    proxy = attack_proxy
    before = _turns(proxy, victim)
    result = await _probe(proxy, engine_server, host_service, tmp_path, sandboxed=True)
    print("\n[attack, sandboxed]", _summary(result))

    assert result["proxy own key call"]["status"] == 200  # the proxy itself works for it
    for host in ("127.0.0.1", "0.0.0.0", "localhost"):  # (a) no engine: its loopback is not the host's
        assert _refused(result[f"engine models {host}"]) and _refused(result[f"engine chat {host}"]), host
        assert _refused(result[f"host service {host}"]), host  # (b) nor any other host service
    for address in _host_addresses():  # no route off its loopback
        assert _refused(result[f"engine models {address}"]) and _refused(result[f"host service {address}"])
    assert _refused(result["proxy socket by host path"])
    for label in ("own key", "no key"):  # (c) admin routes without the admin key
        assert result[f"GET /sessions {label}"]["status"] == 401, result[f"GET /sessions {label}"]
        assert result[f"POST /sessions {label}"]["status"] == 401
    assert _refused(result["read admin_key file"]) and result["admin key found"] is False
    assert _refused(result["list journal dir"])  # (d) no other session's id to be learned
    assert _refused(result["list default journal root"])
    assert result["other ids learned"] == []
    assert result["GET /sessions/own/rollout own key"]["status"] == 401  # even its own capture is the trainer's
    assert "journal_dir" not in result["GET /health own key"]["json"]
    assert result["call with a made-up key"]["status"] == 401
    assert victim not in json.dumps(result)  # nothing it saw named the other session
    assert _turns(proxy, victim) == before


async def test_without_the_sandbox_the_same_probe_gets_through(
    attack_proxy: CaptureServer, engine_server: Any, host_service: int, victim: str, tmp_path: Path
) -> None:
    proxy = attack_proxy
    before = _turns(proxy, victim)
    result = await _probe(proxy, engine_server, host_service, tmp_path, sandboxed=False)
    print("\n[attack, plain]", _summary(result))

    for host in ("127.0.0.1", "0.0.0.0", "localhost"):  # (a) the engine, unrecorded
        assert result[f"engine models {host}"]["status"] == 200, result[f"engine models {host}"]
        assert result[f"engine chat {host}"]["status"] == 200
    for host in ("127.0.0.1", "0.0.0.0", "localhost"):  # (b)
        assert result[f"host service {host}"]["status"] == 200
    # (c) the proxy still refuses a wrong key, but the admin key lies on the host's disk
    assert result["GET /sessions own key"]["status"] == 401
    assert result["admin key found"] is True
    assert result["GET /sessions admin key"]["status"] == 200
    assert result["POST /sessions admin key"]["status"] == 200
    # (d) another session's id, its rollout, and calls made under it
    assert victim in result["other ids learned"]
    assert result[f"rollout of other, own key {victim}"]["status"] == 401
    assert result[f"rollout of other, admin key {victim}"]["status"] == 200
    assert result[f"call as other {victim}"]["status"] == 200
    assert _turns(proxy, victim) == before + 1  # the attacker's call landed in the victim's rollout
