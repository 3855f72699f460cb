"""Several sandboxed server processes behind one URL (``SandboxPool`` / ``openenv serve --workers``).

* **Aggregate steps/s**, 64 WebSocket sessions stepping back to back, through a pool of 2
  workers against a pool of 1 (the same front, in turns of the same run): for a sync environment
  whose step does about 1 ms of pure-Python work (the servers' work, not the load client's, is
  what is measured) and for a trivial one. The ratio is the figure.
* **Concurrency ceiling**: how many sessions the machine holds at once, every one stepping
  steadily (one step every ``--period`` seconds) for ``--hold`` seconds, with every call answered.
* **Server memory per idle session**: the growth of the workers' resident memory (every process
  of their sandboxes) over N idle sessions, divided by N.

The load client runs in a process of its own (``python bench_scale.py client ...``), never in the
process that runs the front. Each run is bounded in sessions and time.

    python bench/bench_scale.py [--seconds 8] [--repeats 2] [--ceiling 9000] [--hold 60]
                                [--ceiling-direct 12000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any, Dict, List

from openenv.core.containers.runtime.sandbox import _descendants

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

MANIFEST = """spec_version: 1
name: bench_scale_env
version: 0.1.0
type: space
runtime: fastapi
app: server.app:app
port: 8000
"""

APP = '''
"""BENCH_KIND=work: each step does about 1 ms of pure-Python work; trivial: none."""
import os
import time

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class Ping(Action):
    message: str = ""


class Pong(Observation):
    echoed: str = ""


def _spin(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def _calibrate(seconds=0.001):
    n = 20000
    samples = []
    for _ in range(7):
        began = time.perf_counter()
        _spin(n)
        samples.append(time.perf_counter() - began)
    return max(1, int(n * seconds / sorted(samples)[3]))


SPIN = _calibrate() if os.environ.get("BENCH_KIND") == "work" else 0


class BenchEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id="bench", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id="bench", step_count=0)
        return Pong(echoed="ready", reward=0.0)

    def step(self, action, timeout_s=None, **kwargs):
        if SPIN:
            _spin(SPIN)
        self._state.step_count += 1
        return Pong(echoed=action.message, reward=1.0)

    @property
    def state(self):
        return self._state


app = create_app(BenchEnv, Ping, Pong, env_name="bench_scale_env", max_concurrent_envs=64)
'''

STEP = '{"type":"step","data":{"message":"hello"}}'


def make_package(root: Path) -> Path:
    package = root / "bench_scale_env"
    (package / "server").mkdir(parents=True)
    (package / "openenv.yaml").write_text(MANIFEST)
    (package / "__init__.py").write_text("")
    (package / "server" / "__init__.py").write_text("")
    (package / "server" / "app.py").write_text(APP)
    return package


def raise_fd_limit() -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tree_rss_kib(pid: int) -> int:
    """Resident memory of every process below ``pid`` (the sandboxes' wardens, servers, brokers)."""
    total = 0
    for child in _descendants(pid):
        with contextlib.suppress(OSError):
            total += rss_kib(child)
    return total


# --- the load client (its own process) -----------------------------------------------------------


async def _open(url: str, n: int, parallel: int = 200) -> List[Any]:
    """``n`` sessions on ``url``: ``ws://...`` (through the front) or ``unix:PATH`` (one worker's
    own socket, as the front reaches it)."""
    from websockets.asyncio.client import connect, unix_connect

    gate = asyncio.Semaphore(parallel)
    options: Dict[str, Any] = {"compression": None, "open_timeout": 120, "ping_interval": None, "max_queue": 4}

    async def one() -> Any:
        async with gate:
            if url.startswith("unix:"):
                ws = await unix_connect(url[len("unix:") :], uri="ws://localhost/ws", **options)
            else:
                ws = await connect(url, **options)
            await ws.send('{"type":"reset","data":{}}')
            reply = await ws.recv()
            if '"error"' in reply[:20]:
                raise RuntimeError(reply[:300])
            return ws

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def _steps(url: str, sessions: int, seconds: float) -> Dict[str, Any]:
    sockets = await _open(url, sessions)
    stop_at = 0.0
    counts = [0] * sessions

    async def drive(index: int, ws: Any, until: float) -> None:
        while time.perf_counter() < until:
            await ws.send(STEP)
            reply = await ws.recv()
            if reply.startswith('{"type":"error"'):
                raise RuntimeError(reply[:300])
            counts[index] += 1

    warm = time.perf_counter() + 1.0
    await asyncio.gather(*(drive(i, ws, warm) for i, ws in enumerate(sockets)))
    counts = [0] * sessions
    began = time.perf_counter()
    stop_at = began + seconds
    await asyncio.gather(*(drive(i, ws, stop_at) for i, ws in enumerate(sockets)))
    elapsed = time.perf_counter() - began
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return {"steps_per_s": sum(counts) / elapsed, "steps": sum(counts)}


async def _hold(url: str, sessions: int, seconds: float, period: float) -> Dict[str, Any]:
    """Open ``sessions``, then each steps once every ``period`` s for ``seconds``; count answers."""
    began_open = time.perf_counter()
    sockets = await _open(url, sessions)
    opened_s = time.perf_counter() - began_open
    latencies: List[float] = []
    failures: List[str] = []

    async def drive(index: int, ws: Any, until: float) -> None:
        await asyncio.sleep(period * index / sessions)  # spread evenly over the period
        next_at = time.perf_counter()
        while next_at < until:
            started = time.perf_counter()
            try:
                await ws.send(STEP)
                reply = await asyncio.wait_for(ws.recv(), 30)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                return
            if reply.startswith('{"type":"error"'):
                failures.append(reply[:200])
                return
            latencies.append(time.perf_counter() - started)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    until = time.perf_counter() + seconds
    await asyncio.gather(*(drive(i, ws, until) for i, ws in enumerate(sockets)))
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    latencies.sort()
    count = len(latencies)
    return {
        "sessions": sessions,
        "open_s": opened_s,
        "answered": count,
        "failures": len(failures),
        "first_failure": failures[0] if failures else None,
        "p50_ms": 1000 * latencies[count // 2] if count else None,
        "p99_ms": 1000 * latencies[min(count - 1, int(count * 0.99))] if count else None,
    }


async def _idle(url: str, sessions: int, ready: str) -> None:
    sockets = await _open(url, sessions)
    print(ready, flush=True)
    sys.stdin.readline()  # held open until told
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)


def client_main(argv: List[str]) -> None:
    raise_fd_limit()
    mode, url, sessions = argv[0], argv[1], int(argv[2])
    if mode == "steps":
        print(json.dumps(asyncio.run(_steps(url, sessions, float(argv[3])))))
    elif mode == "hold":
        print(json.dumps(asyncio.run(_hold(url, sessions, float(argv[3]), float(argv[4])))))
    else:
        asyncio.run(_idle(url, sessions, "ready"))


def run_client(*args: Any, timeout: float) -> Dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "client", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- the measurements ------------------------------------------------------------------------------


def pool(package: Path, workers: int, kind: str, **options: Any) -> Any:
    from openenv.core.containers.runtime import SandboxPool

    env = {"BENCH_KIND": kind, **options.pop("env_vars", {})}
    return SandboxPool(str(package), workers, env_vars=env, **options)


def throughput(package: Path, kind: str, sessions: int, seconds: float, repeats: int) -> Dict[str, Any]:
    runs: Dict[int, List[float]] = {1: [], 2: []}
    for _ in range(repeats):
        for workers in (1, 2):  # in turns, so drifting load on the machine falls on both
            with pool(package, workers, kind) as served:
                ws_url = served.base_url.replace("http://", "ws://") + "/ws"
                result = run_client("steps", ws_url, sessions, seconds, timeout=seconds + 120)
                runs[workers].append(result["steps_per_s"])
    one, two = median(runs[1]), median(runs[2])
    return {"kind": kind, "sessions": sessions, "workers_1": one, "workers_2": two, "ratio": two / one, "runs": runs}


def ceiling(package: Path, sessions: int, hold: float, period: float) -> Dict[str, Any]:
    per_worker = (sessions + 1) // 2
    options = {"env_vars": {"OPENENV_MAX_SESSIONS": str(per_worker)}, "max_open_files": per_worker + 512}
    with pool(package, 2, "trivial", **options) as served:
        ws_url = served.base_url.replace("http://", "ws://") + "/ws"
        result = run_client("hold", ws_url, sessions, hold, period, timeout=hold + 600)
    result.update({"hold_s": hold, "period_s": period, "steps_per_s": result["answered"] / hold})
    return result


def ceiling_direct(package: Path, sessions: int, hold: float, period: float) -> Dict[str, Any]:
    """The same hold with the front out of the way: one load process per worker, each on that
    worker's Unix socket. The front needs two descriptors per session (the client's and the
    worker's), so under a hard ``ulimit -n`` of N it relays at most about N/2 sessions; the
    workers themselves are bound only by their own limits."""
    per_worker = (sessions + 1) // 2
    options = {"env_vars": {"OPENENV_MAX_SESSIONS": str(per_worker)}, "max_open_files": per_worker + 512}
    with pool(package, 2, "trivial", **options) as served:
        paths = [worker.socket_path for worker in served.front.workers.values()]
        clients = [
            subprocess.Popen(
                [sys.executable, __file__, "client", "hold", f"unix:{path}", str(per_worker), str(hold), str(period)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for path in paths
        ]
        rows = []
        for client in clients:
            out, err = client.communicate(timeout=hold + 600)
            if client.returncode != 0:
                raise RuntimeError(err[-2000:])
            rows.append(json.loads(out.strip().splitlines()[-1]))
    p99s = [r["p99_ms"] for r in rows if r["p99_ms"] is not None]
    return {
        "sessions": sum(r["sessions"] for r in rows),
        "answered": sum(r["answered"] for r in rows),
        "failures": sum(r["failures"] for r in rows),
        "first_failure": next((r["first_failure"] for r in rows if r["first_failure"]), None),
        "p50_ms": max(r["p50_ms"] for r in rows if r["p50_ms"] is not None),
        "p99_ms": max(p99s) if p99s else None,
        "open_s": max(r["open_s"] for r in rows),
        "per_worker": rows,
        "hold_s": hold,
        "period_s": period,
    }


def idle_memory(package: Path, sessions: int) -> Dict[str, Any]:
    per_worker = (sessions + 1) // 2
    options = {"env_vars": {"OPENENV_MAX_SESSIONS": str(per_worker)}, "max_open_files": per_worker + 512}
    with pool(package, 2, "trivial", **options) as served:
        ws_url = served.base_url.replace("http://", "ws://") + "/ws"
        time.sleep(1.0)
        before, front_before = tree_rss_kib(os.getpid()), rss_kib(os.getpid())
        client = subprocess.Popen(
            [sys.executable, __file__, "client", "idle", ws_url, str(sessions)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert client.stdout is not None and client.stdin is not None
            if client.stdout.readline().strip() != "ready":
                raise RuntimeError("the idle client did not open its sessions")
            time.sleep(1.0)
            grown = tree_rss_kib(os.getpid()) - before - rss_kib(client.pid)  # the sandboxes, not the client
            front = rss_kib(os.getpid()) - front_before
            client.stdin.write("\n")
            client.stdin.flush()
        finally:
            client.wait(60)
    return {
        "sessions": sessions,
        "workers_kib_per_session": grown / sessions,
        "front_kib_per_session": front / sessions,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kinds", default="work,trivial", help="environments of the steps/s rows ('': skip)")
    parser.add_argument("--ceiling", type=int, default=9000, help="sessions held at once (0: skip)")
    parser.add_argument("--hold", type=float, default=60.0)
    parser.add_argument("--period", type=float, default=10.0, help="seconds between two steps of a session")
    parser.add_argument(
        "--ceiling-direct", type=int, default=0, help="sessions held at once on the workers' own sockets (0: skip)"
    )
    parser.add_argument("--idle", type=int, default=2000, help="idle sessions for the memory figure (0: skip)")
    args = parser.parse_args()
    hard = raise_fd_limit()
    report: Dict[str, Any] = {"cpus": os.cpu_count(), "fd_limit": hard, "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="openenv-bench-scale-") as tmp:
        package = make_package(Path(tmp))
        for kind in filter(None, args.kinds.split(",")):
            row = throughput(package, kind, args.sessions, args.seconds, args.repeats)
            report[f"throughput_{kind}"] = row
            print(
                f"{kind:8s} {args.sessions} sessions: 1 worker {row['workers_1']:8.0f} steps/s, "
                f"2 workers {row['workers_2']:8.0f} steps/s, ratio {row['ratio']:.2f}",
                flush=True,
            )
        if args.idle:
            row = idle_memory(package, args.idle)
            report["idle_memory"] = row
            print(
                f"idle     {args.idle} sessions: {row['workers_kib_per_session']:.1f} KiB per session in the workers, "
                f"{row['front_kib_per_session']:.1f} KiB in the front",
                flush=True,
            )
        if args.ceiling:
            row = ceiling(package, args.ceiling, args.hold, args.period)
            report["ceiling"] = row
            print(
                f"ceiling  {row['sessions']} sessions held {args.hold:g} s, a step each every {args.period:g} s: "
                f"{row['answered']} answered, {row['failures']} failed, p50 {row['p50_ms']} ms, "
                f"p99 {row['p99_ms']} ms (opened in {row['open_s']:.1f} s)",
                flush=True,
            )
        if args.ceiling_direct:
            row = ceiling_direct(package, args.ceiling_direct, args.hold, args.period)
            report["ceiling_direct"] = row
            print(
                f"direct   {row['sessions']} sessions on the 2 workers' sockets held {args.hold:g} s: "
                f"{row['answered']} answered, {row['failures']} failed, p50 {row['p50_ms']} ms (worst worker), "
                f"p99 {row['p99_ms']} ms (opened in {row['open_s']:.1f} s)",
                flush=True,
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        client_main(sys.argv[2:])
    else:
        sys.exit(main())
