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
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
from pydantic import BaseModel

from openenv.core import CheckReport, EnvCheckError, EnvCheckWarning, check_env, check_package, check_url
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.env_server.types import Observation, State

from .conftest import counter_app, serve
from .envs import (
    AsyncCounterEnv,
    BrokenFactoryEnv,
    CounterAction,
    CounterEnv,
    CounterObservation,
    LegacyToolEnv,
    ToolEnv,
)

DICE = Path(__file__).resolve().parent / "cli" / "fixtures" / "dice_env"


def failed(report: CheckReport) -> Dict[str, str]:
    return {c.id: c.detail for c in report.checks if c.status.value == "failed"}


def detail(report: CheckReport, id: str) -> str:
    check = report.get(id)
    assert check is not None, f"{id} was not run"
    return check.detail


def status(report: CheckReport, id: str) -> str:
    check = report.get(id)
    assert check is not None, f"{id} was not run"
    return check.status.value


def error_of(env: Any, **kwargs: Any) -> EnvCheckError:
    with pytest.raises(EnvCheckError) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore", EnvCheckWarning)  # (the failures are the point here)
        check_env(env, **kwargs)
    return caught.value


# --- variants of the tests' counter environment, with one defect each -----------------------------


class WrongObservationEnv(CounterEnv):
    def step(self, action: CounterAction, timeout_s: Optional[float] = None, **kwargs: Any) -> Any:
        super().step(action)
        return Observation(reward=1.0)


class NaNRewardEnv(CounterEnv):
    def step(self, action: CounterAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        observation = super().step(action)
        observation.reward = float("nan")
        return observation


class LooseDoneObservation(Observation):
    done: Any = False  # the defect: anything goes, and 0/1 are not the bool a trainer tests


class LooseDoneEnv(Environment[CounterAction, LooseDoneObservation, State]):
    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: Optional[int] = None, **kwargs: Any) -> LooseDoneObservation:
        self._state = State(episode_id="e")
        return LooseDoneObservation(done=False)

    def step(self, action: CounterAction, **kwargs: Any) -> LooseDoneObservation:
        self._state.step_count += 1
        return LooseDoneObservation(done=0)

    @property
    def state(self) -> State:
        return self._state


class BareState(BaseModel):
    episode_id: Optional[str] = None  # no step_count: not an openenv State


class BareStateEnv(CounterEnv):
    @property
    def state(self) -> Any:
        return BareState(episode_id="e")


class StillCountingEnv(CounterEnv):
    def step(self, action: CounterAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        observation = super().step(action)
        self._state.step_count = 0  # the defect: the state does not count steps
        return observation


class FailingResetEnv(CounterEnv):
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CounterObservation:
        raise ValueError("the board file is missing")


class NeedsArgumentsEnv(CounterEnv):
    def __init__(self, board: str, size: int, level: int = 1) -> None:
        super().__init__()


class UnseededEnv(CounterEnv):
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CounterObservation:
        super().reset(seed=seed)
        return CounterObservation(value=random.randrange(10**9))  # the defect: randomness not drawn from the seed


class EndlessEnv(CounterEnv):
    """Says done when the counter reaches 10, then goes on as if nothing happened."""

    def step(self, action: CounterAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        observation = super().step(action)
        observation.done = observation.value == 10
        return observation


class CloseOnceEnv(CounterEnv):
    def close(self) -> None:
        if self._closed:
            raise RuntimeError("already closed")
        super().close()


class FloatObservation(Observation):
    score: float = 0.0


class UnsendableEnv(Environment[CounterAction, FloatObservation, State]):
    """Its observation holds a NaN in a float field: sent as null, which a client cannot read back."""

    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: Optional[int] = None, **kwargs: Any) -> FloatObservation:
        self._state = State(episode_id="e")
        return FloatObservation(score=0.0)

    def step(self, action: CounterAction, **kwargs: Any) -> FloatObservation:
        self._state.step_count += 1
        return FloatObservation(score=float("nan"), reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class RefusingAfterDoneEnv(CounterEnv):
    """Not a defect: it refuses a step once the episode is over, as the catalogue's games do."""

    def step(self, action: CounterAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        if self._state.value >= 10:
            raise ValueError("the episode is over: call reset() first")
        return super().step(action)


class HangingEnv(AsyncCounterEnv):
    async def step_async(self, action: CounterAction, timeout_s: Optional[float] = None) -> CounterObservation:
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
    assert status(report, "mcp.tools") == "passed" and "echo_message" in detail(report, "mcp.tools")
    assert detail(report, "env.construct") == "given an instance"


def test_an_episode_that_ends_is_played_to_its_end_and_the_step_after_it_checked():
    from grid_world_env.server.grid_world_environment import GridWorldEnvironment

    report = check_env(GridWorldEnvironment, max_episode_steps=200)
    assert "a step after it answered done=True again" in detail(report, "env.step_after_done")


# --- what a report says --------------------------------------------------------------------------


def test_a_good_environment_passes_every_check_and_the_report_says_what_was_checked():
    report = check_env(CounterEnv, raise_on_failure=False)
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
        "env.snapshot",
        "env.close",
    ]
    assert all(c.ok and c.title and c.detail for c in report.checks)
    assert "action CounterAction, observation CounterObservation, state CounterState" in detail(report, "env.types")
    assert '{"delta": 1, "sleep_s": 0.0, "fail": false} (generated from the action schema)' in detail(
        report, "env.step"
    )
    assert "seed=4321 a different episode" in detail(report, "env.seed_determinism")
    assert "ended after 6 steps; a step after it answered done=True again" in detail(report, "env.step_after_done")


def test_a_step_after_the_end_may_be_refused():
    report = check_env(RefusingAfterDoneEnv)
    assert "a step after it was refused: ValueError: the episode is over" in detail(report, "env.step_after_done")


def test_an_async_environment_is_run_on_the_event_loop_and_passes():
    assert check_env(AsyncCounterEnv).ok


def test_the_action_given_is_the_one_stepped():
    report = check_env(CounterEnv, action={"delta": 7})
    assert '{"delta": 7, "sleep_s": 0.0, "fail": false} (given)' in detail(report, "env.step")
    assert "the episode ended after 1 step;" in detail(report, "env.step_after_done")  # 1234 % 5 + 7 >= 10
    assert check_env(CounterEnv, action=CounterAction(delta=2)).ok


def test_an_environment_that_declares_no_types_is_warned_and_stepped_with_the_action_given():
    report = check_env(LegacyToolEnv, raise_on_failure=False)
    assert report.ok and status(report, "env.types") == "warning"
    assert "LegacyToolEnv declares no types" in detail(report, "env.types")
    assert detail(report, "env.step") == "no action type declared to make an action from: pass action= (or action_cls=)"
    shout = CallToolAction(tool_name="shout", arguments={"text": "hi"})
    report = check_env(LegacyToolEnv, action=shout, raise_on_failure=False)
    assert status(report, "env.step") == "passed" and status(report, "env.wire") == "passed"


def test_an_error_names_every_failed_check():
    class TwoDefectsEnv(NaNRewardEnv, CloseOnceEnv):
        pass

    error = error_of(TwoDefectsEnv)
    assert [c.id for c in error.report.failed] == ["env.step", "env.close"]
    assert str(error).startswith("TwoDefectsEnv failed 2 checks:\n- env.step (")


def test_warnings_are_issued_when_raising_and_only_reported_otherwise():
    with pytest.warns(EnvCheckWarning, match="env.step_after_done: the episode ended after 6 steps; a step after"):
        check_env(EndlessEnv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = check_env(EndlessEnv, raise_on_failure=False)
    assert report.ok and [c.id for c in report.warnings] == ["env.step_after_done"]


def test_something_that_is_no_environment_is_a_type_error():
    with pytest.raises(TypeError, match=r"check_env takes an Environment .* not a dict"):
        check_env({"reset": None})


# --- one defect each -----------------------------------------------------------------------------


def test_a_step_that_returns_another_observation_type_fails_env_step():
    error = error_of(WrongObservationEnv)
    assert "- env.step (step returns the declared observation)" in str(error)
    assert "returned a Observation, not the declared CounterObservation" in str(error)


def test_a_nan_reward_fails_with_what_the_client_would_see():
    error = error_of(NaNRewardEnv)
    assert "- env.step (" in str(error)
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
    assert "step_count is 0 after a step" in detail(report, "env.state")


def test_a_reset_that_raises_fails_names_the_exception_and_skips_what_needs_it():
    report = check_env(FailingResetEnv, raise_on_failure=False)
    why = failed(report)["env.reset"]
    assert why.startswith("reset(seed=1234) raised ValueError: the board file is missing (at test_check_env.py:")
    assert why.endswith(" in reset)")
    assert status(report, "env.step") == "skipped" and status(report, "env.seed_determinism") == "skipped"
    assert status(report, "env.close") == "passed"  # closed all the same


def test_a_given_action_that_fails_fails_env_step():
    error = error_of(CounterEnv, action=CounterAction(fail=True))
    assert "- env.step (step returns the declared observation): step(" in str(error)
    assert "(given) raised ValueError: the step failed on purpose (at envs.py:" in str(error)


def test_a_class_that_needs_arguments_is_refused_with_their_names():
    error = error_of(NeedsArgumentsEnv)
    assert "- env.construct (Environment is built)" in str(error)
    assert "NeedsArgumentsEnv() needs the arguments board, size: build it yourself" in str(error)
    assert "check_env(NeedsArgumentsEnv(board=..., size=...))" in str(error)
    assert len(error.report.failed) == 1  # the rest is skipped, not failed


def test_a_constructor_that_raises_fails_env_construct():
    error = error_of(BrokenFactoryEnv)
    assert "BrokenFactoryEnv() raised RuntimeError: cannot build this environment (at envs.py:" in str(error)


def test_an_environment_that_drops_the_seed_fails_the_seed_check():
    why = failed(check_env(UnseededEnv, raise_on_failure=False))["env.seed_determinism"]
    assert "two episodes started with reset(seed=1234) differ at the reset (observation.value: " in why
    assert "UnseededEnv.reset() receives the seed but does not use it" in why


def test_a_close_that_fails_the_second_time_fails_env_close():
    error = error_of(CloseOnceEnv)
    assert "- env.close (close releases the environment): a second close() raised RuntimeError: already closed" in str(
        error
    )
    assert "(close must be safe to call twice)" in str(error)


def test_an_observation_a_client_cannot_read_back_fails_env_wire():
    why = failed(check_env(UnsendableEnv, raise_on_failure=False))["env.wire"]
    assert "a client cannot read the FloatObservation it is sent as a FloatObservation" in why
    assert "score" in why


def test_a_step_that_hangs_is_stopped_at_the_timeout():
    report = check_env(HangingEnv, timeout_s=0.5, raise_on_failure=False)
    assert "did not finish within the server's step timeout of 0.5 s" in detail(report, "env.step")


# --- MCP environments ----------------------------------------------------------------------------


def test_an_mcp_environment_lists_its_tools_and_a_generated_call_works():
    report = check_env(ToolEnv, raise_on_failure=False)
    assert report.ok and 'lists add, boom, nap; add({"a": 0}) -> 2' in detail(report, "mcp.tools")


def test_an_mcp_environment_whose_tool_raises_fails_mcp_tools():
    error = error_of(ToolEnv, action=CallToolAction(tool_name="boom"))
    assert "- mcp.tools (MCP tools listed and callable): lists add, boom, nap; the call boom({}) (given) failed" in str(
        error
    )
    assert "execution_error: Error calling tool 'boom': kaboom" in str(error)


def test_a_generated_tool_call_that_fails_says_how_to_give_one():
    class BoomFirstEnv(ToolEnv):
        async def list_tools_async(self) -> Any:
            return sorted(await super().list_tools_async(), key=lambda tool: tool.name != "boom")

    why = failed(check_env(BoomFirstEnv, raise_on_failure=False))["mcp.tools"]
    assert "the call boom({}) (generated) failed" in why
    assert "pass a valid call: check_env(env, action=CallToolAction(tool_name='boom', arguments={...}))" in why


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


def test_check_url_passes_a_running_server():
    with BackgroundServer(counter_app()) as server:
        report = check_url(server.base_url)
    assert report.ok and report.kind == "url" and report.name == "CounterEnv"
    for id in ("http.health", "http.schema", "ws.round_trip", "ws.invalid_action", "ws.concurrent_sessions"):
        assert status(report, id) == "passed", (id, report.get(id))


def test_check_url_speaks_to_a_server_on_a_unix_socket():
    with serve(counter_app(), uds=True) as server:
        report = check_url(server.base_url, raise_on_failure=False)
    assert server.base_url.startswith("unix://")
    assert report.ok, failed(report)


def test_check_url_raises_naming_what_the_server_got_wrong():
    with BackgroundServer(counter_app(UnseededEnv)) as server:
        with pytest.raises(EnvCheckError) as caught:
            check_url(server.base_url)
    assert "- ws.seed_determinism (Same seed, same episode): two episodes started with reset(seed=1234)" in str(
        caught.value
    )


def test_check_url_reports_a_server_that_is_not_there():
    with BackgroundServer(counter_app()) as server:
        url = server.base_url
    report = check_url(url, timeout_s=5, raise_on_failure=False)
    assert not report.ok and "GET /health failed" in failed(report)["http.health"]
    assert status(report, "ws.round_trip") == "skipped"


# --- snapshots ---------------------------------------------------------------------------------


class SnapshotCounterEnv(CounterEnv):
    SUPPORTS_SNAPSHOT = True


class ForgetfulSnapshotEnv(CounterEnv):
    """Claims snapshots but leaves its counter out of them: a loaded snapshot does not go back."""

    SUPPORTS_SNAPSHOT = True
    SNAPSHOT_EXCLUDE = ("_state",)


class LockedSnapshotEnv(CounterEnv):
    SUPPORTS_SNAPSHOT = True

    def __init__(self) -> None:
        super().__init__()
        self.guard = threading.Lock()


def test_snapshots_are_checked_where_the_class_claims_them():
    assert status(check_env(CounterEnv, raise_on_failure=False), "env.snapshot") == "skipped"
    report = check_env(SnapshotCounterEnv)
    assert status(report, "env.snapshot") == "passed" and "repeated exactly" in detail(report, "env.snapshot")
    forgetful = check_env(ForgetfulSnapshotEnv, raise_on_failure=False)
    assert status(forgetful, "env.snapshot") == "failed"
    assert "the same actions gave other observations" in detail(forgetful, "env.snapshot")
    locked = check_env(LockedSnapshotEnv, raise_on_failure=False)
    assert status(locked, "env.snapshot") == "failed" and "self.guard holds a lock" in detail(locked, "env.snapshot")


def test_check_url_checks_snapshots_over_the_wire():
    assert status(check_url_of(CounterEnv), "ws.snapshot") == "skipped"  # the class does not claim them
    report = check_url_of(SnapshotCounterEnv)
    assert status(report, "ws.snapshot") == "passed" and "repeated exactly" in detail(report, "ws.snapshot")
    forgetful = check_url_of(ForgetfulSnapshotEnv)
    assert status(forgetful, "ws.snapshot") == "failed"
    assert "the same actions gave other observations" in detail(forgetful, "ws.snapshot")


def check_url_of(env_cls):
    with BackgroundServer(counter_app(env_cls)) as server:
        return check_url(server.base_url, raise_on_failure=False)
