"""What running a sync environment's step on a worker thread costs, beside running it on the loop.

The floor is the same step called directly on the event loop's thread. Both are measured back to
back (the threads stay busy) and after an idle millisecond before each call (as between a
trainer's steps, when the threads sleep and the CPU's caches go cold). CPU is this process's,
from getrusage.

    python bench/bench_handoff.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apps import PingAction, TrivialEnv

from openenv.core.env_server.workers import WorkerPool


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def per_call_us(call: Callable[[], Awaitable[Any]], calls: int, idle_s: float) -> float:
    """CPU µs per call, less what the idle wait alone costs."""

    async def run(body: Callable[[], Awaitable[Any]]) -> float:
        started = cpu_s()
        for _ in range(calls):
            if idle_s:
                await asyncio.sleep(idle_s)
            await body()
        return cpu_s() - started

    async def nothing() -> None:
        return None

    baseline = await run(nothing)
    return 1e6 * (await run(call) - baseline) / calls


async def main_async(calls: int) -> Dict[str, Dict[str, float]]:
    env = TrivialEnv()
    env.reset()
    action = PingAction(message="hello")
    pool = WorkerPool(4)

    async def inline() -> None:
        env.step(action)

    async def handoff() -> None:
        await pool.run(env.step, action)

    for _ in range(200):  # warm up the worker and both paths
        await inline()
        await handoff()
    rows: Dict[str, Dict[str, float]] = {}
    for label, idle_s in (("back to back", 0.0), ("after 1 ms idle", 0.001)):
        rows[label] = {
            "floor_us": await per_call_us(inline, calls, idle_s),
            "ours_us": await per_call_us(handoff, calls, idle_s),
        }
    pool.shutdown()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    rows = asyncio.run(main_async(args.calls))
    print("| trivial sync step | on the loop (floor) CPU µs | on a worker CPU µs | ratio |")
    print("|---|---|---|---|")
    for label, row in rows.items():
        print(f"| {label} | {row['floor_us']:.1f} | {row['ours_us']:.1f} | {row['ours_us'] / row['floor_us']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
