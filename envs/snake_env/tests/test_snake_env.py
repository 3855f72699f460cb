"""Snake served in a real sandbox (SandboxProvider) and driven through SnakeEnv."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest
from snake_env import SnakeAction, SnakeEnv, SnakeObservation
from snake_env.server.snake_environment import SnakeEnvironment

from openenv.core.client_errors import ActionValidationError, EnvironmentExecutionError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.generic_client import GenericEnvClient

PACKAGE = Path(__file__).resolve().parents[1]
VECTORS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed Snake server for the whole module."""
    provider = SandboxProvider(str(PACKAGE))
    base_url = provider.start()
    try:
        provider.wait_for_ready(60)
        yield base_url
    finally:
        provider.stop()


def _cells(obs: SnakeObservation, code: int) -> List[tuple]:
    return [(r, c) for r, row in enumerate(obs.grid) for c, cell in enumerate(row) if cell == code]


def _toward_fruit(obs: SnakeObservation) -> Optional[str]:
    """A greedy move toward the fruit that neither reverses nor hits anything (None: no such move)."""
    (head,) = _cells(obs, 3)
    fruit = _cells(obs, 1)[0]
    height, width = len(obs.grid), len(obs.grid[0])
    options = []
    for name, (dr, dc) in VECTORS.items():
        r, c = head[0] + dr, head[1] + dc
        if name == OPPOSITE[obs.direction] or not (0 <= r < height and 0 <= c < width) or obs.grid[r][c] == 2:
            continue
        options.append((abs(r - fruit[0]) + abs(c - fruit[1]), name))
    return min(options)[1] if options else None


@pytest.mark.asyncio
async def test_reset_puts_a_three_long_snake_in_the_middle_and_one_fruit(url: str) -> None:
    async with SnakeEnv(base_url=url) as env:
        result = await env.reset(seed=1, episode_id="snake-1")
        state = await env.state()
    obs = result.observation
    assert len(obs.grid) == 20 and all(len(row) == 20 for row in obs.grid)
    assert _cells(obs, 3) == [(10, 10)] and _cells(obs, 2) == [(10, 8), (10, 9)] and len(_cells(obs, 1)) == 1
    assert obs.direction == "right" and obs.alive and not result.done and result.reward == 0.0
    assert (obs.episode_score, obs.episode_steps, obs.episode_fruits, obs.episode_kills) == (0.0, 0, 0, 0)
    channels = [[cell.index(1.0) + 1 if 1.0 in cell else 0 for cell in row] for row in obs.observation]
    assert channels == obs.grid  # one-hot channels fruit, body, head match the codes 1, 2, 3
    assert obs.text.splitlines()[10][8:11] == "oo@"
    assert state.episode_id == "snake-1" and state.snake == [[10, 10], [10, 9], [10, 8]]
    assert state.fruit == list(_cells(obs, 1)[0]) and state.status == "playing"


@pytest.mark.asyncio
async def test_eating_fruit_pays_grows_the_snake_and_places_new_fruit(url: str) -> None:
    async with SnakeEnv(base_url=url) as env:
        result = await env.reset(seed=8, height=10, width=10)
        eaten: list = []
        while len(eaten) < 3 and not result.done:
            before = result.observation
            result = await env.step(SnakeAction(action=_toward_fruit(before)))
            if result.observation.episode_fruits > before.episode_fruits:
                eaten.append((before, result))
        state = await env.state()
    assert len(eaten) == 3
    for before, after in eaten:
        assert after.reward == 1.0
        assert len(_cells(after.observation, 2)) == len(_cells(before, 2)) + 1
        assert _cells(after.observation, 3) == _cells(before, 1)  # the head is where the fruit was
        assert len(_cells(after.observation, 1)) == 1  # and a new fruit is out
    assert state.fruits == 3 and len(state.snake) == 6 and state.score == pytest.approx(3.0)


@pytest.mark.asyncio
async def test_running_into_the_edge_kills_the_snake(url: str) -> None:
    async with SnakeEnv(base_url=url) as env:
        await env.reset(seed=2, height=8, width=8)
        results = [await env.step(SnakeAction(action=0)) for _ in range(4)]  # head at column 4, going right
        state = await env.state()
        after = await env.step(SnakeAction(action=0))
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].reward == -1.0 and not results[-1].observation.alive
    assert "the edge" in results[-1].observation.message
    assert state.status == "dead" and not state.alive
    assert after.reward == 0.0 and "reset" in after.observation.error


@pytest.mark.asyncio
async def test_biting_its_own_body_kills_the_snake(url: str) -> None:
    async with SnakeEnv(base_url=url) as env:
        await env.reset(seed=0, snake_length=5)
        results = [await env.step(SnakeAction(action=2)) for _ in range(3)]  # right, right, right: a U-turn
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].reward == -1.0 and "its own body" in results[-1].observation.message


@pytest.mark.asyncio
async def test_the_human_observer_takes_absolute_directions(url: str) -> None:
    async with SnakeEnv(base_url=url) as env:
        await env.reset(seed=0, observer="human")
        down = await env.step(SnakeAction(action=3))
        left = await env.step(SnakeAction(action=1))
        reverse = await env.step(SnakeAction(action=2))
        up = await env.step(SnakeAction(action="UP"))
    assert [r.observation.direction for r in (down, left, reverse, up)] == ["down", "left", "left", "up"]
    assert _cells(down.observation, 3) == [(11, 10)] and _cells(left.observation, 3) == [(11, 9)]
    assert "cannot reverse" in reverse.observation.error and _cells(reverse.observation, 3) == [(11, 8)]
    assert up.observation.error is None


@pytest.mark.asyncio
async def test_unknown_actions_get_an_error_observation_and_the_snake_goes_straight_on(url: str) -> None:
    async with SnakeEnv(base_url=url) as env:
        await env.reset(seed=0)
        results = [await env.step(SnakeAction(action=a)) for a in ("fly", 9, "left", -1)]
        fine = await env.step(SnakeAction(action="turn_left"))
    for result in results:
        assert result.observation.error and result.observation.direction == "right" and not result.done
    assert "unknown action 'fly'" in results[0].observation.error
    assert "cannot reverse" in results[2].observation.error
    assert [r.observation.episode_steps for r in results] == [1, 2, 3, 4]
    assert _cells(results[-1].observation, 3) == [(10, 14)]
    assert fine.observation.error is None and fine.observation.direction == "up"


@pytest.mark.asyncio
async def test_malformed_actions_and_options_get_error_frames_and_the_session_goes_on(url: str) -> None:
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(seed=0)
        for bad in (
            {"action": [1]},
            {"action": 1.5},
            {"action": True},
            {"action": None},
            {"action": 0, "speed": 2},
            {},
        ):
            with pytest.raises(ActionValidationError):
                await env.step(bad)
        for options, match in (
            ({"height": 2}, "between"),
            ({"observer": "robot"}, "observer"),
            ({"snake_length": 50}, "snake_length"),
            ({"reward_dict": {"bonus": 1}}, "reward_dict"),
        ):
            with pytest.raises(EnvironmentExecutionError, match=match):
                await env.reset(**options)
        after = await env.step({"action": 0})
    assert after.observation["error"] is None and after.observation["episode_steps"] == 1


@pytest.mark.asyncio
async def test_reward_dict_and_max_episode_steps_apply_to_the_episode(url: str) -> None:
    async with SnakeEnv(base_url=url) as env:
        await env.reset(seed=0, max_episode_steps=3, reward_dict={"time": 0.5})
        results = [await env.step(SnakeAction(action=0)) for _ in range(3)]
        state = await env.state()
    assert [r.reward for r in results] == [0.5, 0.5, 0.5]  # no fruit on the way for seed 0
    assert [r.done for r in results] == [False, False, True] and results[-1].observation.alive
    assert state.status == "truncated" and "Time is up" in results[-1].observation.message


@pytest.mark.asyncio
async def test_following_a_hamiltonian_cycle_fills_the_board_and_wins(url: str) -> None:
    cycle = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 3), (1, 2), (1, 1), (2, 1)]
    cycle += [(2, 2), (2, 3), (3, 3), (3, 2), (3, 1), (3, 0), (2, 0), (1, 0)]
    following = {cell: cycle[(i + 1) % len(cycle)] for i, cell in enumerate(cycle)}
    names = {vector: name for name, vector in VECTORS.items()}
    async with SnakeEnv(base_url=url) as env:
        result = await env.reset(seed=4, height=4, width=4, snake_length=1)
        while not result.done:
            (head,) = _cells(result.observation, 3)
            nxt = following[head]
            result = await env.step(SnakeAction(action=names[(nxt[0] - head[0], nxt[1] - head[1])]))
        state = await env.state()
    assert state.status == "won" and len(state.snake) == 16 and state.fruit is None
    assert result.reward == 101.0 and result.observation.episode_fruits == 15


@pytest.mark.asyncio
async def test_the_same_seed_replays_the_same_game(url: str) -> None:
    async def play(seed: int) -> List[SnakeObservation]:
        async with SnakeEnv(base_url=url) as env:
            result = await env.reset(seed=seed, height=8, width=8)
            seen = [result.observation]
            for _ in range(40):
                move = _toward_fruit(result.observation)
                if move is None:
                    break
                result = await env.step(SnakeAction(action=move))
                seen.append(result.observation)
                if result.done:
                    break
            return seen

    first, again = await play(21), await play(21)
    assert first == again and first[-1].episode_fruits >= 2  # later fruit come from the seed too
    assert len({_cells((await play(seed))[0], 1)[0] for seed in range(5)}) > 1


@pytest.mark.asyncio
async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with SnakeEnv(base_url=url) as one, SnakeEnv(base_url=url) as two:
        await asyncio.gather(one.reset(seed=1), two.reset(seed=2, height=8, width=8))
        before = await two.state()
        await one.step(SnakeAction(action=1))
        after = await two.state()
        await asyncio.gather(one.step(SnakeAction(action=0)), two.step(SnakeAction(action=2)))
        states = await asyncio.gather(one.state(), two.state())
    assert before == after
    assert [s.direction for s in states] == ["up", "down"] and [s.step_count for s in states] == [2, 1]
    assert [(s.height, s.width) for s in states] == [(20, 20), (8, 8)]


@pytest.mark.asyncio
async def test_a_random_agent_plays_a_hundred_episodes(url: str) -> None:
    rng = random.Random(0)
    outcomes: dict = {}
    steps = fruits = 0
    started = time.perf_counter()
    async with SnakeEnv(base_url=url) as env:
        for episode in range(100):
            result = await env.reset(seed=episode)
            total = 0.0
            while not result.done:
                result = await env.step(SnakeAction(action=rng.randrange(3)))
                assert result.observation.error is None
                total += result.reward
                steps += 1
            assert result.observation.episode_score == pytest.approx(total)
            fruits += result.observation.episode_fruits
            state = await env.state()
            outcomes[state.status] = outcomes.get(state.status, 0) + 1
    elapsed = time.perf_counter() - started
    print(
        f"\nsnake_env random agent: 100 episodes (20x20), {steps} steps in {elapsed:.2f} s = "
        f"{100 / elapsed:.1f} episodes/s, {steps / elapsed:.0f} steps/s; outcomes {outcomes}, {fruits} fruit"
    )
    assert sum(outcomes.values()) == 100 and set(outcomes) <= {"dead", "won", "truncated"}


def test_the_readme_example_runs_as_written() -> None:
    readme = (PACKAGE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines[0]) == 10 and "@" in "".join(lines[:10])
    assert re.fullmatch(r"score -?\d+\.\d+ after \d+ steps, \d+ fruit", lines[-1])


def test_the_environment_runs_in_process_too() -> None:
    env = SnakeEnvironment(height=6, width=6)
    env.reset(seed=0)
    results = [env.step(SnakeAction(action=0)) for _ in range(3)]
    assert results[-1].done and results[-1].reward == -1.0 and env.state.step_count == 3
