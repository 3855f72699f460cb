"""What running a sync environment's step on a worker thread costs, beside running it on the loop.

The floor is the same step called directly on the event loop's thread. Both are measured back to
back (the threads stay busy) and after an idle millisecond before each call (as between a
trainer's steps, when the threads sleep and the CPU's caches go cold). CPU and thread switches
(voluntary and involuntary context switches) are this process's, from getrusage. Back to back, a
hand-off can cost no fewer than two switches: the worker sleeps until the call comes, the loop
until the result does.

    python bench/bench_handoff.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apps import PingAction, TrivialEnv

from openenv.core.env_server.workers import WorkerPool


def usage() -> Tuple[float, int]:
    """This process's CPU seconds and context switches (all threads)."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return now.ru_utime + now.ru_stime, now.ru_nvcsw + now.ru_nivcsw


async def per_call(call: Callable[[], Awaitable[Any]], calls: int, idle_s: float) -> Tuple[float, float, float]:
    """CPU µs and context switches per call, less what the idle wait alone costs, and the
    median µs from the call to its result."""

    async def run(body: Callable[[], Awaitable[Any]]) -> Tuple[float, int, float]:
        clock = time.perf_counter
        took = []
        cpu, switches = usage()
        for _ in range(calls):
            if idle_s:
                await asyncio.sleep(idle_s)
            started = clock()
            await body()
            took.append(clock() - started)
        cpu_after, switches_after = usage()
        return cpu_after - cpu, switches_after - switches, statistics.median(took)

    async def nothing() -> None:
        return None

    base_cpu, base_switches, _ = await run(nothing)
    cpu, switches, latency = await run(call)
    return 1e6 * (cpu - base_cpu) / calls, (switches - base_switches) / calls, 1e6 * latency


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
        floor_us, floor_switches, floor_latency = await per_call(inline, calls, idle_s)
        ours_us, ours_switches, ours_latency = await per_call(handoff, calls, idle_s)
        rows[label] = {
            "floor_us": floor_us,
            "ours_us": ours_us,
            "floor_switches": floor_switches,
            "ours_switches": ours_switches,
            "floor_latency_us": floor_latency,
            "ours_latency_us": ours_latency,
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
    print(
        "| trivial sync step | on the loop (floor) CPU µs | on a worker CPU µs | ratio "
        "| thread switches per call, floor / ours | median µs to the result, floor / ours |"
    )
    print("|---|---|---|---|---|---|")
    for label, row in rows.items():
        print(
            f"| {label} | {row['floor_us']:.1f} | {row['ours_us']:.1f} | {row['ours_us'] / row['floor_us']:.1f} "
            f"| {max(row['floor_switches'], 0.0):.2f} / {max(row['ours_switches'], 0.0):.2f} "
            f"| {row['floor_latency_us']:.1f} / {row['ours_latency_us']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
