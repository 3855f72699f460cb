"""GRPO branching: ``rollout(..., branch_at=k)`` forks each group from one prefix (a real server,
a seeded environment whose every step draws from its generator, so a branch that did not start
from the prefix's exact state shows)."""

from __future__ import annotations

from typing import Any

import pytest

from openenv.core.generic_client import GenericEnvClient
from openenv.core.rollout import rollout

from .conftest import serve
from .test_snapshots import dice_app


def policy(observation: Any, episode: Any) -> dict:
    """A different bet per episode after the branch point (the prefix is the group's first episode's)."""
    return {"bet": 1 + (episode.index * 7 + episode.step) % 3}


def _replayed(url: str, reset_kwargs: dict, actions: list) -> list:
    """The rewards and totals of ``actions`` played on a fresh session from the same reset: what a branch
    must have seen if it really continued the prefix's state."""
    with GenericEnvClient(base_url=url).sync() as env:
        env.reset(**reset_kwargs)
        return [(r.reward, r.observation["total"]) for r in (env.step(action) for action in actions)]


def test_each_group_branches_from_one_prefix_and_continues_exactly() -> None:
    with serve(dice_app()) as server:
        result = rollout(
            server.base_url, policy, [{"seed": 1}, {"seed": 2}], group_size=4, branch_at=3, max_steps=8, concurrency=8
        )
        assert result.summary.errors == 0 and len(result.episodes) == 8
        for group in (result.episodes[:4], result.episodes[4:]):
            trunk = group[0]
            assert all(e.branched_at == 3 for e in group)
            for episode in group:
                assert episode.actions[:3] == trunk.actions[:3] and episode.rewards[:3] == trunk.rewards[:3]
                assert len(episode.actions) == 8 and episode.truncated
                # the continuation is what a fresh session replaying the whole history gives
                seen = [(r, o["total"]) for r, o in zip(episode.rewards, episode.observations[1:], strict=True)]
                assert seen == _replayed(server.base_url, episode.reset_kwargs, episode.actions)
            totals = {tuple(o["total"] for o in e.observations[4:]) for e in group}
            assert len(totals) > 1  # the branches went their own ways
        advantages = result.advantages()
        for start in (0, 4):
            assert abs(sum(advantages[start : start + 4])) < 1e-6  # centred within each branch group
        assert result.episodes[0].to_json()["branched_at"] == 3


def test_a_group_that_ends_before_the_branch_point_says_so() -> None:
    with serve(dice_app()) as server:
        result = rollout(server.base_url, policy, [{"seed": 1}], group_size=3, branch_at=5, max_steps=2)
        trunk, *others = result.episodes
        assert trunk.ok and trunk.truncated and trunk.step == 2
        assert all("before branch_at=5: nothing to branch from" in e.error for e in others)


def test_branch_at_is_checked() -> None:
    with pytest.raises(ValueError, match="branch_at"):
        rollout("http://127.0.0.1:9", policy, 1, branch_at=-1)


def test_the_branching_grpo_example_learns(tmp_path: Any) -> None:
    """examples/grpo_branching.py, shortened: greedy play improves after training on branched groups."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "grpo_branching.py"
    spec = importlib.util.spec_from_file_location("grpo_branching", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    figures = example.main(["--iterations", "25", "--out", str(tmp_path / "out.json")])
    assert figures["greedy_return_after"] > figures["greedy_return_before"] + 0.5
    assert json.loads((tmp_path / "out.json").read_text()) == figures
