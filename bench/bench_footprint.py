"""Import time and server memory per idle session, each beside its raw-transport floor.

* ``import openenv.core`` (and a client's typical imports) in fresh interpreters, beside
  ``import websockets.asyncio.client``, the transport a raw client needs.
* Server RSS per idle session: N WebSocket sessions opened (and reset), left idle; the growth of
  the server's resident memory divided by N. Beside it, a bare ``websockets`` server holding N
  idle connections.

    python bench/bench_footprint.py [--sessions 500] [--imports 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_ws import RESULTS, Server  # noqa: E402

IMPORTS = {
    "import openenv.core": "import openenv.core",
    "from openenv.core import EnvClient": "from openenv.core import EnvClient",
    "from echo_env import EchoEnv": "from echo_env import EchoEnv",
    "floor: import websockets.asyncio.client": "import websockets.asyncio.client",
}


def import_seconds(statement: str, runs: int) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    samples = [float(subprocess.check_output([sys.executable, "-c", code], text=True)) for _ in range(runs)]
    return statistics.median(samples)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def rss_per_session(server: Server, sessions: int) -> Dict[str, float]:
    from websockets.asyncio.client import connect

    async def open_one() -> object:
        ws = await connect(server.url, compression=None, ping_interval=None, open_timeout=30)
        await ws.send('{"type":"reset","data":{}}')
        await ws.recv()
        return ws

    warm = [await open_one() for _ in range(8)]  # first-use allocations are not per-session costs
    for ws in warm:
        await ws.close()
    await asyncio.sleep(0.5)
    before = rss_kib(server.process.pid)
    opened = []
    for _ in range(sessions):
        opened.append(await open_one())
    await asyncio.sleep(0.5)
    after = rss_kib(server.process.pid)
    for ws in opened:
        await ws.close()
    return {"rss_before_kib": before, "rss_after_kib": after, "kib_per_session": (after - before) / sessions}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--imports", type=int, default=15)
    args = parser.parse_args()

    print("import time (median of fresh interpreters):")
    imports = {}
    for label, statement in IMPORTS.items():
        imports[label] = import_seconds(statement, args.imports)
        print(f"  {label:<42} {1000 * imports[label]:7.1f} ms", flush=True)

    print(f"\nserver RSS per idle session ({args.sessions} sessions):")
    memory: List[Dict[str, object]] = []
    for label, name in (
        ("floor: bare websockets server", "floor"),
        ("trivial sync env", "sync"),
        ("echo MCP env", "echo"),
    ):
        server = Server(name)
        try:
            row = asyncio.run(rss_per_session(server, args.sessions))
        finally:
            server.stop()
        memory.append({"server": label, **row})
        print(
            f"  {label:<32} {row['kib_per_session']:6.1f} KiB/session  (RSS {row['rss_before_kib'] / 1024:.1f} -> {row['rss_after_kib'] / 1024:.1f} MiB)",
            flush=True,
        )
    floor = memory[0]["kib_per_session"]
    for row in memory[1:]:
        print(f"  {row['server']}: x{row['kib_per_session'] / floor:.2f} the floor")  # type: ignore[operator]

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "footprint.json").write_text(
        json.dumps({"imports_s": imports, "memory": memory, "when": time.time()}, indent=2)
    )
    print(f"\nraw figures: {RESULTS / 'footprint.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
