"""Resumable sessions under a fault-injecting proxy (docs/resume.md).

1. **Resume time.** A client steps the echo environment through :class:`FaultProxy`; before every
   other step the proxy resets the connection (``reset``: between two calls) or cuts the step's
   frame mid-way (``cut``: during a call). The resumed step's time (p50, p99) is reported beside
   a plain step's in the same run (the floor), and as the difference.
2. **Episodes under chaos.** ``--episodes`` episodes of ``--steps`` echo steps each while the proxy
   resets a random live connection every ~25 ms, then every ~5 ms: an episode is *whole* when every
   step's answer echoes its own message and the state's ``step_count`` is exact; *doubled* when a
   step was applied twice (a count or an answer off by one); *raised* when the client gave up with
   an exception. The same run without resume (``reconnect_timeout_s=0``: OpenEnv 0.10's behaviour)
   is the comparison. Sessions left on the server are counted after the episodes, and again once
   the grace period has passed.

    python bench/bench_resume.py [--episodes 500] [--steps 20] [--trials 200] [--mode simulation]

Bounded: every client call has its own timeouts, and the run stops after ``--max-s`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from echo_env import EchoEnv
from echo_env.server.echo_environment import EchoEnvironment

from openenv.core import GenericEnvClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.env_server.settings import ServerLimits
from openenv.testing.faults import FaultProxy

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
GRACE_S = 2.0  # the server's grace period in this run (short, so that what it holds can be seen to go)


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def echo(i: int) -> CallToolAction:
    return CallToolAction(tool_name="echo_message", arguments={"message": f"m{i}"})


def client(url: str, mode: str, **options: Any) -> Any:
    """Production mode: echo's own MCP client; simulation mode (the WebSocket owns the session):
    a GenericEnvClient, as MCP clients are production-only (upstream's rule)."""
    if mode == "production":
        return EchoEnv(base_url=url, **options)
    return GenericEnvClient(base_url=url, mode="simulation", **options)


def step_count(state: Any) -> int:
    return state["step_count"] if isinstance(state, dict) else state.step_count


def answer(result: Any) -> Any:
    observation = result.observation
    return observation.result if not isinstance(observation, dict) else observation["result"]["data"]


async def resume_times(proxy: FaultProxy, mode: str, trials: int, fault: str) -> Dict[str, Any]:
    plain: List[float] = []
    resumed: List[float] = []
    async with client(proxy.base_url, mode) as env:
        await env.reset()
        for i in range(trials):
            started = time.perf_counter()
            await env.step(echo(i))
            plain.append(time.perf_counter() - started)
            proxy.fault(fault)
            started = time.perf_counter()
            result = await env.step(echo(i))
            resumed.append(time.perf_counter() - started)
            assert answer(result) == f"m{i}", result.observation
        state = await env.state()
        assert step_count(state) == 2 * trials, state
    floor50, floor99 = percentile(plain, 0.5), percentile(plain, 0.99)
    p50, p99 = percentile(resumed, 0.5), percentile(resumed, 0.99)
    return {
        "fault": fault,
        "trials": trials,
        "plain_step_ms": {"p50": floor50 * 1e3, "p99": floor99 * 1e3},
        "resumed_step_ms": {"p50": p50 * 1e3, "p99": p99 * 1e3},
        "resume_cost_ms": {"p50": (p50 - floor50) * 1e3, "p99": (p99 - floor99) * 1e3},
    }


async def episode(url: str, mode: str, steps: int, reconnect_timeout_s: float) -> str:
    try:
        async with client(url, mode, reconnect_timeout_s=reconnect_timeout_s) as env:
            await env.reset()
            for i in range(steps):
                result = await env.step(echo(i))
                if answer(result) != f"m{i}":
                    return "doubled"  # an answer that is not this step's
            count = step_count(await env.state())
    except Exception as exc:
        return f"raised: {type(exc).__name__}: {str(exc)[:160]}"
    if count == steps:
        return "whole"
    return "doubled" if count > steps else "lost"


async def chaos(
    server: Any, proxy: FaultProxy, mode: str, period_s: float, episodes: int, steps: int, resume: bool, deadline: float
) -> Dict[str, Any]:
    manager = server.server.config.app.state.openenv_server.manager
    before = dict(proxy.injected)
    proxy.chaos(period_s, ("reset",))
    outcomes: Dict[str, int] = {}
    samples: List[str] = []
    held_before = manager.active_sessions  # (left by an earlier row: sessions without resume wait out their idle limit)
    started = time.perf_counter()
    try:
        for _ in range(episodes):
            if time.monotonic() > deadline:
                break
            outcome = await episode(proxy.base_url, mode, steps, 30.0 if resume else 0.0)
            if outcome.startswith("raised"):
                samples.append(outcome)
                outcome = outcome.split(":")[0] + ":" + outcome.split(":")[1]
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        proxy.calm()
    elapsed = time.perf_counter() - started
    held = manager.active_sessions
    await asyncio.sleep(GRACE_S * 1.5)
    ran = sum(outcomes.values())
    return {
        "period_ms": period_s * 1e3,
        "resume": resume,
        "episodes": ran,
        "whole_pct": 100.0 * outcomes.get("whole", 0) / max(ran, 1),
        "outcomes": outcomes,
        "resets": proxy.injected["reset"] - before["reset"],
        "seconds": elapsed,
        "sessions_left_after": held - held_before,
        "sessions_left_after_grace": manager.active_sessions - held_before,
        "raised_samples": samples[:3],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--mode", default="simulation", choices=("simulation", "production"))
    parser.add_argument("--max-s", type=float, default=600.0)
    parser.add_argument("--out", default="resume.json")
    args = parser.parse_args()
    deadline = time.monotonic() + args.max_s
    app = create_app(
        EchoEnvironment,
        CallToolAction,
        CallToolObservation,
        env_name="echo_env",
        max_concurrent_envs=64,
        limits=ServerLimits(resume_grace_s=GRACE_S),
    )
    report: Dict[str, Any] = {"mode": args.mode, "grace_s": GRACE_S, "steps": args.steps}
    with BackgroundServer(app) as server, FaultProxy(server.port, seed=1) as proxy:
        report["resume_time"] = [await resume_times(proxy, args.mode, args.trials, fault) for fault in ("reset", "cut")]
        report["chaos"] = []
        for period_s in (0.025, 0.005):
            for resume in (True, False):
                row = await chaos(server, proxy, args.mode, period_s, args.episodes, args.steps, resume, deadline)
                report["chaos"].append(row)
                print(json.dumps(row), flush=True)
    for row in report["resume_time"]:
        print(json.dumps(row))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(report, indent=2))
    print(f"written to {RESULTS / args.out}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
