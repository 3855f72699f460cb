"""Fork into 16 against 16 fresh sessions that replay the prefix (issue: fork/snapshot).

    python bench/bench_fork.py [--forks 16] [--repeats 3] [--skip-shell]

Two environments, each served in this process by uvicorn on 127.0.0.1:

* a pure-Python environment (a seeded random walk that keeps its history), 50-step prefix;
* ``shell_env`` whose prefix writes a 10 MB workspace (10 MB of random bytes, incompressible,
  then small commands up to 50 steps; every command runs in its own sandbox).

For each: the wall time to get ``--forks`` sessions at the prefix's end by ``fork(n)`` (one
snapshot, n restores) and by replaying (n fresh sessions, each reset and stepped through the
prefix, concurrently), their ratio, and the snapshot's size. Medians of ``--repeats`` turns,
alternating. Figures go to stdout and ``bench/results/fork.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.generic_client import GenericEnvClient

RESULTS = Path(__file__).resolve().parent / "results"


class WalkAction(Action):
    step: int = 1


class WalkObservation(Observation):
    position: int = 0
    visited: int = 0


class WalkEnv(Environment[WalkAction, WalkObservation, State]):
    """A seeded random walk that keeps every position it visited (its state grows with the episode)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True

    def __init__(self) -> None:
        super().__init__()
        self.rng = random.Random(0)
        self.position = 0
        self.history: List[int] = []
        self._state = State(episode_id="walk", step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> WalkObservation:
        self.rng = random.Random(seed)
        self.position, self.history = 0, [0]
        self._state = State(episode_id=episode_id or "walk", step_count=0)
        return WalkObservation(position=0, visited=1, reward=0.0)

    def step(self, action: WalkAction, timeout_s: Optional[float] = None, **kwargs: Any) -> WalkObservation:
        for _ in range(200):  # some pure-Python work per step
            self.position += self.rng.choice((-action.step, action.step))
        self.history.append(self.position)
        self._state.step_count += 1
        return WalkObservation(position=self.position, visited=len(set(self.history)), reward=self.rng.random())

    @property
    def state(self) -> State:
        return self._state


def walk_app() -> Any:
    return create_app(WalkEnv, WalkAction, WalkObservation, env_name="walk", max_concurrent_envs=64)


def shell_app() -> Any:
    from shell_env.server.app import app

    return app


WALK_PREFIX = [{"step": 1 + i % 3} for i in range(50)]


def _shell(command: str) -> Dict[str, Any]:
    return {"type": "call_tool", "tool_name": "run_command", "arguments": {"command": command}}


SHELL_PREFIX = [_shell("head -c 10485760 /dev/urandom > blob.bin && ls -l blob.bin")] + [
    _shell(f"echo line {i} >> notes.txt") for i in range(49)
]


async def _prefix(url: str, reset: Dict[str, Any], prefix: List[Dict[str, Any]]) -> GenericEnvClient:
    env = GenericEnvClient(base_url=url, message_timeout_s=300)
    await env.connect()
    await env.reset(**reset)
    for action in prefix:
        await env.step(action)
    return env


async def by_fork(url: str, reset: Dict[str, Any], prefix: List[Dict[str, Any]], n: int) -> Dict[str, float]:
    origin = await _prefix(url, reset, prefix)
    try:
        began = time.perf_counter()
        snapshot = await origin.snapshot()
        snapped = time.perf_counter()
        forks = await origin.fork(n)
        done = time.perf_counter()
        assert len(forks) == n
        return {"wall_s": done - began, "snapshot_s": snapped - began, "snapshot_bytes": len(snapshot)}
    finally:
        await origin.close()


async def by_replay(url: str, reset: Dict[str, Any], prefix: List[Dict[str, Any]], n: int) -> Dict[str, float]:
    began = time.perf_counter()
    sessions = await asyncio.gather(*(_prefix(url, reset, prefix) for _ in range(n)))
    wall = time.perf_counter() - began
    await asyncio.gather(*(s.close() for s in sessions))
    return {"wall_s": wall}


def measure(
    name: str, app: Any, reset: Dict[str, Any], prefix: List[Dict[str, Any]], n: int, repeats: int
) -> Dict[str, Any]:
    forks, replays = [], []
    with BackgroundServer(app) as server:
        for _ in range(repeats):
            forks.append(asyncio.run(by_fork(server.base_url, reset, prefix, n)))
            replays.append(asyncio.run(by_replay(server.base_url, reset, prefix, n)))
    fork_s = statistics.median(f["wall_s"] for f in forks)
    replay_s = statistics.median(r["wall_s"] for r in replays)
    figures = {
        "env": name,
        "forks": n,
        "prefix_steps": len(prefix),
        "fork_s": round(fork_s, 4),
        "snapshot_s": round(statistics.median(f["snapshot_s"] for f in forks), 4),
        "replay_s": round(replay_s, 4),
        "replay_over_fork": round(replay_s / fork_s, 2),
        "snapshot_bytes": forks[0]["snapshot_bytes"],
        "turns": repeats,
    }
    print(
        f"{name}: fork({n}) {fork_s * 1000:.0f} ms (snapshot {figures['snapshot_s'] * 1000:.0f} ms, "
        f"{figures['snapshot_bytes'] / 1024:.0f} KiB) vs {n} replays of {len(prefix)} steps {replay_s * 1000:.0f} ms: "
        f"fork is {figures['replay_over_fork']}x faster",
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-shell", action="store_true")
    args = parser.parse_args()
    results = [measure("pure-Python walk", walk_app(), {"seed": 1}, WALK_PREFIX, args.forks, args.repeats)]
    if not args.skip_shell:
        import os

        os.environ.setdefault("OPENENV_MAX_SESSIONS", str(args.forks + 4))
        results.append(
            measure("shell_env, 10 MB workspace", shell_app(), {"seed": 0}, SHELL_PREFIX, args.forks, args.repeats)
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fork.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
