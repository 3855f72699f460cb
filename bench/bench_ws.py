"""WebSocket step throughput, latency and server CPU per step, beside a raw-websockets floor.

Each case runs our server (uvicorn + OpenEnv, in its own process) and the floor (a bare
``websockets`` server doing the same JSON round trip, same event loop) in the same run, with the
same client, and reports both and their ratio. The client opens K connections to each server
(reset and warmed up) and keeps them open while it measures the two in turns, back to back, in
alternating order; a ratio is the median of the turns' own ratios (all of them are kept in the
JSON), so that a shared machine's drift between turns cancels out. Server CPU is read from /proc for the server's
process only, so the client's own cost does not count.

    python bench/bench_ws.py [--seconds 2] [--repeats 7] [--ks 1,32,512] [--cases sync,loop,async,echo]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")

CASES = {
    "null": ("uvicorn+FastAPI only", "null", "floor", {"type": "step", "data": {"message": "hello"}}),
    "sync": ("trivial sync env", "sync", "floor", {"type": "step", "data": {"message": "hello"}}),
    "loop": ("trivial sync env, on the loop", "loop", "floor", {"type": "step", "data": {"message": "hello"}}),
    "async": ("trivial async env", "async", "floor", {"type": "step", "data": {"message": "hello"}}),
    "echo": (
        "echo MCP tool call",
        "echo",
        "floor-echo",
        {"type": "step", "data": {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hello"}}},
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Server:
    def __init__(self, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "apps.py"), name, str(self.port)], stdout=subprocess.DEVNULL
        )
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} server did not start")

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def sessions(self) -> Dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_bench/sessions", timeout=5) as r:
            return json.load(r)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Clients:
    """``k`` open WebSocket connections to one server, each reset and warmed up, kept open across
    the measurement slices of a pairing (so a slice measures steps, not connection set-up)."""

    def __init__(self, server: Server, frame: Dict[str, Any], k: int, headers: Any = None) -> None:
        self.server = server
        self.headers = headers
        self.k = k
        self.text = json.dumps(frame, separators=(",", ":"))
        self.sockets: List[Any] = []

    async def open(self, warmup_steps: int = 20) -> None:
        from websockets.asyncio.client import connect

        for _ in range(self.k):
            self.sockets.append(
                await connect(
                    self.server.url,
                    compression=None,
                    max_size=2**28,
                    open_timeout=30,
                    ping_interval=None,
                    additional_headers=self.headers,
                )
            )
        for ws in self.sockets:
            await ws.send('{"type":"reset","data":{}}')
            await ws.recv()
        text = self.text

        async def warm(ws: Any) -> None:
            for _ in range(warmup_steps):
                await ws.send(text)
                await ws.recv()

        await asyncio.gather(*(warm(ws) for ws in self.sockets))

    async def close(self) -> None:
        await asyncio.gather(*(ws.close() for ws in self.sockets), return_exceptions=True)
        self.sockets = []

    async def measure(self, seconds: float) -> Dict[str, float]:
        """Every connection steps back to back for ``seconds``."""
        server, text = self.server, self.text
        latencies: List[float] = []
        stop_at = 0.0

        async def drive(ws: Any) -> None:
            clock = time.perf_counter
            while True:
                started = clock()
                if started >= stop_at:
                    return
                await ws.send(text)
                reply = await ws.recv()
                latencies.append(clock() - started)
                if reply.startswith('{"type":"error"'):
                    raise RuntimeError(reply[:300])

        cpu_before = cpu_seconds(server.process.pid)
        began = time.perf_counter()
        stop_at = began + seconds
        await asyncio.gather(*(drive(ws) for ws in self.sockets))
        elapsed = time.perf_counter() - began
        cpu = cpu_seconds(server.process.pid) - cpu_before
        latencies.sort()
        steps = len(latencies)
        return {
            "steps_per_s": steps / elapsed,
            "p50_ms": 1000 * latencies[steps // 2],
            "p99_ms": 1000 * latencies[min(steps - 1, int(steps * 0.99))],
            "cpu_us_per_step": 1e6 * cpu / steps,
            "steps": steps,
        }


async def pairing(
    floor: Server,
    ours: Server,
    frame: Dict[str, Any],
    k: int,
    seconds: float,
    repeats: int,
    ours_headers: Any = None,
) -> Dict[str, List[Dict[str, float]]]:
    """``repeats`` measurements of each server, back to back in alternating order, with both
    servers' connections open throughout (a slice drives one server's; the other's stay idle)."""
    pair = {"floor": Clients(floor, frame, k), "ours": Clients(ours, frame, k, ours_headers)}
    runs: Dict[str, List[Dict[str, float]]] = {"floor": [], "ours": []}
    try:
        for clients in pair.values():
            await clients.open()
        order = ("floor", "ours")
        for repeat in range(repeats):
            for which in order if repeat % 2 == 0 else order[::-1]:
                runs[which].append(await pair[which].measure(seconds))
    finally:
        for clients in pair.values():
            await clients.close()
    return runs


def median_of(runs: List[Dict[str, float]]) -> Dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ks", default="1,32,512")
    parser.add_argument("--cases", default="sync,loop,async,echo")
    parser.add_argument("--out", default="ws.json", help="file name of the raw figures under bench/results")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    ks = [int(k) for k in args.ks.split(",")]
    rows = []
    for case in args.cases.split(","):
        label, ours_name, floor_name, frame = CASES[case]
        ours, floor = Server(ours_name), Server(floor_name)
        try:
            for k in ks:
                # Each repeat measures both, back to back, in alternating order: the ratios are
                # taken pair by pair, so that a shared machine's drift cancels out.
                runs = asyncio.run(pairing(floor, ours, frame, k, args.seconds, args.repeats))
                row = {"case": label, "k": k, "floor": median_of(runs["floor"]), "ours": median_of(runs["ours"])}
                for key, metric in (("throughput_ratio", "steps_per_s"), ("cpu_ratio", "cpu_us_per_step")):
                    ratios = [o[metric] / f[metric] for f, o in zip(runs["floor"], runs["ours"], strict=True)]
                    row[key + "_pairs"] = [round(r, 3) for r in ratios]
                    ratios.sort()
                    row[key] = statistics.median(ratios)
                    row[key + "_range"] = [ratios[0], ratios[-1]]
                rows.append(row)
                print(
                    f"{label:<20} K={k:<4} floor {row['floor']['steps_per_s']:8.0f}/s {row['floor']['cpu_us_per_step']:6.1f} us | "
                    f"ours {row['ours']['steps_per_s']:8.0f}/s {row['ours']['cpu_us_per_step']:6.1f} us | "
                    f"throughput x{row['throughput_ratio']:.2f}  cpu x{row['cpu_ratio']:.2f}  "
                    f"(pairs: {row['throughput_ratio_range'][0]:.2f}-{row['throughput_ratio_range'][1]:.2f}, "
                    f"{row['cpu_ratio_range'][0]:.2f}-{row['cpu_ratio_range'][1]:.2f})",
                    flush=True,
                )
            leftover = ours.sessions() if ours_name != "null" else {"active": 0}
            if leftover["active"]:
                print(f"  warning: {leftover['active']} sessions still open after the runs", flush=True)
        finally:
            ours.stop()
            floor.stop()
    print_table(rows)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(
        json.dumps({"machine": os.uname().nodename, "cpus": os.cpu_count(), "rows": rows}, indent=2)
    )
    print(f"\nraw figures: {RESULTS / args.out}")
    return 0


def print_table(rows: List[Dict[str, Any]]) -> None:
    print(
        "\n| case | K | floor steps/s | ours steps/s | ratio | floor p50 / p99 ms | ours p50 / p99 ms | floor CPU us/step | ours CPU us/step | CPU ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f, o = r["floor"], r["ours"]
        print(
            f"| {r['case']} | {r['k']} | {f['steps_per_s']:.0f} | {o['steps_per_s']:.0f} | {r['throughput_ratio']:.2f} | "
            f"{f['p50_ms']:.2f} / {f['p99_ms']:.2f} | {o['p50_ms']:.2f} / {o['p99_ms']:.2f} | "
            f"{f['cpu_us_per_step']:.1f} | {o['cpu_us_per_step']:.1f} | {r['cpu_ratio']:.2f} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
