"""A server started by ``BackgroundServer`` (the runner behind ``serve()`` in tests, and RayEnvPool's
replicas with ``sandbox=False``) answers calls on a kept-alive connection at once: its TCP sockets
send without Nagle's delay (``TCP_NODELAY``), so an answer written in two pieces (head, then body)
is not held until the client's delayed ACK (40 ms on Linux) lets its second piece go."""

from __future__ import annotations

import statistics
import time

import httpx

from .conftest import counter_app, serve


def test_calls_on_a_kept_alive_connection_are_not_held_for_a_delayed_ack() -> None:
    with serve(counter_app()) as server, httpx.Client(base_url=server.base_url, timeout=10) as http:
        http.get("/health")  # (the connection, kept alive for the calls timed)
        seconds = []
        for _ in range(11):
            started = time.perf_counter()
            assert http.get("/health").status_code == 200
            seconds.append(time.perf_counter() - started)
    assert statistics.median(seconds) < 0.02, seconds  # about 0.3 ms; 44 ms when held
