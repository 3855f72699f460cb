"""Sandbox start-up and Unix-socket throughput, each beside its floor.

* Start to first successful ``reset`` of the echo environment through ``SandboxProvider``: warm
  starts (forked from the package's warden; the first start boots the warden) and cold starts
  (bubblewrap and Python afresh). Floors: a bare ``python -c pass``, without and inside bubblewrap.
* Steps/s of the trivial sync environment over a Unix socket and over TCP (our server), beside the
  bare websockets server on each transport.

    python bench/bench_sandbox.py [--starts 20] [--seconds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench_ws import CASES, RESULTS, cpu_seconds  # noqa: E402


def start_to_reset(warm: bool) -> float:
    from echo_env import EchoEnv

    from openenv.core.containers.runtime import SandboxProvider

    began = time.perf_counter()
    provider = SandboxProvider(str(ROOT / "envs" / "echo_env"), warm=warm)
    url = provider.start()
    try:
        provider.wait_for_ready(60)
        with EchoEnv(base_url=url).sync() as env:
            env.reset()
            return time.perf_counter() - began
    finally:
        provider.stop()


def python_floor(sandboxed: bool) -> float:
    from openenv.core.containers.runtime.isolation import BwrapCommand, require_bwrap, runtime_view

    argv = [sys.executable, "-c", "pass"]
    if sandboxed:
        argv = BwrapCommand(require_bwrap(), network=False).view(runtime_view(sys.executable)).command(argv)
    began = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - began


class Served:
    def __init__(self, name: str, uds: bool) -> None:
        self.tmp = tempfile.mkdtemp(prefix="openenv-bench-")
        self.path = os.path.join(self.tmp, "s.sock") if uds else None
        if uds:
            address = self.path
        else:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                address = str(s.getsockname()[1])
        self.port = None if uds else int(address)
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "apps.py"), name, address], stdout=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (uds and os.path.exists(self.path)) or (not uds and _port_open(self.port)):
                return
            time.sleep(0.02)
        raise RuntimeError(f"{name} did not start")

    async def connect(self) -> Any:
        from websockets.asyncio.client import connect, unix_connect

        if self.path:
            return await unix_connect(self.path, uri="ws://localhost/ws", compression=None, ping_interval=None)
        return await connect(f"ws://127.0.0.1:{self.port}/ws", compression=None, ping_interval=None)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        subprocess.run(["rm", "-rf", self.tmp], check=False)


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def throughput(served: Served, k: int, seconds: float) -> Dict[str, float]:
    frame = json.dumps(CASES["sync"][3])
    sockets = [await served.connect() for _ in range(k)]
    for ws in sockets:
        await ws.send('{"type":"reset","data":{}}')
        await ws.recv()
    steps = 0
    stop_at = time.perf_counter() + seconds

    async def drive(ws: Any) -> None:
        nonlocal steps
        while time.perf_counter() < stop_at:
            await ws.send(frame)
            await ws.recv()
            steps += 1

    cpu = cpu_seconds(served.process.pid)
    began = time.perf_counter()
    await asyncio.gather(*(drive(ws) for ws in sockets))
    elapsed = time.perf_counter() - began
    cpu = cpu_seconds(served.process.pid) - cpu
    await asyncio.gather(*(ws.close() for ws in sockets))
    return {"steps_per_s": steps / elapsed, "cpu_us_per_step": 1e6 * cpu / steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    from openenv.core.containers.runtime import shutdown_sandboxes

    shutdown_sandboxes()
    warm = [start_to_reset(True) for _ in range(args.starts)]
    cold = [start_to_reset(False) for _ in range(max(3, args.starts // 4))]
    floors = {
        "python -c pass": statistics.median(python_floor(False) for _ in range(5)),
        "python -c pass in bubblewrap": statistics.median(python_floor(True) for _ in range(5)),
    }
    shutdown_sandboxes()
    print(
        f"start to first reset, echo env, {args.starts} warm starts: median {1000 * statistics.median(warm):.0f} ms "
        f"(first, which boots the warden: {1000 * warm[0]:.0f} ms; max {1000 * max(warm):.0f} ms)"
    )
    print(f"cold starts ({len(cold)}): median {1000 * statistics.median(cold):.0f} ms")
    for label, value in floors.items():
        print(f"floor: {label}: {1000 * value:.0f} ms")

    rows = []
    for k in (1, 32):
        for name in ("floor", "sync"):
            result = {}
            for transport in ("tcp", "uds"):
                served = Served(name, uds=transport == "uds")
                try:
                    runs = [asyncio.run(throughput(served, k, args.seconds)) for _ in range(5)]
                finally:
                    served.stop()
                result[transport] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            ratio = result["uds"]["steps_per_s"] / result["tcp"]["steps_per_s"]
            rows.append({"server": name, "k": k, **result, "uds_vs_tcp": ratio})
            label = "bare websockets" if name == "floor" else "ours, trivial sync env"
            print(
                f"K={k:<3} {label:<24} TCP {result['tcp']['steps_per_s']:8.0f}/s  Unix socket {result['uds']['steps_per_s']:8.0f}/s  "
                f"(x{ratio:.2f})"
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sandbox.json").write_text(
        json.dumps({"warm_s": warm, "cold_s": cold, "floors_s": floors, "transport": rows}, indent=2)
    )
    print(f"\nraw figures: {RESULTS / 'sandbox.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
