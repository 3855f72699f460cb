"""Gymnasium both ways: registered Gymnasium environments served by GymnasiumEnvironment, and
turned back into Gymnasium environments (to_gymnasium, make_vector_env) against a live server."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any, Iterator, List

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from openenv.core.client_errors import EnvironmentExecutionError, NotSupportedError
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.snapshot_data import decode, encode
from openenv.core.generic_client import GenericEnvClient
from openenv.gymnasium import (
    GymnasiumAction,
    GymnasiumClient,
    GymnasiumEnvironment,
    GymnasiumObservation,
    GymnasiumState,
    make_vector_env,
    to_gymnasium,
)
from openenv.gymnasium.spaces import describe, from_description, from_json, to_json

from .conftest import serve, until

DICT_ENV = "openenv-test/Rooms-v0"


class Rooms(gymnasium.Env):
    """A seeded toy with a Dict observation (Box, MultiBinary, Tuple) and a MultiDiscrete action."""

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-10.0, 10.0, (2,), np.float32),
                "doors": spaces.MultiBinary(3),
                "room": spaces.Tuple((spaces.Discrete(4), spaces.Discrete(3, start=1))),
            }
        )
        self.action_space = spaces.MultiDiscrete([3, 3])
        self._position = np.zeros(2, np.float32)
        self._steps = 0

    def _observation(self) -> dict:
        doors = (self.np_random.random(3) < 0.5).astype(np.int8)
        room = (int(self.np_random.integers(4)), int(self.np_random.integers(1, 4)))
        return {"position": self._position.copy(), "doors": doors, "room": room}

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self._position = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self._steps = 0
        return self._observation(), {"start": self._position.tolist()}

    def step(self, action: Any) -> Any:
        self._position = np.clip(self._position + (np.asarray(action) - 1) * 0.5, -10, 10).astype(np.float32)
        self._steps += 1
        reward = -float(np.abs(self._position).sum())
        return (
            self._observation(),
            reward,
            bool(np.abs(self._position).max() >= 10),
            self._steps >= 50,
            {"steps": self._steps},
        )


gymnasium.register(DICT_ENV, entry_point=Rooms)


class Served(GymnasiumEnvironment):
    ENV_IDS = ("CartPole-v1", "Pendulum-v1", DICT_ENV)


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app(
        Served,
        GymnasiumAction,
        GymnasiumObservation,
        env_name="gymnasium",
        max_concurrent_envs=32,
        state_cls=GymnasiumState,
    )


@pytest.fixture(scope="module")
def url(app: Any) -> Iterator[str]:
    with serve(app) as server:
        yield server.base_url


def replay(remote: gymnasium.Env, local: gymnasium.Env, seed: int, steps: int) -> int:
    """Step both with the same seeded random actions, resetting both when an episode ends;
    assert every value is equal (and of the same type). Returns the number of episodes ended."""
    remote.action_space.seed(seed)
    ended = 0
    pairs = [(remote.reset(seed=seed), local.reset(seed=seed))]
    for _ in range(steps):
        action = remote.action_space.sample()
        pair = (remote.step(action), local.step(action))
        pairs.append(pair)
        if pair[1][2] or pair[1][3]:
            ended += 1
            pairs.append((remote.reset(), local.reset()))
    for got, expected in pairs:
        assert data_equivalence(got[0], expected[0], exact=True), (got, expected)  # same values, dtypes, types
        if len(got) == 5:  # a step: a float reward (NumPy's float64 for some local ones), bool flags
            assert type(got[1]) is float and got[1] == expected[1]
            assert got[2:4] == (bool(expected[2]), bool(expected[3]))
        assert json.dumps(got[-1]) == json.dumps(expected[-1], default=lambda a: a.tolist())  # info, arrays as lists
    return ended


def checker_warnings(env: gymnasium.Env, **options: Any) -> List[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, **options)
    return sorted(str(w.message) for w in caught)


def test_a_served_cartpole_passes_check_env_with_the_warnings_of_a_local_one(url: str) -> None:
    env = to_gymnasium(GymnasiumClient(base_url=url).sync(), env_id="CartPole-v1")
    try:
        assert env.action_space == spaces.Discrete(2)
        assert env.observation_space == gymnasium.make("CartPole-v1").observation_space
        assert checker_warnings(env) == checker_warnings(
            gymnasium.make("CartPole-v1").unwrapped, skip_render_check=True
        )  # (pygame)
        assert len(checker_warnings(env)) == 2  # the infinite bounds of CartPole's observation space
    finally:
        env.close()


def test_the_spec_makes_another_session_of_the_same_server(app: Any, url: str) -> None:
    with to_gymnasium(url, env_id="CartPole-v1", max_episode_steps=2) as env:
        other = gymnasium.make(env.spec)
        assert app.state.openenv_server.active_sessions == 2
        other.reset(seed=0)
        assert [other.step(0)[3] for _ in range(2)] == [False, True]  # the same keywords
        other.close()
    assert _eventually_closed(app)


def test_a_served_cartpole_replays_local_gymnasium_step_for_step(url: str) -> None:
    with to_gymnasium(GymnasiumClient(base_url=url), env_id="CartPole-v1") as remote:  # an async client, wrapped
        ended = replay(remote, gymnasium.make("CartPole-v1"), seed=7, steps=200)
    assert ended >= 3  # random CartPole episodes last about 20 steps: resets were replayed too


def test_a_continuous_action_space_replays_too(url: str) -> None:
    with to_gymnasium(url, env_id="Pendulum-v1") as remote:
        assert isinstance(remote.action_space, spaces.Box) and remote.action_space.dtype == np.float32
        replay(remote, gymnasium.make("Pendulum-v1"), seed=3, steps=50)


def test_a_dict_observation_and_multidiscrete_action_cross_intact(url: str) -> None:
    with to_gymnasium(url, env_id=DICT_ENV) as remote:
        assert remote.observation_space == gymnasium.make(DICT_ENV).observation_space
        assert remote.action_space == spaces.MultiDiscrete([3, 3])
        assert checker_warnings(remote) == checker_warnings(gymnasium.make(DICT_ENV).unwrapped, skip_render_check=True)
        replay(remote, gymnasium.make(DICT_ENV), seed=11, steps=120)


def same(got: Any, expected: Any) -> bool:
    """Equal values; arrays also of the same dtype (a Discrete value may be an int or a NumPy int)."""
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and all(same(got[k], expected[k]) for k in expected)
    if isinstance(expected, tuple):
        return isinstance(got, tuple) and len(got) == len(expected) and all(map(same, got, expected))
    if isinstance(expected, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == expected.dtype and np.array_equal(got, expected)
    return bool(got == expected)


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-np.inf, np.inf, (3,), np.float32),
        spaces.Box(np.array([0, -1]), np.array([1, 5]), dtype=np.int64),
        spaces.Box(0.0, 1.0, (2, 3), np.float64),
        spaces.Discrete(5, start=-2),
        spaces.MultiDiscrete([[2, 3], [4, 5]]),
        spaces.MultiBinary([2, 2]),
        spaces.Text(8, min_length=2, charset="abc"),
        spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Tuple((spaces.Box(0, 1, (1,)), spaces.MultiBinary(4)))}),
    ],
    ids=str,
)
def test_spaces_and_their_values_round_trip_through_standard_json(space: spaces.Space) -> None:
    wire = json.dumps(describe(space), allow_nan=False)
    assert from_description(json.loads(wire)) == space
    space.seed(0)
    for _ in range(5):
        value = space.sample()
        back = from_json(space, json.loads(json.dumps(to_json(space, value), allow_nan=False)))
        assert back in space and same(back, value)


def test_non_finite_floats_travel_as_strings() -> None:
    box = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    value = np.array([np.inf, -np.inf, 1.5], np.float32)
    assert to_json(box, value) == ["inf", "-inf", 1.5]
    assert np.array_equal(from_json(box, ["inf", "-inf", 1.5]), value)


def test_metadata_describes_the_allowed_environments_and_their_spaces(url: str) -> None:
    import httpx

    with httpx.Client(base_url=url) as http:
        metadata = http.get("/metadata").json()
        schema = http.get("/schema").json()
    assert metadata["name"] == "gymnasium" and "CartPole-v1, Pendulum-v1" in metadata["description"]
    assert "max_episode_steps" in metadata["description"]
    section = metadata["readme_content"].split("## CartPole-v1")[1].split("```json\n")[1].split("\n```")[0]
    assert from_description(json.loads(section)["action_space"]) == spaces.Discrete(2)
    assert {"action_space", "observation_space", "terminated", "truncated"} <= set(schema["observation"]["properties"])


async def test_the_env_id_and_make_keywords_are_chosen_at_reset(url: str) -> None:
    async with GymnasiumClient(base_url=url) as client:
        first = await client.reset(seed=1)
        assert first.observation.env_id == "CartPole-v1"  # the server's default
        pendulum = await client.reset(seed=1, env_id="Pendulum-v1", max_episode_steps=3)
        assert pendulum.observation.action_space["type"] == "Box"
        results = [await client.step(GymnasiumAction(action=[0.5])) for _ in range(3)]
        state = await client.state()
    assert [r.observation.truncated for r in results] == [False, False, True] and results[-1].done
    assert state.env_id == "Pendulum-v1" and state.make_kwargs == {"max_episode_steps": 3} and state.step_count == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"env_id": "Blackjack-v1"}, "env_id 'Blackjack-v1' is not served here; allowed: CartPole-v1"),
        ({"env_id": "os:Env-v0"}, "env_id 'os:Env-v0' is not served here"),
        (
            {"env_id": "CartPole-v1", "render_mode": "human"},
            "keyword(s) render_mode not allowed; allowed: max_episode_steps",
        ),
        ({"env_id": "CartPole-v1", "max_episode_steps": {"a": 1}}, "must be a string, number, bool or null"),
    ],
)
async def test_env_ids_and_keywords_the_server_does_not_allow_are_refused(
    app: Any, url: str, options: dict, message: str
) -> None:
    async with GymnasiumClient(base_url=url) as client:
        with pytest.raises(EnvironmentExecutionError) as refused:
            await client.reset(**options)
        assert message in str(refused.value)
        after = await client.reset(seed=0)  # the same session goes on
    assert after.observation.env_id == "CartPole-v1"
    await until(lambda: app.state.openenv_server.active_sessions == 0)


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (2, "action 2 is not in the action space Discrete(2)"),
        ("left", "action 'left' is not an integer"),
        ([0, 1], "action [0, 1] is not an integer"),
    ],
)
async def test_a_bad_action_is_refused_and_the_session_goes_on(url: str, action: Any, message: str) -> None:
    async with GenericEnvClient(base_url=url) as client:
        await client.reset(seed=0, env_id="CartPole-v1")
        with pytest.raises(EnvironmentExecutionError) as refused:
            await client.step({"action": action})
        assert message in str(refused.value)
        after = await client.step({"action": 1})
        state = await client.state()
    assert after.observation["terminated"] is False and state["step_count"] == 1


async def test_step_before_reset_says_to_reset_first(url: str) -> None:
    async with GenericEnvClient(base_url=url) as client:
        with pytest.raises(EnvironmentExecutionError, match=r"call reset\(env_id=...\) before step"):
            await client.step({"action": 0})


def test_the_adapter_refuses_an_action_outside_the_space_before_sending_it(url: str) -> None:
    with to_gymnasium(url) as env:
        env.reset(seed=0)
        with pytest.raises(ValueError, match=r"action 3 is not in the action space Discrete\(2\)"):
            env.step(3)
        assert env.step(0)[2] is False


def test_a_vector_env_of_eight_sessions_autoresets_as_sync_vector_env_does(app: Any, url: str) -> None:
    remote = make_vector_env(url, env_id="CartPole-v1", num_envs=8)
    local = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1") for _ in range(8)])
    try:
        assert app.state.openenv_server.active_sessions == 8
        assert remote.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
        assert remote.action_space == local.action_space and remote.observation_space == local.observation_space
        got, expected = remote.reset(seed=42), local.reset(seed=42)
        assert np.array_equal(got[0], expected[0])
        remote.action_space.seed(0)
        ended = 0
        for _ in range(120):
            actions = remote.action_space.sample()
            got, expected = remote.step(actions), local.step(actions)
            for g, e in zip(got[:4], expected[:4], strict=True):
                assert g.dtype == e.dtype and np.array_equal(g, e)
            ended += int((expected[2] | expected[3]).sum())
        assert ended >= 16  # every sub-environment was reset on the way, by the next step
    finally:
        remote.close()
        local.close()
    assert _eventually_closed(app)


def _eventually_closed(app: Any) -> bool:
    import time

    deadline = time.monotonic() + 5
    while app.state.openenv_server.active_sessions and time.monotonic() < deadline:
        time.sleep(0.02)
    return app.state.openenv_server.active_sessions == 0


def test_a_vector_env_from_a_client_factory_with_a_dict_space(app: Any, url: str) -> None:
    with make_vector_env(lambda: GymnasiumClient(base_url=url), env_id=DICT_ENV, num_envs=3) as envs:
        observations, infos = envs.reset(seed=[1, 2, 3])
        assert observations["position"].shape == (3, 2) and infos["_start"].all()
        observations, rewards, *_, infos = envs.step(envs.action_space.sample())
        assert observations["room"][1].shape == (3,) and rewards.dtype == np.float64
        assert infos["steps"].tolist() == [1, 1, 1] and infos["_steps"].all()
    assert _eventually_closed(app)


def test_a_vector_env_refuses_sync_clients_and_bad_env_ids(app: Any, url: str) -> None:
    with pytest.raises(TypeError, match="async clients"):
        make_vector_env(lambda: GymnasiumClient(base_url=url).sync(), num_envs=2)
    with pytest.raises(EnvironmentExecutionError, match="not served here"):
        make_vector_env(url, env_id="Blackjack-v1", num_envs=4)
    assert _eventually_closed(app)  # the sessions it opened were closed


def test_the_allow_list_comes_from_the_server_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENENV_GYMNASIUM_ENV_IDS", "Acrobot-v1, FrozenLake-v1")
    monkeypatch.setenv("OPENENV_GYMNASIUM_MAKE_KWARGS", "is_slippery")
    env = GymnasiumEnvironment()
    assert env.reset(seed=0).env_id == "Acrobot-v1"  # the first is the default
    assert env.reset(seed=0, env_id="FrozenLake-v1", is_slippery=False).observation == 0
    with pytest.raises(ValueError, match="'CartPole-v1' is not served here; allowed: Acrobot-v1, FrozenLake-v1"):
        env.reset(env_id="CartPole-v1")
    with pytest.raises(ValueError, match="max_episode_steps not allowed; allowed: is_slippery"):
        env.reset(env_id="FrozenLake-v1", max_episode_steps=3)
    env.close()


def test_a_star_allows_any_registered_id_but_never_a_module_import() -> None:
    env = GymnasiumEnvironment(env_ids=["*"])
    assert env.reset(seed=0, env_id="Blackjack-v1").observation_space["type"] == "Tuple"
    with pytest.raises(ValueError, match="no env_id given and this server has no default"):
        env.reset()
    with pytest.raises(ValueError, match="'json:Nope-v0' is not served here"):
        env.reset(env_id="json:Nope-v0")
    with pytest.raises(ValueError, match=r"gymnasium.make\('NoSuchEnv-v0'\) failed"):
        env.reset(env_id="NoSuchEnv-v0")
    env.close()


# --- snapshots ------------------------------------------------------------------------------

WINDOWED_ENV = "openenv-test/Windowed-v0"


class Windowed(Rooms):
    """Rooms with a render window of its own (here an open file): not plain data."""

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        if getattr(self, "window", None) is None:
            self.window = open(__file__, "rb")
        return super().reset(seed=seed, options=options)

    def close(self) -> None:
        window, self.window = getattr(self, "window", None), None
        if window is not None:
            window.close()


gymnasium.register(WINDOWED_ENV, entry_point=Windowed)


class Snapshotted(GymnasiumEnvironment):
    ENV_IDS = (DICT_ENV, "FrozenLake-v1", WINDOWED_ENV)
    MAKE_KWARGS = ("is_slippery", "max_episode_steps")


def _seen(result: Any) -> Any:
    return result.observation, result.reward, result.done


def snapshot_app(env: Any = Snapshotted) -> Any:
    return create_app(
        env,
        GymnasiumAction,
        GymnasiumObservation,
        env_name="gymnasium",
        max_concurrent_envs=8,
        state_cls=GymnasiumState,
        snapshot_key="gymnasium-snapshots",
    )


@pytest.mark.parametrize(
    "reset, actions",
    [
        # NumPy's generator drawn at every step, Dict/Tuple/MultiDiscrete spaces, a TimeLimit
        ({"env_id": DICT_ENV, "max_episode_steps": 9}, [[0, 2], [2, 2], [1, 0], [2, 1]] * 3),
        # the slippery lake draws its moves from np_random
        ({"env_id": "FrozenLake-v1", "is_slippery": True}, [2, 1, 1, 2, 1, 2, 2, 1, 0, 3]),
    ],
)
async def test_a_session_forks_and_restores_exactly(reset: dict, actions: List[Any]) -> None:
    with serve(snapshot_app()) as server:
        async with GenericEnvClient(base_url=server.base_url) as env:
            await env.reset(seed=5, **reset)
            for action in actions[:3]:
                await env.step({"action": action})
            snapshot = await env.snapshot()
            forks = await env.fork(2)
            expected = [_seen(await env.step({"action": a})) for a in actions[3:]]
            assert any(done for _, _, done in expected)  # past the episode's end too
            for fork in forks:
                assert [_seen(await fork.step({"action": a})) for a in actions[3:]] == expected
                assert await fork.state() == await env.state()
    with serve(snapshot_app()) as fresh:
        async with GenericEnvClient(base_url=fresh.base_url) as env:
            await env.restore(snapshot)
            assert [_seen(await env.step({"action": a})) for a in actions[3:]] == expected


async def test_an_environment_that_is_not_plain_data_is_refused_and_goes_on() -> None:
    with serve(snapshot_app()) as server:
        async with GenericEnvClient(base_url=server.base_url) as env:
            await env.reset(seed=1, env_id=WINDOWED_ENV)
            with pytest.raises(NotSupportedError) as refused:
                await env.snapshot()
            message = str(refused.value)
            assert f"{WINDOWED_ENV} cannot be snapshotted exactly" in message
            assert re.search(r"self\._env(\.env)+\.window holds an open file", message)  # through the wrappers
            await env.step({"action": [1, 1]})


class CartPoleOnly(GymnasiumEnvironment):
    ENV_IDS = ("CartPole-v1",)


def test_a_snapshot_restores_only_where_its_environment_is_served() -> None:
    env = Snapshotted()
    env.reset(seed=2, env_id="FrozenLake-v1", is_slippery=True)
    data = decode(encode(env.snapshot_state()))  # as a server carries it
    elsewhere = CartPoleOnly()
    with pytest.raises(ValueError, match="'FrozenLake-v1' is not served here"):
        elsewhere.restore_state(data)
    assert elsewhere._env is None  # nothing was loaded
    again = Snapshotted()
    again.reset(seed=0, env_id=DICT_ENV)
    before = again._env
    again.restore_state(data)
    assert again._env is not before and again.state == env.state  # the one it held was closed
    assert again.step(GymnasiumAction(action=1)) == env.step(GymnasiumAction(action=1))
    env.close()
    again.close()
