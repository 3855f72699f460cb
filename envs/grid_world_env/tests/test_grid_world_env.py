"""Grid World served in a real sandbox (SandboxProvider) and driven through GridWorldEnv."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Iterator, List, Optional

import pytest
from grid_world_env import GridWorldAction, GridWorldEnv, GridWorldObservation, MoveAction
from grid_world_env.server.grid_world_environment import GOAL_REWARD, PIT_REWARD, STEP_REWARD, GridWorldEnvironment

from openenv.core.client_errors import ActionValidationError, EnvironmentExecutionError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.generic_client import GenericEnvClient

PACKAGE = Path(__file__).resolve().parents[1]
MOVES = {"UP": (-1, 0), "DOWN": (1, 0), "LEFT": (0, -1), "RIGHT": (0, 1)}

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed Grid World server for the whole module."""
    provider = SandboxProvider(str(PACKAGE))
    base_url = provider.start()
    try:
        provider.wait_for_ready(60)
        yield base_url
    finally:
        provider.stop()


def _path(obs: GridWorldObservation, targets: set, avoid: set) -> Optional[List[str]]:
    """Moves from the agent to the first reached cell of ``targets``, stepping only on free cells."""
    size = len(obs.grid)
    start = (obs.x, obs.y)
    came = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell in targets:
            moves = []
            while came[cell] is not None:
                cell, move = came[cell]
                moves.append(move)
            return moves[::-1]
        if cell != start and cell in avoid:
            continue
        for name, (dx, dy) in MOVES.items():
            nxt = (cell[0] + dx, cell[1] + dy)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in came and obs.grid[nxt[0]][nxt[1]] != 1:
                came[nxt] = (cell, name)
                queue.append(nxt)
    return None


def _cells(obs: GridWorldObservation, code: int) -> set:
    return {(x, y) for x, row in enumerate(obs.grid) for y, cell in enumerate(row) if cell == code}


@pytest.mark.asyncio
async def test_reset_puts_the_agent_top_left_on_a_drawn_board(url: str) -> None:
    async with GridWorldEnv(base_url=url) as env:
        result = await env.reset(seed=3, episode_id="ep-1")
        state = await env.state()
    obs = result.observation
    assert (obs.x, obs.y) == (0, 0) and obs.goal == [4, 4]
    assert result.reward == 0.0 and result.done is False and obs.error is None
    assert len(obs.grid) == 5 and all(len(row) == 5 for row in obs.grid)
    assert obs.grid[0][0] == 4 and obs.grid[4][4] == 3
    assert obs.text.splitlines()[0][0] == "A" and obs.text.splitlines()[4][4] == "G"
    assert len(_cells(obs, 1)) == 3 and len(_cells(obs, 2)) == 2  # the default 25//8 walls, 25//12 pits
    assert state.episode_id == "ep-1" and state.step_count == 0 and state.status == "playing"
    assert sorted(map(tuple, state.walls)) == sorted(_cells(obs, 1))


@pytest.mark.asyncio
async def test_walking_to_the_goal_costs_each_step_and_pays_at_the_end(url: str) -> None:
    async with GridWorldEnv(base_url=url) as env:
        obs = (await env.reset(seed=11)).observation
        moves = _path(obs, targets={(4, 4)}, avoid=_cells(obs, 2))
        assert moves, "the board must leave a path to the goal"
        rewards = [(await env.step(GridWorldAction(action=m))).reward for m in moves]
        state = await env.state()
        after = await env.step(GridWorldAction(action="UP"))
    assert rewards == [pytest.approx(STEP_REWARD)] * (len(moves) - 1) + [GOAL_REWARD]
    assert state.status == "won" and state.done and state.step_count == len(moves)
    assert state.total_reward == pytest.approx(GOAL_REWARD + STEP_REWARD * (len(moves) - 1))
    assert after.done and after.reward == 0.0 and "reset" in after.observation.error


@pytest.mark.asyncio
async def test_a_pit_ends_the_episode_with_a_penalty(url: str) -> None:
    async with GridWorldEnv(base_url=url) as env:
        obs = (await env.reset(seed=5, size=4, num_walls=0, num_pits=3)).observation
        pits = _cells(obs, 2)
        moves = _path(obs, targets=pits, avoid=pits)
        assert moves
        results = [await env.step(GridWorldAction(action=m)) for m in moves]
        state = await env.state()
    assert [r.done for r in results] == [False] * (len(moves) - 1) + [True]
    assert results[-1].reward == PIT_REWARD and "pit" in results[-1].observation.message
    assert state.status == "fell"


@pytest.mark.asyncio
async def test_the_edge_and_walls_keep_the_agent_in_place(url: str) -> None:
    async with GridWorldEnv(base_url=url) as env:
        await env.reset(seed=0, size=3, num_walls=0, num_pits=0)
        up = await env.step(GridWorldAction(action=MoveAction.UP))
        left = await env.step(GridWorldAction(action="left"))
        walled = (await env.reset(seed=0, size=2, num_walls=1, num_pits=0)).observation
        (wall,) = _cells(walled, 1)
        direction = "RIGHT" if wall == (0, 1) else "DOWN"
        bump = await env.step(GridWorldAction(action=direction))
    for result in (up, left):
        assert (result.observation.x, result.observation.y) == (0, 0)
        assert result.reward == pytest.approx(STEP_REWARD) and not result.done
    assert "leave the grid" in up.observation.message
    assert (bump.observation.x, bump.observation.y) == (0, 0) and "wall" in bump.observation.message


@pytest.mark.asyncio
async def test_running_out_of_moves_truncates_the_episode(url: str) -> None:
    async with GridWorldEnv(base_url=url) as env:
        first = await env.reset(seed=0, max_steps=3)
        results = [await env.step(GridWorldAction(action="UP")) for _ in range(3)]
        state = await env.state()
    assert first.observation.steps_left == 3
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].observation.truncated and results[-1].observation.steps_left == 0
    assert state.status == "truncated"


@pytest.mark.asyncio
async def test_the_same_seed_replays_the_same_episode(url: str) -> None:
    moves = ["RIGHT", "DOWN", "DOWN", "RIGHT", "UP", "DOWN", "RIGHT"]

    async def play(seed: int) -> list:
        async with GridWorldEnv(base_url=url) as env:
            seen = [(await env.reset(seed=seed, size=6)).observation]
            for move in moves:
                result = await env.step(GridWorldAction(action=move))
                seen.append(result.observation)
                if result.done:
                    break
            return seen

    first, again = await play(1234), await play(1234)
    assert first == again
    boards = {(await play(seed))[0].text for seed in range(5)}
    assert len(boards) > 1  # the seed, not a constant, picks the board


@pytest.mark.asyncio
async def test_an_unknown_direction_is_answered_with_an_error_observation(url: str) -> None:
    async with GridWorldEnv(base_url=url) as env:
        await env.reset(seed=0, size=3, num_walls=0, num_pits=0)
        bad = await env.step(GridWorldAction(action="JUMP"))
        good = await env.step(GridWorldAction(action="RIGHT"))
        state = await env.state()
    assert "unknown action 'JUMP'" in bad.observation.error
    assert bad.reward == pytest.approx(STEP_REWARD) and not bad.done
    assert (bad.observation.x, bad.observation.y) == (0, 0)
    assert good.observation.error is None and (good.observation.x, good.observation.y) == (0, 1)
    assert state.step_count == 2


@pytest.mark.asyncio
async def test_malformed_actions_and_reset_options_get_error_frames_and_the_session_goes_on(url: str) -> None:
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(seed=0, size=3, num_walls=0, num_pits=0)
        with pytest.raises(ActionValidationError):
            await env.step({"action": 5})
        with pytest.raises(ActionValidationError):
            await env.step({"action": "UP", "speed": 2})
        with pytest.raises(ActionValidationError):
            await env.step({})
        with pytest.raises(EnvironmentExecutionError, match="size must be between"):
            await env.reset(size=1000)
        with pytest.raises(EnvironmentExecutionError, match="do not fit"):
            await env.reset(size=3, num_walls=9)
        after = await env.step({"action": "DOWN"})
    assert after.observation["x"] == 1 and after.observation["y"] == 0


@pytest.mark.asyncio
async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with GridWorldEnv(base_url=url) as one, GridWorldEnv(base_url=url) as two:
        await asyncio.gather(
            one.reset(seed=1, size=3, num_walls=0, num_pits=0), two.reset(seed=2, size=3, num_walls=0, num_pits=0)
        )
        before = await two.state()
        await one.step(GridWorldAction(action="DOWN"))
        after = await two.state()
        moved_one, moved_two = await asyncio.gather(
            one.step(GridWorldAction(action="RIGHT")), two.step(GridWorldAction(action="DOWN"))
        )
        states = await asyncio.gather(one.state(), two.state())
    assert before == after
    assert (moved_one.observation.x, moved_one.observation.y) == (1, 1)
    assert (moved_two.observation.x, moved_two.observation.y) == (1, 0)
    assert [s.step_count for s in states] == [2, 1]
    assert states[0].episode_id != states[1].episode_id


@pytest.mark.asyncio
async def test_a_random_agent_plays_a_hundred_episodes(url: str) -> None:
    rng = random.Random(0)
    outcomes: dict = {}
    steps = 0
    started = time.perf_counter()
    async with GridWorldEnv(base_url=url) as env:
        for episode in range(100):
            result = await env.reset(seed=episode)
            rewards = []
            while not result.done:
                result = await env.step(GridWorldAction(action=rng.choice(list(MoveAction))))
                assert result.observation.error is None
                rewards.append(result.reward)
            state = await env.state()
            assert state.total_reward == pytest.approx(sum(rewards))
            outcomes[state.status] = outcomes.get(state.status, 0) + 1
            steps += len(rewards)
    elapsed = time.perf_counter() - started
    print(
        f"\ngrid_world_env random agent: 100 episodes, {steps} steps in {elapsed:.2f} s = "
        f"{100 / elapsed:.1f} episodes/s, {steps / elapsed:.0f} steps/s; outcomes {outcomes}"
    )
    assert sum(outcomes.values()) == 100 and set(outcomes) <= {"won", "fell", "truncated"}


def test_the_readme_example_runs_as_written() -> None:
    readme = (PACKAGE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("A") and len(lines[0]) == 5  # the board's first row
    assert "total reward:" in lines[-1]


def test_the_environment_runs_in_process_too() -> None:
    env = GridWorldEnvironment()
    first = env.reset(seed=9, size=3, num_walls=0, num_pits=0)
    assert first.text == "A..\n...\n..G"
    moves = [env.step(GridWorldAction(action=m)) for m in ("DOWN", "DOWN", "RIGHT", "RIGHT")]
    assert moves[-1].done and moves[-1].reward == GOAL_REWARD
    assert env.state.step_count == 4
