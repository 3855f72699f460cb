"""Several sandboxed server processes behind one URL (SandboxPool, the front): real sandboxed echo
servers on Unix sockets, a real front on 127.0.0.1, real clients. New sessions go to the
least-loaded process, calls naming a session to the process whose prefix its id carries, the front
answers /health for the whole, bad requests get a clear error, and a process that dies is
restarted while the others' sessions carry on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

import httpx
import pytest
from echo_env import EchoEnv

from openenv.core.client_errors import SessionLostError
from openenv.core.containers.runtime import SandboxPool
from openenv.core.containers.runtime.front import MAX_HEAD_BYTES, Front, Worker
from openenv.core.env_server.limits import ServerLimits
from openenv.core.env_server.mcp_types import CallToolAction

ECHO = str(Path(__file__).resolve().parents[1] / "envs" / "echo_env")


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    with SandboxPool(ECHO, workers=2, env_vars={"ENABLE_WEB_INTERFACE": "1"}) as started:
        yield started


def _rpc(http: httpx.Client, method: str, params: Dict[str, Any], **kwargs: Any) -> httpx.Response:
    return http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, **kwargs)


def _eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _sessions(url: str) -> Dict[str, int]:
    health = httpx.get(url + "/health", timeout=10).json()
    return {w["prefix"]: w["active_sessions"] for w in health["workers"]}


def _server_pid(socket_path: Path) -> int:
    """The host pid of the process serving on ``socket_path``: it holds the listening socket."""
    inodes = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == str(socket_path):
            inodes.add(f"socket:[{fields[6]}]")
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd) in inodes:
                return int(fd.parts[2])
        except OSError:
            continue
    raise AssertionError(f"no process holds {socket_path}")


# --- placement and routing ---------------------------------------------------------------------


def test_new_sessions_go_to_the_least_loaded_process(pool: SandboxPool) -> None:
    clients = [EchoEnv(base_url=pool.base_url).sync() for _ in range(4)]
    try:
        for client in clients:
            client.connect()
        owners = [client._client.session_id.split("-")[0] for client in clients]
        assert sorted(owners) == ["w0", "w0", "w1", "w1"]
        for client, owner in zip(clients, owners, strict=True):  # w0 empties, w1 keeps its two
            if owner == "w0":
                client.close()
        _eventually(lambda: _sessions(pool.base_url) == {"w0": 0, "w1": 2})
        fresh = [EchoEnv(base_url=pool.base_url).sync() for _ in range(2)]
        clients += fresh
        for client in fresh:
            client.connect()
        assert [client._client.session_id.split("-")[0] for client in fresh] == ["w0", "w0"]
    finally:
        for client in clients:
            client.close()


def test_http_calls_naming_a_session_reach_the_process_that_holds_it(pool: SandboxPool) -> None:
    with httpx.Client(base_url=pool.base_url, timeout=30) as http:  # one kept-alive connection for all
        ids = [_rpc(http, "openenv/session/create", {}).json()["result"]["session_id"] for _ in range(4)]
        assert sorted(i.split("-")[0] for i in ids) == ["w0", "w0", "w1", "w1"]
        for _round in range(2):
            for session_id in ids:  # every call names a session: it lands where that session lives
                called = _rpc(
                    http,
                    "tools/call",
                    {"name": "echo_message", "arguments": {"message": session_id}, "session_id": session_id},
                )
                assert called.status_code == 200 and session_id in called.text, called.text
                state = http.get("/state", params={"session_id": session_id})
                assert state.status_code == 200, state.text
        for session_id in ids:
            assert _rpc(http, "openenv/session/close", {"session_id": session_id}).status_code == 200


def test_an_mcp_session_header_reaches_the_process_that_made_it(pool: SandboxPool) -> None:
    with httpx.Client(base_url=pool.base_url, timeout=30, headers={"accept": "application/json"}) as http:
        made = []
        for _ in range(4):
            initialized = _rpc(
                http,
                "initialize",
                {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
            )
            made.append(initialized.headers["mcp-session-id"])
        assert {m.split("-")[0] for m in made} == {"w0", "w1"}
        for session_id in made:
            listed = _rpc(http, "tools/list", {}, headers={"mcp-session-id": session_id})
            assert listed.status_code == 200 and "echo_message" in listed.text, listed.text
            assert http.delete("/mcp", headers={"mcp-session-id": session_id}).status_code < 300


def test_the_web_page_s_session_header_reaches_the_process_that_made_it(pool: SandboxPool) -> None:
    """The playground names its session in ``X-OpenEnv-Session``: with two processes, each call
    must land on the one that made it (a random one would answer 404 half the time)."""
    with httpx.Client(base_url=pool.base_url, timeout=30) as http:
        made = [http.post("/web/session", json={}).json()["session_id"] for _ in range(4)]
        assert sorted(m.split("-")[0] for m in made) == ["w0", "w0", "w1", "w1"]
        for session_id in made:
            headers = {"x-openenv-session": session_id}
            assert http.post("/web/reset", json={}, headers=headers).status_code == 200
            step = {"action": {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": session_id}}}
            view = http.post("/web/step", json=step, headers=headers)
            assert view.status_code == 200 and session_id in view.text, view.text
            assert http.delete("/web/session", headers=headers).status_code == 200


def test_a_websocket_attach_by_session_id_reaches_its_process(pool: SandboxPool) -> None:
    """A production-mode client makes its session over HTTP, then attaches ``/ws?session_id=``:
    a random process would not know it."""
    clients = [EchoEnv(base_url=pool.base_url, mode="production").sync() for _ in range(4)]
    try:
        for number, client in enumerate(clients):
            client.connect()
            result = client.step(CallToolAction(tool_name="echo_message", arguments={"message": f"n{number}"}))
            assert result.observation.result == f"n{number}" or f"n{number}" in str(result.observation)
        assert {c._client._production_session_id.split("-")[0] for c in clients} == {"w0", "w1"}
    finally:
        for client in clients:
            client.close()


def test_a_resumed_connection_reaches_the_process_that_holds_its_session(pool: SandboxPool) -> None:
    """A client whose connection drops resumes its session through the front, naming it in
    ``X-OpenEnv-Resume-Session``: the front sends that handshake to the process holding the
    session (another would refuse it, 404, and the episode would be lost)."""
    from openenv.testing.faults import FaultProxy

    port = int(pool.base_url.rsplit(":", 1)[1])

    async def main() -> None:
        with FaultProxy(port) as p0, FaultProxy(port) as p1, FaultProxy(port) as p2, FaultProxy(port) as p3:
            proxies = [p0, p1, p2, p3]
            clients = [EchoEnv(base_url=proxy.base_url) for proxy in proxies]
            try:
                for client in clients:
                    await client.reset()
                held = [client._resume[0] for client in clients]  # (id, resume token)
                assert {session_id.split("-")[0] for session_id in held} == {"w0", "w1"}
                for number, (proxy, client) in enumerate(zip(proxies, clients, strict=True)):
                    assert proxy.fault("reset")
                    result = await client.step(
                        CallToolAction(tool_name="echo_message", arguments={"message": f"r{number}"})
                    )
                    assert f"r{number}" in str(result.observation)
                    assert client._resume[0] == held[number]  # resumed, not a new session
            finally:
                for client in clients:
                    await client.close()

    asyncio.run(main())
    _eventually(lambda: sum(_sessions(pool.base_url).values()) == 0)  # closed: none left for the next test


def test_a_resume_naming_its_session_in_x_openenv_resume_session_reaches_its_worker() -> None:
    """The front over two in-process servers of this version (Unix sockets, prefixes w0 and w1):
    a resume that names its session in ``X-OpenEnv-Resume-Session`` alone (as this version's
    client sends it) is relayed to the server holding the session, which answers the re-sent call
    from its record."""
    from websockets.asyncio.client import connect as ws_connect

    from .conftest import counter_app, serve

    with (
        serve(counter_app(session_id_prefix="w0"), uds=True) as w0,
        serve(counter_app(session_id_prefix="w1"), uds=True) as w1,
    ):
        loop = asyncio.new_event_loop()
        front = Front([Worker("w0"), Worker("w1")], "127.0.0.1", 0)
        front.set_up("w0", w0.base_url)
        front.set_up("w1", w1.base_url)
        host, port = loop.run_until_complete(front.start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        url = f"ws://{host}:{port}/ws"

        async def main() -> None:
            dropped = []
            for delta in range(1, 5):
                ws = await ws_connect(url, additional_headers={"X-OpenEnv-Resume": "1"})
                granted = (
                    ws.response.headers["x-openenv-resume-session"],
                    ws.response.headers["x-openenv-resume-token"],
                )
                await ws.send(json.dumps({"type": "step", "data": {"delta": delta}, "seq": 1}))
                dropped.append((granted, await ws.recv()))
                ws.transport.abort()  # no close: the session waits for its resume
            assert {granted[0].split("-")[0] for granted, _ in dropped} == {"w0", "w1"}
            # w1's first: the front's turn among equally loaded workers would not match that order
            for (session_id, token), answer in sorted(dropped, key=lambda each: each[0][0], reverse=True):
                headers = {"X-OpenEnv-Resume-Session": session_id, "X-OpenEnv-Resume-Token": token}
                async with ws_connect(url, additional_headers=headers) as resumed:
                    await resumed.send(json.dumps({"type": "step", "data": {"delta": 100}, "seq": 1}))
                    assert await resumed.recv() == answer  # the call's recorded answer: its own session
                    await resumed.send('{"type":"close"}')

        try:
            asyncio.run(main())
        finally:
            asyncio.run_coroutine_threadsafe(front.close(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


def test_health_reports_the_whole_pool(pool: SandboxPool) -> None:
    with EchoEnv(base_url=pool.base_url).sync() as client:
        client.reset()
        health = httpx.get(pool.base_url + "/health", timeout=10).json()
    assert health["status"] == "healthy"
    assert health["max_sessions"] == 2 * 64  # the echo server holds 64 sessions per process
    assert health["active_sessions"] == 1
    assert [w["prefix"] for w in health["workers"]] == ["w0", "w1"]
    assert all(w["status"] == "healthy" and w["max_sessions"] == 64 for w in health["workers"])
    metadata = httpx.get(pool.base_url + "/metadata", timeout=10)
    assert metadata.status_code == 200 and metadata.json()["name"]


# --- bad input -----------------------------------------------------------------------------------


def _raw(address: Any, data: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.sendall(data)
        chunks = []
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


@pytest.fixture
def strict_front(pool: SandboxPool) -> Iterator[Any]:
    """A second front over the pool's processes, with small limits (this machine's clients capped too)."""
    loop = asyncio.new_event_loop()
    front = Front(
        [Worker(prefix) for prefix in pool.prefixes],
        "127.0.0.1",
        0,
        limits=ServerLimits(max_message_mb=1, header_timeout_s=1),
        max_per_client=3,
        cap_local=True,
    )
    for prefix, provider in pool.providers.items():
        front.set_up(prefix, provider.base_url)
    address = loop.run_until_complete(front.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield address
    asyncio.run_coroutine_threadsafe(front.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [
        (b"GET /state?session_id=w9-1234 HTTP/1.1\r\nhost: x\r\n\r\n", 404, b"their ids start with w0-, w1-"),
        (b"GET /ws?session_id=12345678-aaaa HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n", 404, b"Unknown session_id"),
        (b"this is not http\r\n\r\n", 400, b"malformed HTTP request"),
        (b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n", 431, b"larger than"),
        (b"POST /step HTTP/1.1\r\nhost: x\r\ncontent-length: 2000000\r\n\r\n{", 413, b"OPENENV_MAX_MESSAGE_MB"),
        (b"POST /step HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n" + b"100000\r\n" + b"{" * 0x100000 + b"\r\n" + b"100000\r\n" + b"{" * 0x100000 + b"\r\n", 413, b"OPENENV_MAX_MESSAGE_MB"),
        (b"GET /health HTTP/1.1\r\nhost: x\r\n", 408, b"OPENENV_HEADER_TIMEOUT_S"),
        (b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nhost: 127.0.0.1:22\r\n\r\n", 400, b"only WebSocket upgrades"),
        (b"GET /ws HTTP/1.1\r\nhost: x\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n", 400, b"only WebSocket upgrades"),
    ],
    ids=["unknown-prefix", "unprefixed-attach", "malformed", "head-too-large", "body-too-large", "chunks-too-large", "slow-head", "connect", "not-websocket-upgrade"],
)  # fmt: skip
def test_bad_requests_get_a_clear_error_and_the_front_keeps_serving(strict_front, request_bytes, status, says) -> None:
    answer = _raw(strict_front, request_bytes)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    assert b"application/json" in answer and says in answer, answer[:400]
    host, port = strict_front
    assert httpx.get(f"http://{host}:{port}/health", timeout=10).json()["status"] == "healthy"


def test_a_deeply_nested_body_is_relayed_to_its_worker_and_answered(strict_front) -> None:
    body = b"[" * 200_000 + b"]" * 200_000  # json.loads would raise RecursionError in the front
    head = b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    answer = _raw(strict_front, head % len(body) + body)
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    host, port = strict_front
    assert httpx.get(f"http://{host}:{port}/health", timeout=10).json()["status"] == "healthy"


def test_a_create_sent_again_with_its_key_reaches_the_worker_that_made_it(pool: SandboxPool) -> None:
    """A resumable client whose create answer was lost sends it again with the same
    X-OpenEnv-Create-Key: least-loaded placement would put it on another worker, which does not
    know the key and would make a second session."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}
    with httpx.Client(base_url=pool.base_url, timeout=30) as http:
        made = {}
        for key in ("key-a", "key-b", "key-c", "key-d"):
            first = http.post("/mcp", json=body, headers={"x-openenv-create-key": key}).json()["result"]["session_id"]
            again = http.post("/mcp", json=body, headers={"x-openenv-create-key": key}).json()["result"]["session_id"]
            assert again == first, key
            made[key] = first
        for session_id in made.values():
            assert _rpc(http, "openenv/session/close", {"session_id": session_id}).status_code == 200


def test_the_front_caps_connections_per_client_address(strict_front) -> None:
    held = [socket.create_connection(strict_front, timeout=10) for _ in range(3)]
    try:
        refused = _raw(strict_front, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 503 ") and b"TOO_MANY_CONNECTIONS" in refused, refused[:300]
    finally:
        for conn in held:
            conn.close()
    host, port = strict_front
    _eventually(lambda: httpx.get(f"http://{host}:{port}/health", timeout=10).status_code == 200)


def test_a_session_of_a_stopped_process_is_refused_with_a_reason() -> None:
    front = Front([Worker("w0"), Worker("w1")], "127.0.0.1", 0)
    front.set_up("w0", "/nonexistent")
    with pytest.raises(Exception, match="w1, stopped") as caught:
        front.owner("w1-1234")
    assert caught.value.status == 404


# --- a process that dies --------------------------------------------------------------------------


def test_a_killed_process_ends_only_its_own_sessions_and_comes_back() -> None:
    with SandboxPool(ECHO, workers=2) as pool:
        clients = [EchoEnv(base_url=pool.base_url).sync() for _ in range(2)]
        try:
            for client in clients:
                client.reset()
            by_owner = {client._client.session_id.split("-")[0]: client for client in clients}
            assert set(by_owner) == {"w0", "w1"}
            old_socket = pool.providers["w0"].socket_path
            os.kill(_server_pid(old_socket), signal.SIGKILL)
            with pytest.raises(SessionLostError):
                by_owner["w0"].step(CallToolAction(tool_name="echo_message", arguments={"message": "x"}))
            survivor = by_owner["w1"].step(CallToolAction(tool_name="echo_message", arguments={"message": "still"}))
            assert "still" in str(survivor.observation)
            _eventually(lambda: pool.status()[0]["restarts"] == 1 and pool.status()[0]["status"] == "healthy")
            assert pool.providers["w0"].socket_path != old_socket
            again = EchoEnv(base_url=pool.base_url).sync()
            clients.append(again)
            again.reset()
            assert again._client.session_id.startswith("w0-")  # the emptier one
            back = again.step(CallToolAction(tool_name="echo_message", arguments={"message": "back"}))
            assert "back" in str(back.observation)
        finally:
            for client in clients:
                client.close()


# --- forks behind one URL ---------------------------------------------------------------------------

GRID_WORLD = str(Path(__file__).resolve().parents[1] / "envs" / "grid_world_env")


def test_forks_spread_over_the_processes_and_continue_exactly() -> None:
    """The processes behind one URL share a snapshot key (the pool draws one): ``fork`` opens its
    sessions through the front, which spreads them, and each continues from the fork point on
    whichever process it landed."""
    from openenv.core.generic_client import GenericEnvClient

    moves = [{"action": a} for a in ("RIGHT", "DOWN", "RIGHT", "DOWN")]
    with SandboxPool(GRID_WORLD, workers=2) as grid:

        async def main() -> None:
            async with GenericEnvClient(base_url=grid.base_url) as env:
                await env.reset(seed=2)
                await env.step({"action": "DOWN"})
                forks = await env.fork(3)
                expected = [(r.observation, r.reward) for r in [await env.step(m) for m in moves]]
                owners = {client._resume[0].split("-")[0] for client in [env, *forks]}  # (id, resume token)
                assert owners == {"w0", "w1"}
                for fork in forks:
                    assert [(r.observation, r.reward) for r in [await fork.step(m) for m in moves]] == expected

        asyncio.run(main())


def test_an_agent_credential_reaches_its_session_through_the_front() -> None:
    """Roles behind one URL: the orchestrator's session lives on one of the processes; the agent's
    calls (its credential, no session named) are routed to that process by the credential, which
    that process checks; what the agent may not do is refused there."""
    from openenv.core.generic_client import GenericEnvClient

    token = "front-orchestrator-token-0123456789"
    with SandboxPool(ECHO, workers=2, env_vars={"OPENENV_AUTH_TOKEN": token}) as pool:

        async def main() -> None:
            boss = {"Authorization": f"Bearer {token}"}
            async with (
                GenericEnvClient(base_url=pool.base_url, headers=boss) as first,
                GenericEnvClient(base_url=pool.base_url, headers=boss) as second,
            ):
                await first.reset()
                await second.reset()  # (one session on each process)
                credential = await second.agent_token()
                # on w1: a call naming no session would go to w0 (the emptier, first): only the
                # credential's session takes it to w1
                assert credential["session_id"].startswith("w1-")
                agent = {"Authorization": f"Bearer {credential['token']}"}
                async with httpx.AsyncClient(base_url=pool.base_url, headers=agent, timeout=30) as http:
                    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
                    init = await http.post("/mcp", json=body)
                    assert init.headers["mcp-session-id"] == credential["session_id"]
                    body = {
                        "jsonrpc": "2.0",
                        "id": 2,
                        "method": "tools/call",
                        "params": {"name": "echo_message", "arguments": {"message": "hi"}},
                    }
                    assert (await http.post("/mcp", json=body)).json()["result"]["data"] == "hi"
                    refused = await http.post("/reset", json={"session_id": credential["session_id"]})
                    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"

        asyncio.run(main())


def test_the_front_reads_the_session_an_agent_credential_names() -> None:
    from openenv.core.containers.runtime.front import _agent_session

    assert _agent_session("Bearer oe-agent.w1-1b2c.1800000000.ab12.mac") == "w1-1b2c"
    assert _agent_session("bearer oe-agent.w0-a.b.c.1800000000.ab12.mac") == "w0-a.b.c"
    assert _agent_session("Bearer some-orchestrator-token") is None
    assert _agent_session("Bearer oe-agent.too.short") is None
    assert _agent_session(None) is None


def test_metrics_answer_for_every_process(pool: SandboxPool) -> None:
    """``GET /openenv/metrics`` and MCP's ``openenv/metrics`` through the front: every process's
    sessions and counts, not the one process a request would have reached."""

    async def main() -> None:
        async with EchoEnv(base_url=pool.base_url) as first, EchoEnv(base_url=pool.base_url) as second:
            await first.reset()
            await second.reset()  # (one session on each process: the front spreads them)
            for _ in range(3):
                await first.step(CallToolAction(tool_name="echo_message", arguments={"message": "a"}))
            await second.step(CallToolAction(tool_name="echo_message", arguments={"message": "b"}))
            async with httpx.AsyncClient(base_url=pool.base_url, timeout=30) as http:
                over_http = (await http.get("/openenv/metrics")).json()
                body = {"jsonrpc": "2.0", "id": 7, "method": "openenv/metrics", "params": {}}
                over_mcp = (await http.post("/mcp", json=body)).json()
            assert over_mcp["id"] == 7
            ours = {first._resume[0]: 3, second._resume[0]: 1}
            assert {session_id[:3] for session_id in ours} == {"w0-", "w1-"}
            for metrics in (over_http, over_mcp["result"]):
                assert metrics["workers"] == ["w0", "w1"] and "unreported_workers" not in metrics
                assert metrics["max_sessions"] == 2 * 64
                steps = {s["session_id"]: s["steps"] for s in metrics["sessions"]}
                assert {session_id: steps.get(session_id) for session_id in ours} == ours, metrics
                assert metrics["active_sessions"] >= 2 and metrics["steps"] >= 4

    asyncio.run(main())


def test_metrics_through_the_front_are_each_process_s_to_refuse() -> None:
    """The caller's credential goes with the front's question to every process, which checks it:
    none is refused (401), an agent's is refused (403), the orchestrator's is answered for all."""
    from openenv.core.containers.runtime.front import merge_metrics
    from openenv.core.generic_client import GenericEnvClient

    assert merge_metrics(
        [("w0", {"steps": 2, "sessions": [1], "ok": True}), ("w1", {"steps": 3, "sessions": [2]})]
    ) == {
        "steps": 5,
        "sessions": [1, 2],
        "ok": True,
        "workers": ["w0", "w1"],
    }
    token = "front-orchestrator-token-0123456789"
    with SandboxPool(ECHO, workers=2, env_vars={"OPENENV_AUTH_TOKEN": token}) as pool:

        async def main() -> None:
            boss = {"Authorization": f"Bearer {token}"}
            async with GenericEnvClient(base_url=pool.base_url, headers=boss) as env:
                await env.reset()
                credential = await env.agent_token()
                async with httpx.AsyncClient(base_url=pool.base_url, timeout=30) as http:
                    assert (await http.get("/openenv/metrics")).status_code == 401
                    agent = {"Authorization": f"Bearer {credential['token']}"}
                    refused = await http.get("/openenv/metrics", headers=agent)
                    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"
                    answered = (await http.get("/openenv/metrics", headers=boss)).json()
                    assert answered["workers"] == ["w0", "w1"] and answered["active_sessions"] == 1

        asyncio.run(main())
