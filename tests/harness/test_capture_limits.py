"""The capture proxy under hostile and failing conditions: who may reach what, every bound with an
error in the agent's own dialect, the proxy serving on after bad input, and no answered turn lost
when the proxy is killed (kill -9) and restarted.

The engine here is a small real HTTP server that answers with a fixed vLLM-shaped completion after
a delay the test chooses, or with an error: what a real engine does when it is slow or failing,
which the tiny engine cannot be told to do on cue. The kill -9 test runs the tiny real engine."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from openenv.core.harness.capture import CaptureLimits, CaptureServer


def vllm_answer(request: Dict[str, Any], turn: int) -> Dict[str, Any]:
    """A vLLM-shaped answer whose prompt grows with the conversation (as an agent's does)."""
    prompt = list(range(1, 11 + 10 * turn))
    sampled = [500 + turn, 501 + turn, 2]
    return {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion",
        "created": 0,
        "model": request.get("model") or "slow",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"answer {turn}"},
                "finish_reason": "stop",
                "token_ids": sampled,
                "logprobs": {
                    "content": [{"token": f"token_id:{t}", "logprob": -0.25, "top_logprobs": []} for t in sampled]
                },
            }
        ],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": 3, "total_tokens": len(prompt) + 3},
    }


class ScriptedEngine:
    """A real engine stand-in on 127.0.0.1: ``delay_s`` before each answer, or ``fail_with``."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.fail_with: Optional[tuple] = None
        self.calls: List[Dict[str, Any]] = []

        async def completions(request: Request) -> JSONResponse:
            body = await request.json()
            self.calls.append(body)
            await asyncio.sleep(self.delay_s)
            if self.fail_with:
                status, payload = self.fail_with
                return JSONResponse(payload, status_code=status)
            turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
            return JSONResponse(vllm_answer(body, turn))

        app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ScriptedEngine:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def engine() -> Iterator[ScriptedEngine]:
    with ScriptedEngine() as engine:
        yield engine


def make_proxy(engine: ScriptedEngine, tmp_path: Path, **limits: Any) -> CaptureServer:
    return CaptureServer(
        llm_url=engine.url,
        model="slow",
        port=0,
        journal_dir=str(tmp_path / "journal"),
        limits=CaptureLimits.from_env(**limits),
    ).start()


@pytest.fixture
def proxy(engine: ScriptedEngine, tmp_path: Path) -> Iterator[CaptureServer]:
    server = make_proxy(engine, tmp_path)
    yield server
    server.stop()


def chat(url: str, key: Optional[str], body: Optional[Dict[str, Any]] = None, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = body if body is not None else {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(url + "/v1/chat/completions", headers=headers, json=body, timeout=30, **kwargs)


def still_serves(proxy: CaptureServer) -> None:
    key = proxy.create_session()["api_key"]
    answer = chat(proxy.url, key)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "answer 0"


# --- who may reach what --------------------------------------------------------------------------


ADMIN_ROUTES = [
    ("POST", "/sessions"),
    ("GET", "/sessions"),
    ("GET", "/sessions/{id}"),
    ("GET", "/sessions/{id}/rollout"),
    ("GET", "/sessions/{id}/trace_entries"),
    ("GET", "/sessions/{id}/training_trace"),
    ("DELETE", "/sessions/{id}"),
]


@pytest.mark.parametrize(("method", "route"), ADMIN_ROUTES)
@pytest.mark.parametrize("who", ["nobody", "an agent", "a wrong key"])
def test_admin_routes_need_the_admin_key(proxy, method, route, who):
    victim = proxy.create_session()["session_id"]
    assert chat(proxy.url, victim).status_code == 200
    key = {"nobody": None, "an agent": proxy.create_session()["api_key"], "a wrong key": proxy.admin_key + "x"}[who]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answer = httpx.request(
        method, proxy.url + route.format(id=victim), headers=headers, json={} if method == "POST" else None
    )
    assert answer.status_code == 401
    assert "requires the capture admin key" in answer.json()["error"]["message"]
    assert proxy.registry.get(victim) is not None and len(proxy.registry.get(victim).graph.nodes) == 1


def test_an_agents_key_reaches_only_its_own_session(proxy, engine):
    mine, theirs = proxy.create_session()["api_key"], proxy.create_session()["api_key"]
    assert chat(proxy.url, mine).status_code == 200
    assert chat(proxy.url, theirs).status_code == 200
    assert len(proxy.registry.get(mine).graph.nodes) == 1 and len(proxy.registry.get(theirs).graph.nodes) == 1
    forged = chat(proxy.url, "s" + "0" * 24)
    assert forged.status_code == 401 and "unknown API key" in forged.json()["error"]["message"]
    assert len(engine.calls) == 2  # the forged key never reached the engine


def test_unknown_keys_are_refused_in_each_dialect(proxy):
    anthropic_reply = httpx.post(
        proxy.url + "/v1/messages",
        headers={"x-api-key": "nope", "anthropic-version": "2023-06-01"},
        json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert anthropic_reply.status_code == 401 and anthropic_reply.json()["type"] == "error"
    google_reply = httpx.post(
        proxy.url + "/v1beta/models/m:generateContent",
        headers={"x-goog-api-key": "nope"},
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    )
    assert google_reply.status_code == 401 and google_reply.json()["error"]["code"] == 401


def test_it_listens_on_loopback_unless_told_and_refuses_a_public_bind_without_a_chosen_key(
    engine, tmp_path, monkeypatch
):
    monkeypatch.delenv("OPENENV_CAPTURE_ADMIN_KEY", raising=False)
    server = CaptureServer(llm_url=engine.url, port=0, journal_dir=str(tmp_path / "j"))
    try:
        assert server._sock.getsockname()[0] == "127.0.0.1"
    finally:
        server.stop()
    with pytest.raises(ValueError, match="admin key"):
        CaptureServer(llm_url=engine.url, port=0, host="0.0.0.0", journal_dir=str(tmp_path / "k"))


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
def test_engine_calls_work_through_either_http_client(engine, tmp_path, monkeypatch, client):
    """aiohttp when installed (openenv[capture]), httpx otherwise: the same answers and errors."""
    if client == "aiohttp":
        pytest.importorskip("aiohttp")
    monkeypatch.setenv("OPENENV_CAPTURE_HTTP_CLIENT", client)
    proxy = make_proxy(engine, tmp_path)
    try:
        still_serves(proxy)
        engine.fail_with = (503, {"error": {"message": "overloaded"}})
        key = proxy.create_session()["api_key"]
        answer = chat(proxy.url, key)
        assert answer.status_code == 502 and "overloaded" in answer.json()["error"]["message"]
        assert len(engine.calls) == 1 + 3  # retried twice after the first 503
    finally:
        proxy.stop()


def test_an_engine_that_is_not_there_is_named(tmp_path):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    proxy = CaptureServer(llm_url=f"http://127.0.0.1:{port}", port=0, journal_dir=str(tmp_path / "j")).start()
    try:
        answer = chat(proxy.url, proxy.create_session()["api_key"])
        assert answer.status_code == 502
        assert f"no engine answers at http://127.0.0.1:{port}/v1" in answer.json()["error"]["message"]
    finally:
        proxy.stop()


# --- bounds --------------------------------------------------------------------------------------


def test_a_body_over_the_limit_gets_413_and_the_proxy_serves_on(engine, tmp_path):
    proxy = make_proxy(engine, tmp_path, max_body_bytes=64 * 1024)
    try:
        key = proxy.create_session()["api_key"]
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}
        answer = chat(proxy.url, key, big)
        assert answer.status_code == 413 and "OPENENV_CAPTURE_MAX_BODY_MB" in answer.json()["error"]["message"]
        chunked = httpx.post(
            proxy.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            content=iter([b'{"messages": [', b"1," * 50_000, b"1]}"]),
        )
        assert chunked.status_code == 413
        assert engine.calls == []
        still_serves(proxy)
    finally:
        proxy.stop()


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 2}).encode(), 400, "n must be 1"),
        (json.dumps({"messages": "hi"}).encode(), 400, ""),
    ],
    ids=["bad-json", "not-an-object", "n=2", "bad-messages"],
)
def test_bad_requests_get_clear_errors_and_reach_no_engine(proxy, engine, body, status, words):
    key = proxy.create_session()["api_key"]
    answer = httpx.post(
        proxy.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, content=body, timeout=30
    )
    assert answer.status_code == status, answer.text
    assert words in answer.json()["error"]["message"]
    assert engine.calls == []
    still_serves(proxy)


def test_calls_in_flight_per_session_are_bounded(engine, tmp_path):
    proxy = make_proxy(engine, tmp_path, max_session_calls=2)
    engine.delay_s = 1.0
    try:
        key = proxy.create_session()["api_key"]

        async def burst() -> List[int]:
            async with httpx.AsyncClient(timeout=30) as client:
                answers = await asyncio.gather(
                    *(
                        client.post(
                            proxy.url + "/v1/chat/completions",
                            headers={"Authorization": f"Bearer {key}"},
                            json={"model": "m", "messages": [{"role": "user", "content": str(i)}]},
                        )
                        for i in range(5)
                    )
                )
            return sorted(a.status_code for a in answers)

        assert asyncio.run(burst()) == [200, 200, 429, 429, 429]
        engine.delay_s = 0.0
        still_serves(proxy)
    finally:
        proxy.stop()


def test_a_slow_engine_gets_504_in_the_agents_dialect(engine, tmp_path):
    proxy = make_proxy(engine, tmp_path, upstream_timeout_s=0.5)
    engine.delay_s = 3.0
    try:
        key = proxy.create_session()["api_key"]
        started = time.monotonic()
        answer = httpx.post(
            proxy.url + "/v1/messages",
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
            json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert time.monotonic() - started < 2.5
        assert answer.status_code == 504 and answer.json()["type"] == "error"
        assert "OPENENV_CAPTURE_UPSTREAM_TIMEOUT_S" in answer.json()["error"]["message"]
        engine.delay_s = 0.0
        still_serves(proxy)
    finally:
        proxy.stop()


def test_a_stream_from_a_slow_engine_is_kept_alive_then_delivered(engine, tmp_path):
    proxy = make_proxy(engine, tmp_path, keepalive_s=0.2)
    engine.delay_s = 1.0
    try:
        key = proxy.create_session()["api_key"]
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream(
            "POST",
            proxy.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json=body,
            timeout=30,
        ) as answer:
            assert answer.status_code == 200
            text = answer.read().decode()
        assert text.startswith(": openenv keepalive")
        frames = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        assert "".join(f["choices"][0]["delta"].get("content") or "" for f in frames if f["choices"]) == "answer 0"
        assert text.rstrip().endswith("data: [DONE]")
    finally:
        proxy.stop()


def test_engine_errors_keep_their_status_and_are_not_recorded(proxy, engine):
    key = proxy.create_session()["api_key"]
    engine.fail_with = (422, {"error": {"message": "temperature must be positive", "type": "BadRequestError"}})
    answer = chat(proxy.url, key)
    assert answer.status_code == 422 and "temperature must be positive" in answer.json()["error"]["message"]
    engine.fail_with = (500, {"error": {"message": "engine crashed"}})
    assert chat(proxy.url, key).status_code == 502
    session = proxy.registry.get(key)
    assert len(session.graph.nodes) == 0 and session.upstream_errors == 2


def test_the_model_call_budget_ends_the_agent_without_a_recorded_turn(engine, tmp_path):
    proxy = make_proxy(engine, tmp_path)
    try:
        key = proxy.create_session(max_model_calls=1)["api_key"]
        assert chat(proxy.url, key).json()["choices"][0]["message"]["content"] == "answer 0"
        stop = chat(proxy.url, key).json()
        assert stop["choices"][0]["message"]["content"] == "Step budget exhausted; stopping."
        assert stop["choices"][0]["finish_reason"] == "stop"
        assert len(engine.calls) == 1
        assert proxy.rollout(key)["budget_stop_count"] == 1 and len(proxy.rollout(key)["turns"]) == 1
    finally:
        proxy.stop()


def test_session_ids_are_checked_not_silently_replaced_or_overwritten(proxy):
    made = proxy.create_session(session_id="rollout-1.a", metadata={"task": 1})
    assert made["session_id"] == made["api_key"] == "rollout-1.a"
    assert chat(proxy.url, "rollout-1.a").status_code == 200  # the proxy notes its dialect in the metadata
    assert proxy.create_session(session_id="rollout-1.a", metadata={"task": 1})["session_id"] == "rollout-1.a"
    with pytest.raises(RuntimeError, match="409"):
        proxy.create_session(session_id="rollout-1.a", metadata={"task": 2})
    with pytest.raises(RuntimeError, match="400"):
        proxy.create_session(session_id="../etc/passwd")
    with pytest.raises(RuntimeError, match=r"400.*max_model_calls"):
        proxy.create_session(metadata={"max_model_calls": 3})


def test_the_session_limit_refuses_more_with_429(engine, tmp_path):
    proxy = make_proxy(engine, tmp_path, max_sessions=2)
    try:
        proxy.create_session()
        proxy.create_session()
        with pytest.raises(RuntimeError, match="429"):
            proxy.create_session()
    finally:
        proxy.stop()


def test_a_sessions_own_engine_key_is_not_journalled_and_is_given_again_after_a_restart(engine, tmp_path):
    fields = {"session_id": "own-engine", "llm_url": engine.url, "model": "slow", "api_key": "engine-secret"}
    proxy = make_proxy(engine, tmp_path)
    try:
        proxy.create_session(**fields)
        assert chat(proxy.url, "own-engine").status_code == 200
    finally:
        proxy.stop()
    assert "engine-secret" not in "".join(p.read_text() for p in (tmp_path / "journal").glob("*.jsonl"))
    proxy = make_proxy(engine, tmp_path)  # the same journal: the session is back, its key is not
    try:
        refused = chat(proxy.url, "own-engine")
        assert refused.status_code == 503 and "make the session again" in refused.json()["error"]["message"]
        proxy.create_session(**fields)
        assert chat(proxy.url, "own-engine").status_code == 200
        assert len(proxy.registry.get("own-engine").graph.nodes) == 2
    finally:
        proxy.stop()


# --- durability: kill -9 and restart -------------------------------------------------------------


def start_proxy_process(engine_url: str, journal: Path, port: int = 0) -> tuple:
    process = subprocess.Popen(
        [sys.executable, "-m", "openenv.core.harness.capture.server", "--llm-url", engine_url,
         "--port", str(port), "--journal-dir", str(journal)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    line = process.stderr.readline()
    match = re.search(r"on (http://\S+?);", line)
    assert match, line + process.stderr.read()
    url = match.group(1)
    for _ in range(200):
        try:
            httpx.get(url + "/health").raise_for_status()
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    return process, url


def test_kill_9_mid_rollout_loses_no_answered_turn(tmp_path):
    pytest.importorskip("torch")
    openai = pytest.importorskip("openai")
    from openenv.testing.tiny_engine import TinyEngine

    journal = tmp_path / "journal"
    with TinyEngine.build().serve() as engine:
        process, url = start_proxy_process(engine.base_url, journal)
        admin_key = (journal / "admin_key").read_text().strip()
        admin = {"Authorization": f"Bearer {admin_key}"}
        key = httpx.post(url + "/sessions", headers=admin, json={}).json()["api_key"]
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        messages: List[Dict[str, Any]] = [{"role": "user", "content": "List the files."}]
        for turn in range(3):
            message = client.chat.completions.create(model=engine.model, messages=messages, max_tokens=24, seed=turn)
            messages.append({"role": "assistant", "content": message.choices[0].message.content or ""})
            messages.append({"role": "user", "content": "Go on."})
        before = httpx.get(f"{url}/sessions/{key}/trace_entries", headers=admin).json()["entries"]
        assert len(before) == 3

        # A fourth call is in flight (a long answer) when the proxy is killed.
        in_flight = threading.Thread(
            target=lambda: _ignore_errors(
                lambda: client.chat.completions.create(model=engine.model, messages=messages, max_tokens=400, seed=9)
            )
        )
        in_flight.start()
        time.sleep(0.3)
        port = int(url.rsplit(":", 1)[1])
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        in_flight.join(60)

        process, url = start_proxy_process(engine.base_url, journal, port=port)
        try:
            after = httpx.get(f"{url}/sessions/{key}/trace_entries", headers=admin).json()["entries"]
            assert len(after) >= 3
            assert after[:3] == before  # every answered turn, exactly as it was
            # The rollout goes on where it stopped: the next turn extends the last answered one.
            client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
            client.chat.completions.create(model=engine.model, messages=messages, max_tokens=8, seed=5)
            rollout = httpx.get(f"{url}/sessions/{key}/rollout", headers=admin).json()
            assert rollout["stats"]["n_roots"] == 1
            assert len(rollout["turns"]) == len(after) + 1
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(10)


def _ignore_errors(call: Any) -> None:
    try:
        call()
    except Exception:
        pass


def test_a_deleted_session_frees_its_turns_without_the_collector(proxy):
    """The proxy's collector freezes every turn that outlives a call (``CollectBetweenCalls``):
    that is safe only if a session's objects hold no cycle, so that deleting the session frees
    them by reference counting alone."""
    key = proxy.create_session()["api_key"]
    messages: List[Dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for _ in range(3):
        answer = chat(proxy.url, key, {"model": "m", "messages": messages})
        assert answer.status_code == 200, answer.text
        messages += [answer.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
    session = proxy.registry.get(key)
    assert len(session.graph.nodes) == 3
    refs = [weakref.ref(session), weakref.ref(session.graph)] + [weakref.ref(n) for n in session.graph.nodes.values()]
    del session
    gc.collect()
    gc.disable()
    try:
        deleted = httpx.delete(f"{proxy.url}/sessions/{key}", headers={"Authorization": f"Bearer {proxy.admin_key}"})
        assert deleted.status_code == 200, deleted.text
        alive = [ref() for ref in refs if ref() is not None]
        assert alive == [], f"{len(alive)} objects of a deleted session wait for the collector: {alive[:2]}"
    finally:
        gc.enable()
