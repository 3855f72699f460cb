"""The classic-control environments served in a real sandbox (SandboxProvider) and driven
through GymnasiumEnv, raw and as gymnasium.Env (to_gymnasium, make_vector_env)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium_env import GymnasiumAction, GymnasiumEnv
from gymnasium_env.server.gymnasium_environment import ClassicControlEnvironment

from openenv.core.client_errors import EnvironmentExecutionError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.gymnasium import CLASSIC_CONTROL, make_vector_env, to_gymnasium

PACKAGE = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed server for the whole module."""
    provider = SandboxProvider(str(PACKAGE))
    base_url = provider.start()
    try:
        provider.wait_for_ready(60)
        yield base_url
    finally:
        provider.stop()


@pytest.mark.asyncio
async def test_reset_serves_cartpole_by_default_and_describes_its_spaces(url: str) -> None:
    async with GymnasiumEnv(base_url=url) as env:
        result = await env.reset(seed=5)
        state = await env.state()
    expected, _ = gymnasium.make("CartPole-v1").reset(seed=5)
    obs = result.observation
    assert obs.env_id == "CartPole-v1" and obs.action_space == {"type": "Discrete", "n": 2, "start": 0}
    assert obs.observation_space["type"] == "Box" and obs.observation_space["high"][1] == "inf"
    assert np.array_equal(np.asarray(obs.observation, np.float32), expected)
    assert state.env_id == "CartPole-v1" and state.seed == 5 and state.step_count == 0


@pytest.mark.parametrize("env_id", CLASSIC_CONTROL)
def test_every_classic_control_environment_replays_local_gymnasium(url: str, env_id: str) -> None:
    with to_gymnasium(GymnasiumEnv(base_url=url), env_id=env_id) as remote:
        local = gymnasium.make(env_id)
        assert remote.observation_space == local.observation_space and remote.action_space == local.action_space
        remote.action_space.seed(1)
        pairs = [(remote.reset(seed=9), local.reset(seed=9))]
        for _ in range(40):
            action = remote.action_space.sample()
            pairs.append((remote.step(action), local.step(action)))
    for got, expected in pairs:
        assert data_equivalence(got[0], expected[0], exact=True)
        if len(got) == 5:
            assert got[1] == expected[1] and got[2:4] == (bool(expected[2]), bool(expected[3]))


def test_a_served_cartpole_passes_check_env_and_matches_200_seeded_steps(url: str) -> None:
    with to_gymnasium(GymnasiumEnv(base_url=url).sync(), env_id="CartPole-v1") as remote:
        check_env(remote)
        local = gymnasium.make("CartPole-v1")
        remote.action_space.seed(0)
        got, expected = remote.reset(seed=2024), local.reset(seed=2024)
        assert data_equivalence(got[0], expected[0], exact=True)
        for _ in range(200):
            action = remote.action_space.sample()
            got, expected = remote.step(action), local.step(action)
            assert data_equivalence(got[0], expected[0], exact=True) and got[1:4] == expected[1:4]
            if got[2] or got[3]:
                assert data_equivalence(remote.reset()[0], local.reset()[0], exact=True)


@pytest.mark.asyncio
async def test_a_bad_action_or_env_id_gets_an_error_frame_and_the_session_goes_on(url: str) -> None:
    async with GymnasiumEnv(base_url=url) as env:
        await env.reset(seed=0)
        with pytest.raises(EnvironmentExecutionError, match=r"not in the action space Discrete\(2\)"):
            await env.step(GymnasiumAction(action=7))
        with pytest.raises(EnvironmentExecutionError, match="'LunarLander-v3' is not served here"):
            await env.reset(env_id="LunarLander-v3")
        with pytest.raises(EnvironmentExecutionError, match="render_mode not allowed"):
            await env.reset(render_mode="rgb_array")
        after = await env.step(GymnasiumAction(action=1))
    assert after.observation.terminated is False and after.reward == 1.0


@pytest.mark.asyncio
async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with GymnasiumEnv(base_url=url) as one, GymnasiumEnv(base_url=url) as two:
        await asyncio.gather(one.reset(seed=1), two.reset(seed=1, env_id="Pendulum-v1"))
        before = await two.state()
        await one.step(GymnasiumAction(action=0))
        after = await two.state()
        states = await asyncio.gather(one.state(), two.state())
    assert before == after and [s.env_id for s in states] == ["CartPole-v1", "Pendulum-v1"]
    assert [s.step_count for s in states] == [1, 0]


def test_make_vector_env_serves_the_package_by_name_in_the_sandbox_and_stops_it() -> None:
    envs = make_vector_env("gymnasium_env", env_id="CartPole-v1", num_envs=4)
    provider = envs._owned[0]._provider  # the sandbox the vector env started (private: checked to be gone)
    try:
        assert provider.base_url is not None
        observations, _ = envs.reset(seed=0)
        assert observations.shape == (4, 4)
        ended = 0
        for _ in range(60):
            *_, terminated, truncated, _ = envs.step(envs.action_space.sample())
            ended += int((terminated | truncated).sum())
        assert ended > 0
    finally:
        envs.close()
    assert provider.base_url is None


@pytest.mark.asyncio
async def test_a_random_agent_plays_a_hundred_episodes(url: str) -> None:
    rng = np.random.default_rng(0)
    steps = 0
    started = time.perf_counter()
    async with GymnasiumEnv(base_url=url) as env:
        for episode in range(100):
            result = await env.reset(seed=episode)
            while not result.done:
                result = await env.step(GymnasiumAction(action=int(rng.integers(2))))
                steps += 1
            state = await env.state()
            assert state.total_reward == state.step_count  # CartPole pays 1 per step
    elapsed = time.perf_counter() - started
    print(
        f"\ngymnasium_env random agent: 100 CartPole episodes, {steps} steps in {elapsed:.2f} s = "
        f"{100 / elapsed:.1f} episodes/s, {steps / elapsed:.0f} steps/s"
    )
    assert steps > 100 * 8  # a random CartPole episode lasts about 20 steps


def test_the_readme_example_runs_as_written() -> None:
    readme = (PACKAGE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Box(") and lines[-1].startswith("total reward:")


def test_openenv_validate_passes_without_warnings() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "validate", str(PACKAGE), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["passed"] is True
    not_passed = {c["id"]: c["status"] for c in report["checks"] if c["status"] != "passed"}
    assert not_passed == {"mcp.tools": "skipped"}  # not an MCP environment


def test_the_environment_runs_in_process_too() -> None:
    env = ClassicControlEnvironment()
    first = env.reset(seed=3, env_id="MountainCar-v0", max_episode_steps=2)
    assert first.env_id == "MountainCar-v0" and first.action_space["n"] == 3
    steps = [env.step(GymnasiumAction(action=2)) for _ in range(2)]
    assert [s.truncated for s in steps] == [False, True] and steps[-1].reward == -1.0
    assert env.state.total_reward == -2.0
    env.close()
