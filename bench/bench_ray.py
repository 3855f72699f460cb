"""Per-step cost through a RayEnvPool replica against the same server connected to directly.

A one-node local Ray (on 127.0.0.1, checked) runs a pool of one sandboxed echo replica; beside it
the same package runs in the default sandbox provider outside Ray, reached on its Unix socket (the
floor: what ``EchoEnv.from_env`` gives on one machine). K clients step each server back to back
(an MCP tool call per step, the pool's token on both), in alternating turns. A step's cost is its
wall time (turn time / steps) and the serving side's CPU per step (the replica actor and its
sandbox; the floor's warden and server); each ratio is the median of the turns' own ratios. Goal:
at most 1.1.

    python bench/bench_ray.py [--turns 21] [--seconds 0.5] [--k 1,16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only; read when Ray is imported

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench_ws import RESULTS, cpu_seconds  # noqa: E402

from openenv.core.containers.runtime.sandbox import _descendants  # noqa: E402


def tree(pid: int) -> List[int]:
    """``pid`` and every process below it."""
    return [pid, *_descendants(pid)]


def cpu_of(pids: List[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            pass
    return total


async def steps_per_s(clients: List[Any], seconds: float) -> int:
    from echo_env import CallToolAction

    action = CallToolAction(tool_name="echo_message", arguments={"message": "hello"})
    steps = 0
    stop_at = time.perf_counter() + seconds

    async def drive(client: Any) -> None:
        nonlocal steps
        while time.perf_counter() < stop_at:
            await client.step(action)
            steps += 1

    await asyncio.gather(*(drive(c) for c in clients))
    return steps


async def measure(
    urls: Dict[str, str], headers: Dict[str, str], pids: Dict[str, List[int]], k: int, turns: int, seconds: float
):
    """Alternating turns on the two paths: wall time and CPU (of ``pids``) per step."""
    from echo_env import EchoEnv

    clients = {name: [EchoEnv(base_url=url, headers=headers) for _ in range(k)] for name, url in urls.items()}
    for group in clients.values():
        await asyncio.gather(*(c.connect() for c in group))
        await asyncio.gather(*(c.reset() for c in group))
        await steps_per_s(group, 0.3)  # warm up
    wall: Dict[str, List[float]] = {name: [] for name in urls}
    cpu: Dict[str, List[float]] = {name: [] for name in urls}
    for turn in range(turns):
        for name in sorted(urls, reverse=turn % 2 == 1):
            used, began = cpu_of(pids[name]), time.perf_counter()
            steps = await steps_per_s(clients[name], seconds)
            wall[name].append(1e6 * (time.perf_counter() - began) / steps)
            cpu[name].append(1e6 * (cpu_of(pids[name]) - used) / steps)
    for group in clients.values():
        await asyncio.gather(*(c.close() for c in group))
    row: Dict[str, Any] = {"k": k}
    for label, series in (("wall", wall), ("cpu", cpu)):
        row[label] = {f"{name}_us_per_step": statistics.median(values) for name, values in series.items()}
        for name in ("replica", "tcp"):
            ratios = [r / d for r, d in zip(series[name], series["direct"], strict=True) if d > 0]
            row[label][f"{name}_ratio"] = statistics.median(ratios)
            row[label][f"{name}_ratios"] = ratios
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=21)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--k", default="1,16")
    args = parser.parse_args()
    import ray

    from openenv.core.containers.runtime import SandboxProvider
    from openenv.ray import RayEnvPool

    echo = str(ROOT / "envs" / "echo_env")
    ray.init(num_cpus=1, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    rows = []
    try:
        addresses = {n["NodeManagerAddress"] for n in ray.nodes()}
        assert addresses == {"127.0.0.1"}, f"Ray must stay on loopback here, got {addresses}"
        with RayEnvPool(echo, replicas=1) as pool:
            info = ray.get(ray.get_actor(f"{pool.name}-0", namespace="openenv").info.remote())
            before = set(tree(os.getpid()))
            # The floor: the same package and server code, sandboxed here by the default provider and
            # reached on its Unix socket, as EchoEnv.from_env() would (it requires the same token).
            token = {"OPENENV_AUTH_TOKEN": pool.token}
            direct = SandboxProvider(echo, env_vars=token)
            # The same outside Ray on a TCP port (as the replica serves): what TCP itself costs.
            tcp = SandboxProvider(echo, env_vars=token, listen=("127.0.0.1", 0))
            try:
                urls = {"replica": pool.client().base_url, "direct": direct.start(), "tcp": tcp.start()}
                direct.wait_for_ready(60)
                tcp.wait_for_ready(60)
                floor = [p for p in tree(os.getpid()) if p not in before]  # both floors' warden and servers
                pids = {"replica": tree(info["pid"]), "direct": floor, "tcp": floor}
                for k in (int(x) for x in args.k.split(",")):
                    row = asyncio.run(measure(urls, pool.headers, pids, k, args.turns, args.seconds))
                    rows.append(row)
                    for label in ("wall", "cpu"):
                        f = row[label]
                        print(
                            f"K={k:<3} {label:4} us/step: direct (Unix socket) {f['direct_us_per_step']:6.1f}   "
                            f"replica {f['replica_us_per_step']:6.1f} (ratio {f['replica_ratio']:.2f})   "
                            f"same outside Ray on TCP {f['tcp_us_per_step']:6.1f} (ratio {f['tcp_ratio']:.2f})"
                        )
            finally:
                direct.stop()
                tcp.stop()
    finally:
        ray.shutdown()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ray.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
