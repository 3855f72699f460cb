"""Maze served in a real sandbox (SandboxProvider) and driven through MazeEnv."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest
from maze_env import MazeAction, MazeEnv, MazeObservation
from maze_env.server.maze_environment import (
    EXIT_REWARD,
    INVALID_REWARD,
    MOVE_REWARD,
    REVISIT_REWARD,
    MazeEnvironment,
)

from openenv.core.client_errors import ActionValidationError, EnvironmentExecutionError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.generic_client import GenericEnvClient

PACKAGE = Path(__file__).resolve().parents[1]
STEPS = ((0, -1), (0, 1), (-1, 0), (1, 0))  # (dcol, drow) of actions 0 up, 1 down, 2 left, 3 right

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed Maze server for the whole module."""
    provider = SandboxProvider(str(PACKAGE))
    base_url = provider.start()
    try:
        provider.wait_for_ready(60)
        yield base_url
    finally:
        provider.stop()


def _open(maze: List[List[int]], col: int, row: int) -> bool:
    return 0 <= row < len(maze) and 0 <= col < len(maze[0]) and maze[row][col] == 0


def _shortest_path(maze: List[List[int]], start: Tuple[int, int], goal: Tuple[int, int]) -> Optional[List[int]]:
    came = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            moves = []
            while came[cell] is not None:
                cell, move = came[cell]
                moves.append(move)
            return moves[::-1]
        for move, (dc, dr) in enumerate(STEPS):
            nxt = (cell[0] + dc, cell[1] + dr)
            if _open(maze, *nxt) and nxt not in came:
                came[nxt] = (cell, move)
                queue.append(nxt)
    return None


@pytest.mark.asyncio
async def test_reset_starts_top_left_in_a_drawn_maze(url: str) -> None:
    async with MazeEnv(base_url=url) as env:
        result = await env.reset(seed=1, size=9, episode_id="maze-1")
        state = await env.state()
    obs = result.observation
    maze = result.metadata["maze"]
    assert obs.current_position == [0, 0] and result.metadata["exit_cell"] == [8, 8]
    assert result.reward == 0.0 and not result.done and obs.status == "playing"
    assert len(obs.grid) == 9 and obs.grid[0][0] == 3 and obs.grid[8][8] == 2
    assert obs.text.splitlines()[0][0] == "A" and obs.text.splitlines()[8][8] == "E"
    assert obs.legal_actions == [m for m, (dc, dr) in enumerate(STEPS) if _open(maze, dc, dr)]
    assert state.episode_id == "maze-1" and state.step_count == 0 and state.size == 9
    assert state.min_reward == pytest.approx(-40.5)


@pytest.mark.asyncio
async def test_generated_mazes_are_perfect_and_lead_to_the_exit(url: str) -> None:
    async with MazeEnv(base_url=url) as env:
        for seed, size in ((0, 5), (1, 9), (2, 15)):
            maze = (await env.reset(seed=seed, size=size)).metadata["maze"]
            cells = (size + 1) // 2
            open_cells = [(c, r) for r in range(size) for c in range(size) if maze[r][c] == 0]
            # a spanning tree over the cells on even coordinates: cells² rooms and cells² - 1 passages
            assert len(open_cells) == cells * cells + cells * cells - 1
            assert all(_shortest_path(maze, (0, 0), cell) is not None for cell in open_cells)


@pytest.mark.asyncio
async def test_walking_to_the_exit_costs_each_move_and_pays_ten(url: str) -> None:
    async with MazeEnv(base_url=url) as env:
        first = await env.reset(seed=4, size=7)
        moves = _shortest_path(first.metadata["maze"], (0, 0), (6, 6))
        results = [await env.step(MazeAction(action=m)) for m in moves]
        state = await env.state()
    assert [r.reward for r in results] == [MOVE_REWARD] * (len(moves) - 1) + [EXIT_REWARD]
    assert results[-1].done and results[-1].observation.status == "win" and results[-1].observation.legal_actions == []
    assert results[-1].metadata["status"] == "win" and results[-1].metadata["step"] == len(moves)
    assert state.done and state.status == "win" and state.current_position == [6, 6]
    assert state.total_reward == pytest.approx(EXIT_REWARD + MOVE_REWARD * (len(moves) - 1))


@pytest.mark.asyncio
async def test_going_back_costs_the_revisit_penalty(url: str) -> None:
    async with MazeEnv(base_url=url) as env:
        first = await env.reset(seed=2, size=5)
        there = first.observation.legal_actions[0]
        back = {0: 1, 1: 0, 2: 3, 3: 2}[there]
        out = await env.step(MazeAction(action=there))
        returned = await env.step(MazeAction(action=back))
    assert out.reward == MOVE_REWARD and returned.reward == REVISIT_REWARD
    assert returned.observation.current_position == [0, 0]
    assert returned.observation.previous_position == out.observation.current_position


@pytest.mark.asyncio
async def test_a_move_into_a_wall_is_refused_with_feedback_and_a_penalty(url: str) -> None:
    async with MazeEnv(base_url=url) as env:
        first = await env.reset(seed=3, size=5)
        blocked = next(m for m in range(4) if m not in first.observation.legal_actions)
        result = await env.step(MazeAction(action=blocked))
    assert result.reward == INVALID_REWARD and not result.done
    assert result.observation.current_position == [0, 0]
    assert "cannot move" in result.observation.error
    assert ("wall" in result.observation.error) or ("edge" in result.observation.error)


@pytest.mark.asyncio
async def test_unknown_moves_get_an_error_observation_and_words_work_as_moves(url: str) -> None:
    async with MazeEnv(base_url=url) as env:
        first = await env.reset(seed=6, size=5)
        unknown = [await env.step(MazeAction(action=a)) for a in ("fly", 7, -1)]
        word = ("up", "down", "left", "right")[first.observation.legal_actions[0]]
        moved = await env.step(MazeAction(action=word.upper()))
    for result in unknown:
        assert "unknown action" in result.observation.error and result.reward == INVALID_REWARD
        assert result.observation.current_position == [0, 0]
    assert moved.observation.error is None and moved.observation.current_position != [0, 0]


@pytest.mark.asyncio
async def test_falling_below_the_reward_floor_loses_the_game(url: str) -> None:
    async with MazeEnv(base_url=url) as env:
        first = await env.reset(seed=0, size=3)  # floor -4.5
        blocked = next(m for m in range(4) if m not in first.observation.legal_actions)
        results = [await env.step(MazeAction(action=blocked)) for _ in range(7)]
        after = await env.step(MazeAction(action=blocked))
    assert [r.done for r in results] == [False] * 6 + [True]
    assert results[-1].observation.status == "lose" and "lose" in results[-1].observation.message
    assert after.reward == 0.0 and "reset" in after.observation.error


@pytest.mark.asyncio
async def test_malformed_actions_and_sizes_get_error_frames_and_the_session_goes_on(url: str) -> None:
    async with GenericEnvClient(base_url=url) as env:
        first = await env.reset(seed=0, size=5)
        for bad in ({"action": [1]}, {"action": 1, "speed": 2}, {}, {"action": None}, {"action": True}):
            with pytest.raises(ActionValidationError):
                await env.step(bad)
        for size in (4, 1, 99):
            with pytest.raises(EnvironmentExecutionError, match="size must be odd"):
                await env.reset(size=size)
        after = await env.step({"action": first.observation["legal_actions"][0]})
    assert after.observation["error"] is None and after.observation["current_position"] != [0, 0]


@pytest.mark.asyncio
async def test_the_same_seed_replays_the_same_episode(url: str) -> None:
    async def play(seed: int, size: int = 7) -> List[MazeObservation]:
        rng = random.Random(99)
        async with MazeEnv(base_url=url) as env:
            result = await env.reset(seed=seed, size=size)
            seen = [result.observation]
            for _ in range(25):
                result = await env.step(MazeAction(action=rng.choice(result.observation.legal_actions)))
                seen.append(result.observation)
                if result.done:
                    break
            return seen

    first, again = await play(77), await play(77)
    assert first == again
    assert len({(await play(seed))[0].text for seed in range(4)}) > 1
    assert len((await play(77, size=11))[0].grid) == 11


@pytest.mark.asyncio
async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with MazeEnv(base_url=url) as one, MazeEnv(base_url=url) as two:
        firsts = await asyncio.gather(one.reset(seed=1, size=5), two.reset(seed=2, size=7))
        before = await two.state()
        await one.step(MazeAction(action=firsts[0].observation.legal_actions[0]))
        after = await two.state()
        await asyncio.gather(
            one.step(MazeAction(action="fly")), two.step(MazeAction(action=firsts[1].observation.legal_actions[0]))
        )
        states = await asyncio.gather(one.state(), two.state())
    assert before == after
    assert [s.size for s in states] == [5, 7] and [s.step_count for s in states] == [2, 1]
    assert states[0].total_reward == pytest.approx(MOVE_REWARD + INVALID_REWARD)
    assert states[1].total_reward == pytest.approx(MOVE_REWARD)


@pytest.mark.asyncio
async def test_a_random_agent_plays_a_hundred_episodes(url: str) -> None:
    rng = random.Random(0)
    outcomes: dict = {}
    steps = 0
    started = time.perf_counter()
    async with MazeEnv(base_url=url) as env:
        for episode in range(100):
            result = await env.reset(seed=episode, size=7)
            total = 0.0
            while not result.done:
                result = await env.step(MazeAction(action=rng.choice(result.observation.legal_actions)))
                assert result.observation.error is None
                total += result.reward
                steps += 1
            assert result.observation.total_reward == pytest.approx(total)
            outcomes[result.observation.status] = outcomes.get(result.observation.status, 0) + 1
    elapsed = time.perf_counter() - started
    print(
        f"\nmaze_env random agent: 100 episodes (7x7), {steps} steps in {elapsed:.2f} s = "
        f"{100 / elapsed:.1f} episodes/s, {steps / elapsed:.0f} steps/s; outcomes {outcomes}"
    )
    assert sum(outcomes.values()) == 100 and set(outcomes) <= {"win", "lose"}


def test_the_readme_example_runs_as_written() -> None:
    readme = (PACKAGE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("A") and len(lines[0]) == 7 and lines[6].endswith("E")
    assert re.search(r"status: (win|lose) steps: \d+$", lines[-1])


def test_the_environment_runs_in_process_too() -> None:
    env = MazeEnvironment()
    first = env.reset(seed=5, size=5)
    moves = _shortest_path(first.metadata["maze"], (0, 0), (4, 4))
    last = [env.step(MazeAction(action=m)) for m in moves][-1]
    assert last.done and last.reward == EXIT_REWARD and env.state.step_count == len(moves)
