"""``openenv.core.check_env``, ``check_package`` and ``check_url``: the checker as a library.

``check_env`` drives an environment in this process as the server would; each defect it looks for
is shown by an environment built to have exactly that defect, and the error names the check and
what was wrong. ``check_package`` and ``check_url`` run what ``openenv validate`` runs, on a real
package directory and on a real server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
from pydantic import BaseModel

from openenv.core import CheckReport, EnvCheckError, EnvCheckWarning, check_env, check_package, check_url
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.runner import BackgroundServer
from openenv.core.env_server.types import Action, Observation, State

from .conftest import serve

DICE = Path(__file__).resolve().parent / "cli" / "fixtures" / "dice_env"


def failed(report: CheckReport) -> Dict[str, str]:
    return {c.id: c.detail for c in report.checks if c.status.value == "failed"}


def status(report: CheckReport, id: str) -> str:
    check = report.get(id)
    assert check is not None, f"{id} was not run"
    return check.status.value


def error_of(env: Any, **kwargs: Any) -> EnvCheckError:
    with pytest.raises(EnvCheckError) as caught:
        check_env(env, **kwargs)
    return caught.value


# --- a well-behaved environment, and variants with one defect each ----------------------------------


class CoinAction(Action):
    flips: int = 1


class CoinObservation(Observation):
    heads: int = 0


class CoinState(State):
    heads: int = 0


class CoinEnv(Environment[CoinAction, CoinObservation, CoinState]):
    """Counts heads in coin flips drawn from a generator seeded at reset; three steps an episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._random = random.Random()
        self._state = CoinState()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CoinObservation:
        self._random = random.Random(seed)
        self._state = CoinState(episode_id=episode_id or "episode", step_count=0)
        return CoinObservation(heads=0, reward=None)

    def step(self, action: CoinAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CoinObservation:
        if self._state.step_count >= 3:
            raise RuntimeError("the episode is over: call reset() first")
        self._state.step_count += 1
        self._state.heads += sum(self._random.random() < 0.5 for _ in range(action.flips))
        return CoinObservation(heads=self._state.heads, reward=1.0, done=self._state.step_count >= 3)

    @property
    def state(self) -> CoinState:
        return self._state


class WrongObservationEnv(CoinEnv):
    def step(self, action: CoinAction, timeout_s: Optional[float] = None, **kwargs: Any) -> Any:
        super().step(action)
        return Observation(reward=1.0)


class NaNRewardEnv(CoinEnv):
    def step(self, action: CoinAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CoinObservation:
        observation = super().step(action)
        observation.reward = float("nan")
        return observation


class LooseDoneObservation(Observation):
    done: Any = False  # the defect: anything goes, and 0/1 are not the bool a trainer tests


class LooseDoneEnv(Environment[CoinAction, LooseDoneObservation, State]):
    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: Optional[int] = None, **kwargs: Any) -> LooseDoneObservation:
        self._state = State(episode_id="e")
        return LooseDoneObservation(done=False)

    def step(self, action: CoinAction, **kwargs: Any) -> LooseDoneObservation:
        self._state.step_count += 1
        return LooseDoneObservation(done=0)

    @property
    def state(self) -> State:
        return self._state


class BareState(BaseModel):
    episode_id: Optional[str] = None  # no step_count: not an openenv State


class BareStateEnv(CoinEnv):
    @property
    def state(self) -> Any:
        return BareState(episode_id="e")


class StillCountingEnv(CoinEnv):
    def step(self, action: CoinAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CoinObservation:
        observation = super().step(action)
        self._state.step_count = 0  # the defect: the state does not count steps
        observation.done = False
        return observation


class FailingResetEnv(CoinEnv):
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CoinObservation:
        raise ValueError("the board file is missing")


class NeedsArgumentsEnv(CoinEnv):
    def __init__(self, board: str, size: int, level: int = 1) -> None:
        super().__init__()


class FailingConstructorEnv(CoinEnv):
    def __init__(self) -> None:
        raise OSError("no GPU here")


class UnseededEnv(CoinEnv):
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CoinObservation:
        super().reset(seed=seed)
        return CoinObservation(heads=random.randrange(10**9))  # the defect: randomness not drawn from the seed


class EndlessEnv(CoinEnv):
    """Reports done after three steps, then goes on as if nothing happened."""

    def step(self, action: CoinAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CoinObservation:
        self._state.step_count += 1
        return CoinObservation(heads=0, reward=1.0, done=self._state.step_count == 3)


class CloseOnceEnv(CoinEnv):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        if self.closed:
            raise RuntimeError("already closed")
        self.closed = True


class FloatObservation(Observation):
    score: float = 0.0


class UnsendableEnv(Environment[CoinAction, FloatObservation, State]):
    """Its observation holds a NaN in a float field: sent as null, which a client cannot read back."""

    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: Optional[int] = None, **kwargs: Any) -> FloatObservation:
        self._state = State(episode_id="e")
        return FloatObservation(score=0.0)

    def step(self, action: CoinAction, **kwargs: Any) -> FloatObservation:
        self._state.step_count += 1
        return FloatObservation(score=float("nan"), reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class AsyncCoinEnv(CoinEnv):
    """Async reset and step, run on the event loop as a server runs them."""

    async def reset_async(self, seed: Optional[int] = None, **kwargs: Any) -> CoinObservation:
        await asyncio.sleep(0)
        return self.reset(seed=seed, **kwargs)

    async def step_async(self, action: CoinAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CoinObservation:
        await asyncio.sleep(0)
        return self.step(action)


class HangingEnv(CoinEnv):
    async def step_async(self, action: CoinAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CoinObservation:
        await asyncio.sleep(60)
        raise AssertionError("not reached")


# --- real environments of envs/ --------------------------------------------------------------------


def _real_environments() -> Any:
    from connect4_env.server.connect4_environment import Connect4Environment
    from echo_env.server.echo_environment import EchoEnvironment
    from grid_world_env.server.grid_world_environment import GridWorldEnvironment
    from snake_env.server.snake_environment import SnakeEnvironment

    return [EchoEnvironment, GridWorldEnvironment, SnakeEnvironment, Connect4Environment]


@pytest.mark.parametrize("cls", _real_environments(), ids=lambda cls: cls.__name__)
def test_real_environments_pass_in_process(cls):
    report = check_env(cls)  # raises on any failed check
    assert report.ok and report.kind == "environment" and report.name == cls.__name__
    for id in ("env.construct", "env.reset", "env.step", "env.state", "env.wire", "env.seed_determinism"):
        assert status(report, id) == "passed", (id, report.get(id))
    assert status(report, "env.close") == "passed"


def test_the_echo_environment_lists_its_tools_and_one_is_called():
    from echo_env.server.echo_environment import EchoEnvironment

    report = check_env(EchoEnvironment())  # an instance is checked as it is
    tools = report.get("mcp.tools")
    assert tools is not None and tools.ok and "echo_message" in tools.detail
    assert report.get("env.construct").detail == "given an instance"  # type: ignore[union-attr]


def test_an_episode_that_ends_is_played_to_its_end_and_the_step_after_it_checked():
    from grid_world_env.server.grid_world_environment import GridWorldEnvironment

    report = check_env(GridWorldEnvironment, max_episode_steps=200)
    assert "a step after it answered done=True again" in report.get("env.step_after_done").detail  # type: ignore[union-attr]


def test_a_good_environment_passes_every_check_and_the_report_says_what_was_checked():
    report = check_env(CoinEnv, raise_on_failure=False)
    assert report.ok and not report.warnings
    assert [c.id for c in report.checks] == [
        "env.construct",
        "env.types",
        "env.metadata",
        "env.reset",
        "mcp.tools",
        "env.step",
        "env.state",
        "env.wire",
        "env.seed_determinism",
        "env.step_after_done",
        "env.close",
    ]
    assert all(c.ok and c.title and c.detail for c in report.checks)
    assert "action CoinAction, observation CoinObservation, state CoinState" in report.get("env.types").detail  # type: ignore[union-attr]
    assert '{"flips": 1} (generated from the action schema)' in report.get("env.step").detail  # type: ignore[union-attr]
    assert "seed=4321 a different episode" in report.get("env.seed_determinism").detail  # type: ignore[union-attr]
    assert "refused: RuntimeError: the episode is over" in report.get("env.step_after_done").detail  # type: ignore[union-attr]


def test_an_async_environment_is_run_on_the_event_loop_and_passes():
    assert check_env(AsyncCoinEnv).ok


def test_the_action_given_is_the_one_stepped():
    report = check_env(CoinEnv, action={"flips": 7})
    assert '{"flips": 7} (given)' in report.get("env.step").detail  # type: ignore[union-attr]
    assert check_env(CoinEnv, action=CoinAction(flips=2)).ok


# --- one defect each -----------------------------------------------------------------------------


def test_a_step_that_returns_another_observation_type_fails_env_step():
    error = error_of(WrongObservationEnv)
    assert "- env.step (step returns the declared observation)" in str(error)
    assert "returned a Observation, not the declared CoinObservation" in str(error)


def test_a_nan_reward_fails_with_what_the_client_would_see():
    error = error_of(NaNRewardEnv)
    assert "env.step" in str(error)
    assert "reward is nan, not a finite number: it reaches the client as null (None)" in str(error)


def test_a_done_that_is_not_a_bool_fails():
    details = failed(check_env(LooseDoneEnv, raise_on_failure=False))
    assert "done is 0 (a int), not a bool" in details["env.step"]


def test_a_state_without_step_count_fails_env_state():
    error = error_of(BareStateEnv)
    assert "- env.state (state is the declared State)" in str(error)
    assert "state is a BareState, not an openenv State (which carries episode_id and step_count)" in str(error)


def test_a_state_whose_step_count_does_not_count_is_a_warning():
    report = check_env(StillCountingEnv, raise_on_failure=False)
    assert report.ok and status(report, "env.state") == "warning"
    assert "step_count is 0 after a step" in report.get("env.state").detail  # type: ignore[union-attr]


def test_a_reset_that_raises_fails_names_the_exception_and_skips_what_needs_it():
    report = check_env(FailingResetEnv, raise_on_failure=False)
    detail = failed(report)["env.reset"]
    assert detail.startswith("reset(seed=1234) raised ValueError: the board file is missing (at test_check_env.py:")
    assert "in reset)" in detail
    assert status(report, "env.step") == "skipped" and status(report, "env.seed_determinism") == "skipped"
    assert status(report, "env.close") == "passed"  # closed all the same


def test_a_class_that_needs_arguments_is_refused_with_their_names():
    error = error_of(NeedsArgumentsEnv)
    assert "- env.construct (Environment is built)" in str(error)
    assert "NeedsArgumentsEnv() needs the arguments board, size: build it yourself" in str(error)
    assert "check_env(NeedsArgumentsEnv(board=..., size=...))" in str(error)
    assert len(error.report.failed) == 1  # the rest is skipped, not failed


def test_a_constructor_that_raises_fails_env_construct():
    error = error_of(FailingConstructorEnv)
    assert "FailingConstructorEnv() raised OSError: no GPU here" in str(error)


def test_an_environment_that_drops_the_seed_fails_the_seed_check():
    detail = failed(check_env(UnseededEnv, raise_on_failure=False))["env.seed_determinism"]
    assert "two episodes started with reset(seed=1234) differ at the reset (observation.heads: " in detail
    assert "UnseededEnv.reset() receives the seed but does not use it" in detail


def test_a_step_after_the_end_that_goes_on_is_a_warning():
    with pytest.warns(EnvCheckWarning, match="env.step_after_done: the episode ended after 3 steps; a step after"):
        report = check_env(EndlessEnv)
    assert report.ok and status(report, "env.step_after_done") == "warning"


def test_warnings_are_only_in_the_report_when_a_report_is_asked_for():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = check_env(EndlessEnv, raise_on_failure=False)
    assert [c.id for c in report.warnings] == ["env.step_after_done"]


def test_a_close_that_fails_the_second_time_fails_env_close():
    error = error_of(CloseOnceEnv)
    assert "- env.close (close releases the environment): a second close() raised RuntimeError: already closed" in str(
        error
    )
    assert "(close must be safe to call twice)" in str(error)


def test_an_observation_a_client_cannot_read_back_fails_env_wire():
    detail = failed(check_env(UnsendableEnv, raise_on_failure=False))["env.wire"]
    assert "a client cannot read the FloatObservation it is sent as a FloatObservation" in detail
    assert "score" in detail


def test_a_step_that_hangs_is_stopped_at_the_timeout():
    report = check_env(HangingEnv, timeout_s=0.5, raise_on_failure=False)
    assert "did not finish within the server's step timeout of 0.5 s" in report.get("env.step").detail  # type: ignore[union-attr]


def test_an_error_names_every_failed_check():
    class TwoDefectsEnv(NaNRewardEnv, CloseOnceEnv):
        pass

    error = error_of(TwoDefectsEnv)
    assert [c.id for c in error.report.failed] == ["env.step", "env.close"]
    assert str(error).startswith("TwoDefectsEnv failed 2 checks:\n- env.step (")


def test_something_that_is_no_environment_is_a_type_error():
    with pytest.raises(TypeError, match=r"check_env takes an Environment .* not a dict"):
        check_env({"reset": None})


# --- MCP environments ----------------------------------------------------------------------------


def _tool_env(broken: bool) -> type:
    from fastmcp import FastMCP

    from openenv.core.env_server.mcp_environment import MCPEnvironment

    class ToolEnv(MCPEnvironment):
        def __init__(self) -> None:
            mcp = FastMCP("tools")

            @mcp.tool
            def lookup(key: str) -> str:
                """Look a key up."""
                if broken:
                    raise KeyError(f"no table for {key!r}")
                return f"value of {key}"

            super().__init__(mcp)
            self._state = State()

        def reset(self, seed: Optional[int] = None, **kwargs: Any) -> Observation:
            self._state = State(episode_id="e")
            return Observation()

        def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
            return Observation(metadata={"error": "tools only"})

        async def _after_mcp_action(self, action: Action, observation: Observation) -> Observation:
            self._state.step_count += 1
            return await super()._after_mcp_action(action, observation)

        @property
        def state(self) -> State:
            return self._state

    return ToolEnv


def test_an_mcp_environment_with_working_tools_passes():
    report = check_env(_tool_env(broken=False))
    assert 'lists lookup; lookup({"key": ""}) -> "value of "' in report.get("mcp.tools").detail  # type: ignore[union-attr]


def test_an_mcp_environment_whose_tool_raises_fails_mcp_tools():
    error = error_of(_tool_env(broken=True))
    assert "- mcp.tools (MCP tools listed and callable)" in str(error)
    assert 'the call lookup({"key": ""}) (generated) failed, execution_error' in str(error)
    assert "no table for ''" in str(error)
    assert "check_env(env, action=CallToolAction(tool_name='lookup', arguments={...}))" in str(error)


def test_an_mcp_tool_call_given_is_the_one_made():
    report = check_env(_tool_env(broken=False), action=CallToolAction(tool_name="lookup", arguments={"key": "k"}))
    assert '"value of k"' in report.get("mcp.tools").detail  # type: ignore[union-attr]


# --- check_package and check_url -------------------------------------------------------------------


def test_check_package_passes_a_good_package_statically():
    report = check_package(DICE, runtime=False)
    assert report.ok and report.kind == "package" and report.name == "dice_env"
    assert status(report, "app.create_app") == "passed" and report.get("server.start") is None


@pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
def test_check_package_serves_a_good_package_in_a_sandbox_and_checks_it():
    report = check_package(DICE)
    assert report.ok
    assert status(report, "server.start") == "passed" and status(report, "ws.seed_determinism") == "passed"


def test_check_package_names_what_is_broken_in_a_package(tmp_path):
    package = tmp_path / "dice_env"
    shutil.copytree(DICE, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "client.py").unlink()
    manifest = package / "openenv.yaml"
    manifest.write_text("".join(line for line in manifest.read_text().splitlines(True) if not line.startswith("app:")))
    with pytest.raises(EnvCheckError) as caught:
        check_package(package, runtime=False)
    message = str(caught.value)
    assert message.startswith("dice_env failed 2 checks:")
    assert "- manifest.fields (Manifest fields): required field(s) missing: app" in message
    assert "- package.client (Client class): no client.py" in message


def coin_app(env: type = CoinEnv) -> Any:
    return create_app(env, CoinAction, CoinObservation, state_cls=CoinState, max_concurrent_envs=4)


def test_check_url_passes_a_running_server():
    with BackgroundServer(coin_app()) as server:
        report = check_url(server.base_url)
    assert report.ok and report.kind == "url" and report.name == "CoinEnv"
    for id in ("http.health", "http.schema", "ws.round_trip", "ws.invalid_action", "ws.concurrent_sessions"):
        assert status(report, id) == "passed", (id, report.get(id))


def test_check_url_speaks_to_a_server_on_a_unix_socket():
    with serve(coin_app(), uds=True) as server:
        report = check_url(server.base_url, raise_on_failure=False)
    assert server.base_url.startswith("unix://")
    assert report.ok, failed(report)


def test_check_url_raises_naming_what_the_server_got_wrong():
    with BackgroundServer(coin_app(UnseededEnv)) as server:
        with pytest.raises(EnvCheckError) as caught:
            check_url(server.base_url)
    assert "- ws.seed_determinism (Same seed, same episode): two episodes started with reset(seed=1234)" in str(
        caught.value
    )


def test_check_url_reports_a_server_that_is_not_there():
    with BackgroundServer(coin_app()) as server:
        url = server.base_url
    report = check_url(url, timeout_s=5, raise_on_failure=False)
    assert not report.ok and "GET /health failed" in failed(report)["http.health"]
    assert status(report, "ws.round_trip") == "skipped"
