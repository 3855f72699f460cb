"""Steps/s of a remote Gymnasium vector env beside the same environments run locally.

Eight sessions of ``CartPole-v1`` served by ``envs/gymnasium_env`` in the sandbox and stepped
through ``make_vector_env`` (each step: eight actions sent at once over the Unix socket, eight
answers awaited), beside the floor: eight local CartPoles in ``gymnasium.vector.SyncVectorEnv``.
Both see the same seeded random actions, with next-step autoreset, in alternating turns of the
same run; the ratio is remote / local.

    python bench/bench_gymnasium.py [--steps 2000] [--turns 3] [--num-envs 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict

import gymnasium
from gymnasium.vector import SyncVectorEnv

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench_ws import RESULTS  # noqa: E402

from openenv.core.containers.runtime import SandboxProvider  # noqa: E402
from openenv.gymnasium import make_vector_env  # noqa: E402


def steps_per_s(envs: Any, steps: int, seed: int) -> float:
    """Sub-environment steps per second over ``steps`` vector steps."""
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    actions = [envs.action_space.sample() for _ in range(steps)]
    began = time.perf_counter()
    for action in actions:
        envs.step(action)
    return steps * envs.num_envs / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="vector steps per turn")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=8)
    args = parser.parse_args()

    provider = SandboxProvider(str(ROOT / "envs" / "gymnasium_env"))
    url = provider.start()
    rows: Dict[str, list] = {"remote": [], "local": []}
    try:
        provider.wait_for_ready(60)
        remote = make_vector_env(url, env_id="CartPole-v1", num_envs=args.num_envs)
        local = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1") for _ in range(args.num_envs)])
        try:
            steps_per_s(remote, 100, 0)  # warm-up: connections, first makes
            for turn in range(args.turns):
                rows["remote"].append(steps_per_s(remote, args.steps, turn))
                rows["local"].append(steps_per_s(local, args.steps, turn))
        finally:
            remote.close()
            local.close()
    finally:
        provider.stop()
    remote_s, local_s = statistics.median(rows["remote"]), statistics.median(rows["local"])
    print(f"CartPole-v1, {args.num_envs} sub-environments, {args.steps} vector steps x {args.turns} turns (median)")
    print(f"  remote (make_vector_env, sandboxed server): {remote_s:12,.0f} steps/s")
    print(f"  local  (SyncVectorEnv):                     {local_s:12,.0f} steps/s")
    print(f"  ratio remote / local: {remote_s / local_s:.4f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gymnasium.json").write_text(
        json.dumps(
            {"num_envs": args.num_envs, "steps": args.steps, "turns": rows, "ratio": remote_s / local_s}, indent=2
        )
    )
    print(f"\nraw figures: {RESULTS / 'gymnasium.json'}")


if __name__ == "__main__":
    main()
