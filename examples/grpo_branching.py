"""GRPO with branched groups, CPU only: each group's episodes share a prefix and fork from its state.

    python examples/grpo_branching.py              # a few seconds on 2 CPU cores
    python examples/grpo_branching.py --help

Grid World (``grid_world_env``) is served on 127.0.0.1. Every update plays, for each of
``--layouts`` seeded layouts, one episode for ``--branch-at`` moves; its session is then forked
(``rollout(..., branch_at=k)``, built on ``EnvClient.fork``) into ``--group`` sessions that start
from that same state, and each continues with the policy to its end. Advantages are computed
within each group (``result.advantages()``): the continuations of one state are compared with
each other, which is what GRPO's baseline is for, without replaying the prefix G times.

The policy is a table of logits per (layout, cell), trained by policy gradient on the moves made
after the branch point (the prefix is the same for the whole group: its advantage-weighted
gradient sums to zero). It prints the mean return of greedy play before and after, and writes
them to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

from grid_world_env.server.app import app

from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.rollout import rollout

MOVES = ("UP", "DOWN", "LEFT", "RIGHT")


class TablePolicy:
    """Softmax over a table of logits per (layout, x, y); samples, or plays greedily."""

    def __init__(self, seed: int) -> None:
        self.logits: Dict[Tuple[int, int, int], List[float]] = {}
        self.rng = random.Random(seed)
        self.greedy = False

    def probabilities(self, key: Tuple[int, int, int]) -> List[float]:
        logits = self.logits.setdefault(key, [0.0] * len(MOVES))
        top = max(logits)
        weights = [math.exp(v - top) for v in logits]
        total = sum(weights)
        return [w / total for w in weights]

    def __call__(self, observation: Dict[str, Any], episode: Any) -> Dict[str, str]:
        key = (episode.reset_kwargs["seed"], observation["x"], observation["y"])
        probabilities = self.probabilities(key)
        if self.greedy:
            choice = max(range(len(MOVES)), key=lambda i: probabilities[i])
        else:
            choice = self.rng.choices(range(len(MOVES)), probabilities)[0]
        return {"action": MOVES[choice]}

    def update(self, episodes: List[Any], advantages: List[float], lr: float) -> None:
        for episode, advantage in zip(episodes, advantages, strict=True):
            if not episode.ok or advantage == 0.0:
                continue
            start = episode.branched_at or 0
            for observation, action in zip(episode.observations[start:], episode.actions[start:], strict=False):
                key = (episode.reset_kwargs["seed"], observation["x"], observation["y"])
                probabilities = self.probabilities(key)
                chosen = MOVES.index(action["action"])
                logits = self.logits[key]
                for i in range(len(MOVES)):  # d log pi(chosen) / d logit_i = 1[i = chosen] - p_i
                    logits[i] += lr * advantage * ((1.0 if i == chosen else 0.0) - probabilities[i])


def evaluate(url: str, policy: TablePolicy, layouts: List[Dict[str, Any]], max_steps: int) -> float:
    policy.greedy = True
    try:
        result = rollout(url, policy, layouts, max_steps=max_steps, concurrency=len(layouts))
    finally:
        policy.greedy = False
    return result.summary.mean_return


def main(argv: Any = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--layouts", type=int, default=4, help="seeded layouts trained on (one group each)")
    parser.add_argument("--group", type=int, default=8, help="continuations forked from each prefix")
    parser.add_argument("--branch-at", type=int, default=2, help="moves shared by a group before it forks")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)

    layouts = [{"seed": s, "size": 4, "max_steps": args.max_steps} for s in range(args.layouts)]
    policy = TablePolicy(args.seed)
    began = time.perf_counter()
    with BackgroundServer(app) as server:
        before = evaluate(server.base_url, policy, layouts, args.max_steps)
        for iteration in range(args.iterations):
            result = rollout(
                server.base_url,
                policy,
                layouts,
                group_size=args.group,
                branch_at=args.branch_at,
                max_steps=args.max_steps,
                concurrency=args.group * args.layouts,
            )
            policy.update(result.episodes, result.advantages(), args.lr)
            if iteration % 10 == 0 or iteration == args.iterations - 1:
                print(f"iteration {iteration:3d}: {result.summary}", flush=True)
        after = evaluate(server.base_url, policy, layouts, args.max_steps)
    figures = {
        "greedy_return_before": before,
        "greedy_return_after": after,
        "iterations": args.iterations,
        "episodes_per_iteration": args.layouts * args.group,
        "wall_s": round(time.perf_counter() - began, 2),
    }
    print(f"greedy return: {before:.3f} before, {after:.3f} after ({figures['wall_s']} s)")
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
