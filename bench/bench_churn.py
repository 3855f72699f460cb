"""Churn and bad input against a server process: memory growth per cycle and leaked sessions.

Runs 1000 graceful connect/reset/close cycles and 1000 abrupt ones (TCP reset, no close
handshake) against our server (trivial sync env) and against the floor (a bare ``websockets``
server); then, against ours only, 50 clients dropping mid-step and a set of bad frames including
a 200 MB one. Reports
resident memory after each phase, the growth per cycle, and (ours) the sessions still open and
workers still stuck.

    python bench/bench_churn.py [--cycles 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_footprint import rss_kib  # noqa: E402
from bench_ws import RESULTS, Server  # noqa: E402

BAD_FRAMES = ["not json", "[1,2]", "null", '{"type":"jump"}', '{"type":"step","data":{"bogus":1}}', '{"type":"step"}']


async def cycle(server: Server, abrupt: bool) -> None:
    from websockets.asyncio.client import connect

    ws = await connect(server.url, compression=None, ping_interval=None)
    await ws.send('{"type":"reset","data":{}}')
    await ws.recv()
    if abrupt:
        ws.transport.abort()
    else:
        await ws.close()


async def drops(server: Server, count: int) -> None:
    from websockets.asyncio.client import connect

    sockets = []
    for _ in range(count):
        ws = await connect(server.url, compression=None, ping_interval=None)
        await ws.send('{"type":"reset","data":{}}')
        await ws.recv()
        await ws.send('{"type":"step","data":{"sleep_s":0.2}}')
        sockets.append(ws)
    await asyncio.sleep(0.05)
    for ws in sockets:
        ws.transport.abort()
    await asyncio.sleep(0.5)


async def bad_input(server: Server) -> Dict[str, Any]:
    from websockets.asyncio.client import connect

    answered = 0
    async with connect(server.url, compression=None, ping_interval=None, max_size=None, open_timeout=30) as ws:
        await ws.send('{"type":"reset","data":{}}')
        await ws.recv()
        frames = [*BAD_FRAMES, b"\x00binary", '{"type":"step","data":{"message":"' + "x" * (200 * 1024 * 1024) + '"}}']
        for frame in frames:
            await ws.send(frame)
            reply = json.loads(await asyncio.wait_for(ws.recv(), 120))
            answered += reply.get("type") == "error"
        del frames
        await ws.send('{"type":"step","data":{"message":"still here"}}')
        usable = "still here" in await ws.recv()
    return {"bad_frames": len(BAD_FRAMES) + 2, "answered_with_error": answered, "connection_usable_after": usable}


def collect(server: Server) -> Dict[str, int]:
    """Force a collection in the server; returns the objects it still tracks."""
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/_bench/gc", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


async def run(server: Server, cycles: int, ours: bool) -> Dict[str, Any]:
    pid = server.process.pid
    for i in range(1000):  # warm-up: the allocator's first arenas are not growth
        await cycle(server, abrupt=bool(i % 2))
    await asyncio.sleep(0.5)
    tracked_before = collect(server)["tracked"] if ours else None
    rss = {"start": rss_kib(pid)}
    for _ in range(cycles):
        await cycle(server, abrupt=False)
    await asyncio.sleep(0.5)
    rss["after_graceful"] = rss_kib(pid)
    for _ in range(cycles):
        await cycle(server, abrupt=True)
    await asyncio.sleep(1.0)
    rss["after_abrupt"] = rss_kib(pid)
    if ours:
        await drops(server, 50)
        rss["after_drops"] = rss_kib(pid)
    result: Dict[str, Any] = {"rss_kib": rss}
    result["growth_per_cycle_bytes"] = 1024 * (rss["after_abrupt"] - rss["start"]) / (2 * cycles)
    if ours:
        result["tracked_objects"] = {"before": tracked_before, "after_cycles": collect(server)["tracked"]}
    if ours:  # the floor has no error handling to exercise
        result.update(await bad_input(server))
        await asyncio.sleep(0.5)
        rss["after_bad_input"] = rss_kib(pid)
        result["server"] = server.sessions()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    args = parser.parse_args()
    report = {}
    for label, name in (("floor: bare websockets server", "floor"), ("ours: trivial sync env", "sync")):
        server = Server(name)
        try:
            report[label] = asyncio.run(run(server, args.cycles, ours=name != "floor"))
        finally:
            server.stop()
        r = report[label]
        print(f"{label}")
        print(f"  RSS KiB: {r['rss_kib']}")
        print(
            f"  growth per connect/disconnect cycle: {r['growth_per_cycle_bytes']:.0f} bytes over {2 * args.cycles} cycles"
        )
        if "tracked_objects" in r:
            t = r["tracked_objects"]
            print(
                f"  objects the collector tracks after a full collection: {t['before']} before the cycles, {t['after_cycles']} after"
            )
        if "server" in r:
            print(
                f"  bad frames answered with an error: {r['answered_with_error']}/{r['bad_frames']}; connection usable after: {r['connection_usable_after']}"
            )
            print(
                f"  server after all phases: {r['server']['active']} sessions open, {r['server']['stuck_workers']} stuck workers, {r['server']['threads']} worker threads"
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "churn.json").write_text(json.dumps(report, indent=2))
    print(f"\nraw figures: {RESULTS / 'churn.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
