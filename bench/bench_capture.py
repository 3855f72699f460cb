"""What the capture proxy adds to a model call, beside a raw floor measured in the same run.

The engine is a bare asyncio HTTP server that answers every chat completion with one fixed
vLLM-shaped answer (prompt_token_ids, token_ids, logprobs, a tool call): nothing to compute, so
what is left is transport. The floor is a client calling that engine directly; the proxy row is
the same client calling through ``python -m openenv.core.harness.capture.server`` (its own
process, pinned to one core), which translates, asks the engine, links the turn into the rollout
graph, journals it, and replies.

- latency: one call at a time, after a warm-up; p50 and p99 of each, and the added p50/p99
  (proxy minus floor, each percentile from its own distribution);
- throughput: ``--concurrency`` calls in flight for ``--seconds``; calls/s of the proxy on its
  one core, beside the floor's calls/s.

The latency run plays rollouts of 20 turns, one session each, whose prompts extend the last
turn's tokens as an agent's do; the throughput run spreads calls over 64 sessions.

    python bench/bench_capture.py [--calls 2000] [--seconds 5] [--concurrency 16] [--prompt-tokens 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

import httpx

SAMPLED = 24
MAX_TURNS = 20


TURN_GROWTH = 40  # prompt tokens each turn adds: the sampled ones and a tool result


def engine_answer(prompt_tokens: int, turn: int = 0) -> bytes:
    """The fixed vLLM-shaped answer for a request at ``turn`` (its count of tool results): turn
    k's prompt is turn k-1's prompt and sampled ids and more, as an agent's rollout grows."""
    start = prompt_tokens + TURN_GROWTH * turn
    return json.dumps(
        {
            "id": "chatcmpl-floor",
            "object": "chat.completion",
            "created": 0,
            "model": "floor",
            "prompt_token_ids": list(range(1, start + 1)),
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "chatcmpl-tool-1",
                                "type": "function",
                                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                    "token_ids": list(range(start + 1, start + 1 + SAMPLED)),
                    "logprobs": {
                        "content": [
                            {"token": f"token_id:{start + 1 + i}", "logprob": -0.5, "bytes": None, "top_logprobs": []}
                            for i in range(SAMPLED)
                        ]
                    },
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": SAMPLED,
                "total_tokens": prompt_tokens + SAMPLED,
            },
        }
    ).encode()


async def serve_floor(port_out: asyncio.Future[int], prompt_tokens: int) -> None:
    """A bare HTTP/1.1 keep-alive server: reads a request, answers the fixed body of its turn."""
    answers = []
    for turn in range(MAX_TURNS + 1):
        body = engine_answer(prompt_tokens, turn)
        answers.append(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        )
    models = json.dumps({"object": "list", "data": [{"id": "floor", "object": "model"}]}).encode()
    models_head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(models)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_head = await reader.readuntil(b"\r\n\r\n")
                match = re.search(rb"content-length:\s*(\d+)", request_head, re.I)
                request_body = await reader.readexactly(int(match.group(1))) if match else b""
                if request_head.startswith(b"GET"):
                    writer.write(models_head + models)
                else:
                    writer.write(answers[min(request_body.count(b'"tool_call_id"'), MAX_TURNS)])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port_out.set_result(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def floor_thread(prompt_tokens: int) -> int:
    """The floor engine on a loop of its own thread (another core than the proxy's)."""
    import threading

    ready: Dict[str, int] = {}
    started = threading.Event()

    def run() -> None:
        loop = asyncio.new_event_loop()
        future: asyncio.Future = loop.create_future()
        future.add_done_callback(lambda f: (ready.setdefault("port", f.result()), started.set()))
        loop.run_until_complete(serve_floor(future, prompt_tokens))

    threading.Thread(target=run, daemon=True).start()
    started.wait(10)
    return ready["port"]


def start_proxy(engine_port: int, journal: str, core: int) -> Tuple[subprocess.Popen, str, str]:
    admin_key = "bench-admin-key"
    process = subprocess.Popen(
        [sys.executable, "-m", "openenv.core.harness.capture.server", "--llm-url", f"http://127.0.0.1:{engine_port}",
         "--model", "floor", "--port", "0", "--journal-dir", journal, "--admin-key", admin_key],
        stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )  # fmt: skip
    assert process.stderr is not None
    line = process.stderr.readline()
    match = re.search(r"on (http://\S+?);", line)
    if not match:
        process.kill()
        raise SystemExit(f"the proxy did not start: {line}{process.stderr.read()}")
    return process, match.group(1), admin_key


def chat_request(turn: int) -> Dict[str, Any]:
    messages: List[Dict[str, Any]] = [
        {"role": "system", "content": "You are a bench."},
        {"role": "user", "content": "go"},
    ]
    for i in range(turn):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]})  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "file.txt"})
    return {
        "model": "floor",
        "messages": messages,
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
        "max_tokens": 64,
    }


async def latency(url: str, keys: List[str], calls: int) -> List[float]:
    """One call at a time; each rollout (session) is MAX_TURNS turns long, as one agent's episode."""
    took: List[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for i in range(calls + 100):
            body = chat_request(i % MAX_TURNS)
            key = keys[(i // MAX_TURNS) % len(keys)]
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            elapsed = time.perf_counter() - started
            if response.status_code != 200:
                raise SystemExit(f"{url}: {response.status_code} {response.text[:300]}")
            if i >= 100:
                took.append(elapsed)
    return took


async def throughput(url: str, keys: List[str], seconds: float, concurrency: int) -> float:
    done = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(n: int, client: httpx.AsyncClient) -> None:
        nonlocal done
        key = keys[n % len(keys)]
        while time.perf_counter() < deadline:
            response = await client.post(
                "/v1/chat/completions", json=chat_request(n % 5), headers={"Authorization": f"Bearer {key}"}
            )
            if response.status_code != 200:
                raise SystemExit(f"{url}: {response.status_code} {response.text[:300]}")
            done += 1

    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(n, client) for n in range(concurrency)))
        return done / (time.perf_counter() - started)


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    args = parser.parse_args()

    cores = sorted(os.sched_getaffinity(0))
    proxy_core, other = cores[0], set(cores[1:] or cores)
    os.sched_setaffinity(0, other)  # the client and the floor engine, off the proxy's core
    engine_port = floor_thread(args.prompt_tokens)
    engine = f"http://127.0.0.1:{engine_port}"
    with tempfile.TemporaryDirectory(prefix="bench-capture-") as journal:
        proxy, url, admin_key = start_proxy(engine_port, journal, proxy_core)
        try:
            admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"})
            for _ in range(100):
                try:
                    admin.get("/health").raise_for_status()
                    break
                except httpx.HTTPError:
                    time.sleep(0.05)
            rollouts = (args.calls + 100) // MAX_TURNS + 1
            keys = [admin.post("/sessions", json={}).json()["api_key"] for _ in range(max(rollouts, 64))]
            floor_took = asyncio.run(latency(engine, ["none"], args.calls))
            proxy_took = asyncio.run(latency(url, keys, args.calls))
            turns = admin.get(f"/sessions/{keys[0]}").json()["n_turns"]
            floor_rate = asyncio.run(throughput(engine, ["none"], args.seconds, args.concurrency))
            proxy_rate = asyncio.run(throughput(url, keys, args.seconds, args.concurrency))
        finally:
            proxy.terminate()
            proxy.wait(10)
    us = 1e6
    f50, f99 = percentile(floor_took, 0.5) * us, percentile(floor_took, 0.99) * us
    p50, p99 = percentile(proxy_took, 0.5) * us, percentile(proxy_took, 0.99) * us
    print(f"capture proxy, {args.calls} sequential chat calls ({args.prompt_tokens}-token prompts, {SAMPLED} sampled),"
          f" in rollouts of {turns} turns, each journalled; proxy pinned to core {proxy_core}")  # fmt: skip
    print(f"{'':18}{'p50 µs':>10}{'p99 µs':>10}{'mean µs':>10}")
    print(f"{'floor (direct)':18}{f50:10.0f}{f99:10.0f}{statistics.mean(floor_took) * us:10.0f}")
    print(f"{'through proxy':18}{p50:10.0f}{p99:10.0f}{statistics.mean(proxy_took) * us:10.0f}")
    print(f"{'added':18}{p50 - f50:10.0f}{p99 - f99:10.0f}   (goal: p99 added <= 1000 µs)")
    print(f"throughput, {args.concurrency} in flight for {args.seconds:g} s: floor {floor_rate:,.0f} calls/s,"
          f" proxy on one core {proxy_rate:,.0f} calls/s (ratio {proxy_rate / floor_rate:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
