"""The front of ``openenv serve --workers`` (``SandboxPool``) under hostile clients: real sandboxed
echo servers on Unix sockets, a real front on 127.0.0.1 (in a process of its own where its memory
or descriptors are measured), real sockets.

Each attack is scaled down where the issue's figures would cost minutes (1,000 long create keys
rather than 2,500; a soft limit of 256 descriptors rather than 1,024) and stops by itself. The
figures print with ``pytest -s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import logging
import resource
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from openenv.core.containers.runtime import SandboxPool
from openenv.core.containers.runtime.front import Front, Worker
from openenv.core.env_server.limits import ServerLimits

REPO = Path(__file__).resolve().parents[2]
ECHO = str(REPO / "envs" / "echo_env")
CHILD = Path(__file__).with_name("front_child.py")
TOKEN = "front-attack-token"
MIB = 1024 * 1024
SECRET = "cannot open /srv/keys/private.pem"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    with SandboxPool(ECHO, workers=2) as started:
        yield started


@pytest.fixture(scope="module")
def guarded_pool() -> Iterator[SandboxPool]:
    """Workers that require a bearer token: every unauthenticated request is answered 401."""
    with SandboxPool(ECHO, workers=2, env_vars={"OPENENV_AUTH_TOKEN": TOKEN}) as started:
        yield started


# --- fronts to attack ------------------------------------------------------------------------------


@contextlib.contextmanager
def front_over(pool: SandboxPool, **options: Any) -> Iterator[Tuple[Front, Tuple[str, int]]]:
    """A front of this process over ``pool``'s workers, on a loop thread of its own."""
    loop = asyncio.new_event_loop()
    front = Front([Worker(prefix) for prefix in pool.prefixes], "127.0.0.1", 0, **options)
    for prefix, provider in pool.providers.items():
        front.set_up(prefix, provider.base_url)
    address = loop.run_until_complete(front.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield front, address
    finally:
        asyncio.run_coroutine_threadsafe(front.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


class ChildFront:
    """A front in a process of its own (``front_child.py``) over a pool's workers."""

    def __init__(self, pool: SandboxPool, log: Path, **config: Any) -> None:
        config["workers"] = {prefix: p.base_url for prefix, p in pool.providers.items()}
        self.log = log
        with open(log, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(CHILD), json.dumps(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the front did not start: {log.read_text()}"
        started = json.loads(line)
        self.address = ("127.0.0.1", int(started["port"]))
        self.url = f"http://127.0.0.1:{started['port']}"
        self.nofile = started["nofile"]
        self.max_connections = started["max_connections"]

    def _status(self, field: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field}")

    def rss_kib(self) -> int:
        return self._status("VmRSS")

    def peak_kib(self) -> int:
        """The most resident memory since :meth:`reset_peak`."""
        return self._status("VmHWM")

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def stop(self) -> str:
        """Stop it; what it logged."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        return self.log.read_text()


@contextlib.contextmanager
def child_front(pool: SandboxPool, tmp_path: Path, **config: Any) -> Iterator[ChildFront]:
    front = ChildFront(pool, tmp_path / "front.log", **config)
    try:
        yield front
    finally:
        front.stop()


# --- raw HTTP --------------------------------------------------------------------------------------


def raw(address: Any, data: bytes, timeout: float = 10.0, source: Optional[str] = None) -> bytes:
    """Send ``data`` on a new connection (from ``source``, an address of this machine) and read
    until the server closes it."""
    with socket.create_connection(address, timeout=timeout, source_address=(source, 0) if source else None) as conn:
        conn.sendall(data)
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks)


def post(path: str, body: bytes, *headers: str, version: str = "1.1") -> bytes:
    lines = [f"POST {path} HTTP/{version}", *headers, "content-type: application/json", f"content-length: {len(body)}"]
    if version == "1.1":
        lines.insert(1, "host: front")
        if not any(h.lower().startswith("connection:") for h in headers):
            lines.append("connection: close")  # (raw() reads until the connection ends)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def step_body(session_id: Optional[str], message: str = "m") -> bytes:
    action = {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": message}}
    return json.dumps({"action": action, **({"session_id": session_id} if session_id else {})}).encode()


def steps_of(url: str, session_id: str) -> int:
    state = httpx.get(url + "/state", params={"session_id": session_id}, timeout=10)
    assert state.status_code == 200, state.text
    return int(state.json()["step_count"])


def new_session(url: str, **headers: str) -> str:
    created = httpx.post(
        url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}, headers=headers, timeout=10
    )
    assert created.status_code == 200, created.text
    return created.json()["result"]["session_id"]


def close_session(url: str, session_id: str, **headers: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/close", "params": {"session_id": session_id}}
    httpx.post(url + "/mcp", json=body, headers=headers, timeout=10)


def an_episode(url: str) -> None:
    """What a trainer does over HTTP: make a session, step it, read its state, close it."""
    with httpx.Client(base_url=url, timeout=5) as http:
        session_id = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}).json()[
            "result"
        ]["session_id"]
        stepped = http.post("/step", content=step_body(session_id, "still here"), headers=JSON)
        assert stepped.status_code == 200 and "still here" in stepped.text, stepped.text
        assert http.get("/state", params={"session_id": session_id}).json()["step_count"] == 1
        body = {"jsonrpc": "2.0", "id": 2, "method": "openenv/session/close", "params": {"session_id": session_id}}
        assert http.post("/mcp", json=body).status_code == 200


def answers_within(socks: List[socket.socket], expected: int, timeout: float) -> List[bytes]:
    """What each of ``socks`` received before the server closed it, for those it closed within
    ``timeout`` (waiting no longer once ``expected`` have been)."""
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, bytearray())
    closed: List[bytes] = []
    deadline = time.monotonic() + timeout
    while len(closed) < expected and time.monotonic() < deadline and selector.get_map():
        for key, _events in selector.select(timeout=0.2):
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                key.data.extend(data)
            else:
                selector.unregister(key.fileobj)
                closed.append(bytes(key.data))
    selector.close()
    for sock in socks:
        sock.setblocking(True)
    return closed


# --- 4a: create keys -------------------------------------------------------------------------------


def test_long_create_keys_leave_nothing_behind_in_the_front(guarded_pool: SandboxPool, tmp_path: Path) -> None:
    """1,000 unauthenticated creates, each with its own 60 KB ``X-OpenEnv-Create-Key``: once the
    front kept every key it saw (about 60 MiB here, 3.7 GiB at its cap of 65,536 keys)."""
    create = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}).encode()
    with child_front(guarded_pool, tmp_path, token=TOKEN) as front:
        for number in range(20):  # the front's own start-up allocations, before measuring
            raw(front.address, post("/mcp", create, f"x-openenv-create-key: warm-{number}"))
        before = front.rss_kib()
        front.reset_peak()
        statuses: Dict[bytes, int] = {}
        for number in range(1000):
            key = f"{number:06d}" + "k" * 60_000
            answer = raw(front.address, post("/mcp", create, f"x-openenv-create-key: {key}"))
            status = answer[9:12]
            statuses[status] = statuses.get(status, 0) + 1
        peak, after = front.peak_kib(), front.rss_kib()
    print(f"\n60 KB create keys x1000: front RSS {before} KiB, peak {peak} KiB, after {after} KiB; answers {statuses}")
    assert set(statuses) <= {b"400", b"401"}, statuses  # refused (too long) or unauthenticated: never made
    assert peak - before < 16 * 1024, (before, peak)
    assert after - before < 8 * 1024, (before, after)


def test_only_a_create_its_worker_made_is_remembered_and_as_a_digest(guarded_pool: SandboxPool) -> None:
    create = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}
    with front_over(guarded_pool, token=TOKEN) as (front, (host, port)):
        url = f"http://{host}:{port}"
        with httpx.Client(base_url=url, timeout=10) as http:
            for number in range(20):  # refused by the worker: nothing to come back to
                refused = http.post("/mcp", json=create, headers={"x-openenv-create-key": f"key-{number:028d}"})
                assert refused.status_code == 401, refused.text
            assert len(front._create_keys) == 0
            key = "k" * 32
            auth = {"authorization": f"Bearer {TOKEN}", "x-openenv-create-key": key}
            first = http.post("/mcp", json=create, headers=auth).json()["result"]["session_id"]
            again = http.post("/mcp", json=create, headers=auth).json()["result"]["session_id"]
            assert again == first
            assert list(front._create_keys) == [hashlib.blake2b(key.encode(), digest_size=16).digest()]
            too_long = http.post("/mcp", json=create, headers={**auth, "x-openenv-create-key": "k" * 129})
            assert too_long.status_code == 400 and "X-OpenEnv-Create-Key" in too_long.json()["detail"]
        close_session(url, first, authorization=f"Bearer {TOKEN}")


# --- 4b: bodies ------------------------------------------------------------------------------------


def test_large_bodies_stream_through_the_front_without_piling_up(pool: SandboxPool, tmp_path: Path) -> None:
    """10 connections each sending all but the last byte of a 31 MiB body: once the front held
    every body whole (twice), 622 MiB; now each streams on to its worker as it comes."""
    size = 31 * MIB
    head = post("/step", b"").replace(b"content-length: 0", b"content-length: %d" % size)
    piece = b" " * MIB
    with child_front(pool, tmp_path) as front:
        raw(front.address, post("/step", step_body(None)))
        before = front.rss_kib()
        front.reset_peak()
        conns = [socket.create_connection(front.address, timeout=30) for _ in range(10)]
        try:
            open_ = list(conns)
            for conn in conns:
                conn.sendall(head)
            for number in range(31):
                for conn in list(open_):
                    try:
                        conn.sendall(piece if number < 30 else piece[:-1])
                    except OSError:  # answered early (a worker's own budget: 503) and closed
                        open_.remove(conn)
            held = front.rss_kib()
            peak = front.peak_kib()
        finally:
            for conn in conns:
                conn.close()
        time.sleep(0.5)  # (the front lets go of closed connections on its next turns)
        after = front.rss_kib()
    print(
        f"\n10 x 31 MiB bodies: front RSS {before} KiB, peak {peak} KiB, while held {held} KiB, after {after} KiB; "
        f"{len(open_)} bodies all but sent"
    )
    assert open_, "no body got through"
    assert peak - before < 32 * 1024, (before, peak)
    assert after - before < 16 * 1024, (before, after)


def test_bodies_read_to_route_them_draw_on_one_budget(pool: SandboxPool, tmp_path: Path) -> None:
    """Bodies the front reads to find their session (up to 1 MiB) count against one budget for all
    its connections (here 4 MiB): 40 connections each sending all but the last byte of 900 KiB."""
    size = 900 * 1024
    head = post("/step", b"").replace(b"content-length: 0", b"content-length: %d" % size)
    with child_front(pool, tmp_path, limits={"max_inflight_mb": 4}) as front:
        raw(front.address, post("/step", step_body(None)))
        before = front.rss_kib()
        front.reset_peak()
        conns = [socket.create_connection(front.address, timeout=10) for _ in range(40)]
        try:
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.sendall(head + b" " * (size - 1))
            answers = answers_within(conns, expected=36, timeout=10)
            peak = front.peak_kib()
        finally:
            for conn in conns:
                conn.close()
        time.sleep(0.5)
        after = front.rss_kib()
        an_episode(front.url)  # and the front serves as before
    print(f"\n40 x 900 KiB bodies, budget 4 MiB: front RSS {before} KiB, peak {peak} KiB, after {after} KiB")
    busy = [a for a in answers if a.startswith(b"HTTP/1.1 503 ") and b"OPENENV_MAX_INFLIGHT_MB" in a]
    assert len(busy) == 36, answers[:3]  # 4 x 900 KiB fit in 4 MiB
    # the budget, and what each connection's socket reader may hold before the front reads its head
    # (it stops reading from its socket past 512 KiB, after a read of up to 256 KiB)
    assert peak - before < 4 * 1024 + 40 * 768, (before, peak)


@pytest.mark.parametrize("named", [True, False], ids=["read-to-route", "streamed"])
def test_a_trickled_request_is_cut_at_its_deadline_and_never_runs(pool: SandboxPool, named: bool) -> None:
    """One byte every 0.2 s keeps each read within the header timeout (1 s): the whole request
    must still arrive within OPENENV_REQUEST_TIMEOUT_S (here 2 s), and its worker runs nothing."""
    session_id = new_session(pool.base_url)
    body = step_body(session_id) if named else step_body(session_id) + b" " * (2 * MIB)  # 2 MiB: not read ahead
    path = "/step" if named else f"/step?session_id={session_id}"
    limits = ServerLimits(header_timeout_s=1, request_timeout_s=2)
    with front_over(pool, limits=limits) as (_front, address):
        with socket.create_connection(address, timeout=10) as conn:
            conn.sendall(post(path, b"").replace(b"content-length: 0", b"content-length: %d" % len(body)))
            began = time.monotonic()
            answer = b""
            for byte in body[:40]:  # at most 8 s
                conn.sendall(bytes([byte]))
                ready, _, _ = select.select([conn], [], [], 0.2)
                if ready:
                    answer = conn.recv(65536)
                    break
            took = time.monotonic() - began
    assert answer.startswith(b"HTTP/1.1 408 ") and b"OPENENV_REQUEST_TIMEOUT_S" in answer, answer[:300]
    assert 1.5 < took < 4, took
    assert steps_of(pool.base_url, session_id) == 0
    close_session(pool.base_url, session_id)


def test_a_kept_alive_connection_outlives_one_request_s_deadline(pool: SandboxPool) -> None:
    """The deadline is each request's, from its own first byte: a trainer's kept-alive connection
    is not cut for having lived longer."""
    session_id = new_session(pool.base_url)
    with front_over(pool, limits=ServerLimits(header_timeout_s=5, request_timeout_s=1)) as (_front, (host, port)):
        trainer = http.client.HTTPConnection(host, port, timeout=10)
        try:
            for number in range(3):
                trainer.request("POST", "/step", body=step_body(session_id, f"n{number}"), headers=JSON)
                answer = trainer.getresponse()
                assert answer.status == 200 and f"n{number}".encode() in answer.read()
                time.sleep(1.2)  # past the first request's deadline, within the header timeout
        finally:
            trainer.close()
    close_session(pool.base_url, session_id)


# --- 4c: descriptors and connections --------------------------------------------------------------


def test_the_front_raises_its_descriptor_limit_and_serves_past_the_usual_soft_one(
    pool: SandboxPool, tmp_path: Path
) -> None:
    """300 trickled connections against a soft limit of 256 descriptors (the usual 1,024, scaled
    down): once they took every descriptor and a normal episode found no answer."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"this machine's hard limit of open files is {hard}: nothing to raise to")
    with child_front(pool, tmp_path, nofile=[256, hard], limits={"header_timeout_s": 30}) as front:
        trickled = []
        try:
            for _ in range(300):
                conn = socket.create_connection(front.address, timeout=10)
                conn.sendall(b"POST /step HTTP/1.1\r\nhost: x\r\n")  # a head that never ends
                trickled.append(conn)
            an_episode(front.url)
        finally:
            for conn in trickled:
                conn.close()
    print(f"\n300 trickled connections, soft limit 256: the front ran with a soft limit of {front.nofile}")


def test_past_its_descriptors_the_front_refuses_new_connections_and_keeps_those_it_holds(
    pool: SandboxPool, tmp_path: Path
) -> None:
    """With no higher limit to raise to (hard limit 256), 300 idle connections: the front holds
    what two descriptors each allow, answers the rest 503 at once, and a client it holds still
    reaches every worker (each switch of worker opens a new connection to it)."""
    sessions = [new_session(pool.base_url) for _ in range(2)]
    assert {s.split("-")[0] for s in sessions} == {"w0", "w1"}
    with child_front(pool, tmp_path, nofile=[256, 256], limits={"header_timeout_s": 30}) as front:
        capacity = (256 - 128) // 2
        with httpx.Client(base_url=front.url, timeout=5) as trainer:  # one kept-alive connection
            assert trainer.get("/state", params={"session_id": sessions[0]}).status_code == 200
            flood = [socket.create_connection(front.address, timeout=10) for _ in range(300)]
            try:
                refused = answers_within(flood, expected=300 - (capacity - 1), timeout=15)
                for round_ in range(3):
                    for session_id in sessions:
                        state = trainer.get("/state", params={"session_id": session_id})
                        assert state.status_code == 200, (round_, state.text)
            finally:
                for conn in flood:
                    conn.close()
    print(f"\n300 idle connections, hard limit 256: {len(refused)} answered 503, the front holds {capacity}")
    assert front.max_connections == capacity
    assert len(refused) >= 300 - capacity, len(refused)
    assert all(a.startswith(b"HTTP/1.1 503 ") and b"SERVER_BUSY" in a for a in refused), refused[:2]


def test_the_front_caps_this_machine_s_connections_as_the_workers_do(pool: SandboxPool) -> None:
    """``OPENENV_MAX_LOCAL_CONNECTIONS`` bounds this machine's clients together, at the front too."""
    with front_over(pool, limits=ServerLimits(max_local_connections=3)) as (front, address):
        held = [socket.create_connection(address, timeout=10) for _ in range(3)]
        try:
            deadline = time.monotonic() + 10
            while sum(front.open.values()) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            refused = raw(address, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert refused.startswith(b"HTTP/1.1 503 ") and b"TOO_MANY_CONNECTIONS" in refused, refused[:300]
            assert b"OPENENV_MAX_LOCAL_CONNECTIONS" in refused, refused
        finally:
            for conn in held:
                conn.close()
        deadline = time.monotonic() + 10
        while front.open and time.monotonic() < deadline:
            time.sleep(0.02)
        assert raw(address, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").startswith(b"HTTP/1.1 200 ")


# --- 5: HTTP/1.0 -----------------------------------------------------------------------------------


def test_http_1_0_calls_through_the_front_are_answered_and_run_once(pool: SandboxPool, caplog: Any) -> None:
    """20 ``POST /step`` in HTTP/1.0 (no Host, as HTTP/1.0 clients send them): once each ran on its
    worker and none was answered."""
    caplog.set_level(logging.WARNING)
    session_id = new_session(pool.base_url)
    before = steps_of(pool.base_url, session_id)
    host, port = pool.front.address
    for number in range(20):
        extra = ["connection: keep-alive"] if number % 2 else []
        answer = raw((host, port), post("/step", step_body(session_id, f"call-{number}"), *extra, version="1.0"))
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert f"call-{number}".encode() in answer
    assert steps_of(pool.base_url, session_id) == before + 20
    close_session(pool.base_url, session_id)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-2000:]


# --- 8: who the client is --------------------------------------------------------------------------

FAILING_APP = f"""
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class Poke(Action):
    pass


class FailingEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation()

    def step(self, action, timeout_s=None, **kwargs):
        raise RuntimeError({SECRET!r})

    @property
    def state(self):
        return State(episode_id="failing", step_count=0)


app = create_app(FailingEnv, Poke, Observation, env_name="failing_env")
"""


@pytest.fixture(scope="module")
def failing_package(tmp_path_factory: Any) -> Path:
    package = tmp_path_factory.mktemp("failing") / "failing_env"
    (package / "server").mkdir(parents=True)
    (package / "openenv.yaml").write_text("spec_version: 1\nname: failing_env\ntype: space\napp: server.app:app\n")
    (package / "__init__.py").write_text("")
    (package / "server" / "__init__.py").write_text("")
    (package / "server" / "app.py").write_text(FAILING_APP)
    return package


def this_machines_other_address() -> Optional[str]:
    """An address of this machine that is not a loopback one, from which a connection to
    127.0.0.1 can be made: a client the front must take for a remote one (None: there is none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route's source
        except OSError:
            return None
        address = probe.getsockname()[0]
    if address.startswith("127."):
        return None
    with socket.socket() as listener, socket.socket() as client:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        try:
            client.bind((address, 0))
            client.settimeout(2)
            client.connect(listener.getsockname())
        except OSError:
            return None
    return address


def test_a_remote_client_gets_no_exception_text_through_the_front(failing_package: Path) -> None:
    """Behind the front every client was a Unix-socket peer of its worker, so a remote one got the
    environment's exception text; forged forwarding headers must not bring it back."""
    remote = this_machines_other_address()
    if remote is None:
        pytest.skip("this machine has no address other than loopback to connect from")
    failing_step = json.dumps({"action": {}}).encode()
    with SandboxPool(str(failing_package), workers=2) as failing:
        address = failing.front.address
        forged = [
            [],
            ["x-forwarded-for: 127.0.0.1"],
            ["forwarded: for=127.0.0.1", "x-real-ip: 127.0.0.1", "X-Forwarded-For: ::1"],
        ]
        for headers in forged:
            answer = raw(address, post("/step", failing_step, *headers), source=remote)
            assert answer.startswith(b"HTTP/1.1 500 "), answer[:300]
            assert SECRET.encode() not in answer and b"RuntimeError raised in the environment" in answer, answer
        sock = socket.create_connection(address, timeout=10, source_address=(remote, 0))
        with ws_connect(f"ws://127.0.0.1:{address[1]}/ws", sock=sock, open_timeout=10) as ws:
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(10))["type"] == "observation"
            ws.send(json.dumps({"type": "step", "data": {}}))
            frame = json.loads(ws.recv(10))
        assert frame["type"] == "error" and SECRET not in json.dumps(frame), frame
        local = raw(address, post("/step", failing_step))  # a trainer on this machine still gets it
        assert local.startswith(b"HTTP/1.1 500 ") and SECRET.encode() in local, local


def test_a_pool_on_every_interface_turns_error_details_off(failing_package: Path) -> None:
    """As ``openenv serve --host 0.0.0.0`` does (what the settings say still wins)."""
    everywhere = SandboxPool(str(failing_package), workers=2, host="0.0.0.0")
    assert all(p.env_vars["OPENENV_ERROR_DETAILS"] == "0" for p in everywhere.providers.values())
    told = SandboxPool(str(failing_package), workers=2, host="0.0.0.0", env_vars={"OPENENV_ERROR_DETAILS": "1"})
    assert all(p.env_vars["OPENENV_ERROR_DETAILS"] == "1" for p in told.providers.values())
    here = SandboxPool(str(failing_package), workers=2)
    assert all("OPENENV_ERROR_DETAILS" not in p.env_vars for p in here.providers.values())
