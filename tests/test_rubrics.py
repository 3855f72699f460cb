"""Rubrics (spec §8, RFC 004): the base class, containers, delayed rewards, LLM judges, and
rewards reported through a real server."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from typing import Any, Iterator, List, Optional, Tuple

import pytest

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation
from openenv.core.llm_client import LLMError, OpenAIClient
from openenv.core.rubrics import (
    ExponentialDiscountingTrajectoryRubric,
    Gate,
    LLMJudge,
    Rubric,
    RubricDict,
    RubricList,
    Sequential,
    TrajectoryRubric,
    WeightedSum,
)

from .conftest import serve
from .envs import CounterAction, CounterClient, CounterObservation, CounterState
from .test_llm_client import FakeLLM, Scripted, closed_port, fake_llm_server

# --- rubrics the tests compose ------------------------------------------------------------------


class Fixed(Rubric):
    """Scores ``score`` and records every call in ``log`` (shared between rubrics to see order)."""

    def __init__(self, score: float, log: Optional[List[str]] = None, name: str = "") -> None:
        super().__init__()
        self.score = score
        self.log = log if log is not None else []
        self.name = name
        self.resets = 0

    def forward(self, action: Any, observation: Any) -> float:
        self.log.append(self.name)
        return self.score

    def reset(self) -> None:
        self.resets += 1
        super().reset()


class AsyncFixed(Fixed):
    """The same, with ``async def forward`` that yields to the loop first."""

    async def forward(self, action: Any, observation: Any) -> float:  # type: ignore[override]
        await asyncio.sleep(0)
        self.log.append(self.name)
        return self.score


class Echo(Rubric):
    """The observation's ``value`` as the score."""

    def forward(self, action: Any, observation: Any) -> float:
        return float(observation.value)


class Obs(Observation):
    value: float = 0.0


def obs(value: float = 0.0, done: bool = False, reward: Optional[float] = None) -> Obs:
    return Obs(value=value, done=done, reward=reward)


ACTION = Action()


# --- the base class: children and introspection -------------------------------------------------


class Judge(Rubric):
    def __init__(self) -> None:
        super().__init__()
        self.format = Fixed(1.0)
        self.quality = Gate(Fixed(0.8), threshold=0.5)
        self.weight = 2.0

    def forward(self, action: Any, observation: Any) -> float:
        return self.format(action, observation) * self.quality(action, observation) * self.weight


def test_rubric_attributes_become_named_children_in_order() -> None:
    judge = Judge()
    assert [name for name, _ in judge.named_children()] == ["format", "quality"]
    assert list(judge.children()) == [judge.format, judge.quality]


def test_named_rubrics_walks_the_tree_depth_first_with_dotted_names() -> None:
    judge = Judge()
    assert [name for name, _ in judge.named_rubrics()] == ["format", "quality", "quality.rubric"]
    assert list(judge.rubrics()) == [judge.format, judge.quality, judge.quality.rubric]
    assert [name for name, _ in judge.named_rubrics(prefix="judge")] == [
        "judge.format",
        "judge.quality",
        "judge.quality.rubric",
    ]


def test_get_rubric_follows_a_dotted_path_and_names_the_missing_part() -> None:
    judge = Judge()
    assert judge.get_rubric("quality.rubric") is judge.quality.rubric
    with pytest.raises(KeyError, match=r"no rubric 'missing' in 'quality\.missing'.*children here: rubric"):
        judge.get_rubric("quality.missing")


def test_replacing_or_deleting_a_child_unregisters_it() -> None:
    judge = Judge()
    judge.format = None  # type: ignore[assignment]
    assert [name for name, _ in judge.named_children()] == ["quality"]
    del judge.quality
    assert list(judge.children()) == []


def test_a_subclass_must_call_the_base_init_before_setting_attributes() -> None:
    class Forgetful(Rubric):
        def __init__(self) -> None:
            self.part = Fixed(1.0)

        def forward(self, action: Any, observation: Any) -> float:
            return 1.0

    with pytest.raises(RuntimeError, match=r"Forgetful.__init__ must call super\(\).__init__\(\)"):
        Forgetful()


def test_forward_must_be_implemented_a_rubric_without_it_cannot_be_made() -> None:
    class NoForward(Rubric):
        pass

    for cls in (Rubric, NoForward):  # as upstream's abstract base: TypeError at construction
        with pytest.raises(TypeError, match="abstract method forward"):
            cls()


async def test_a_sequential_of_sync_children_can_be_awaited_as_upstream_code_does() -> None:
    """Upstream's Sequential returns a coroutine inside a running loop, so code written for it awaits."""
    chain = Sequential(Fixed(0.5), Fixed(0.75))
    assert await chain(ACTION, obs()) == 0.75
    assert await Sequential()(ACTION, obs()) == 1.0  # empty: 1.0
    assert await Sequential(Fixed(0.0), Fixed(1.0))(ACTION, obs()) == 0.0  # short-circuit
    plain = chain(ACTION, obs())  # and without await, a number, as before
    assert plain + 1 == 1.75 and type(float(plain)) is float and json.dumps({"r": plain}) == '{"r": 0.75}'
    nested = Sequential(Sequential(Fixed(0.5)), WeightedSum([Sequential(Fixed(0.25))], [1.0]))
    assert nested(ACTION, obs()) == 0.25  # a Score from a child is a number, not something pending


def test_a_sync_environment_on_the_loop_applies_a_sequential_rubric() -> None:
    async def on_the_loop() -> float:
        env = ScoredEnv(rubric=Sequential(Fixed(0.5), Fixed(0.25)))
        return env._apply_rubric(ACTION, obs())  # a running loop, a sync call: no TypeError

    score = asyncio.run(on_the_loop())
    assert score == 0.25 and type(score) is float


def test_last_score_is_none_until_called_then_the_score() -> None:
    judge = Judge()
    assert judge.last_score is None
    assert judge(ACTION, obs()) == pytest.approx(1.6)
    assert judge.last_score == pytest.approx(1.6)
    assert judge.quality.last_score == 0.8


def test_component_scores_is_a_reward_vector_by_dotted_name() -> None:
    judge = Judge()
    judge(ACTION, obs())
    assert judge.component_scores() == {"format": 1.0, "quality": 0.8, "quality.rubric": 0.8}


def test_repr_shows_the_tree() -> None:
    assert repr(Gate(Fixed(1.0))) == "Gate(\n  (rubric): Fixed()\n)"


# --- hooks ------------------------------------------------------------------------------------------


def test_pre_and_post_hooks_see_each_call_in_order() -> None:
    rubric, seen = Echo(), []
    rubric.register_forward_pre_hook(lambda r, a, o: seen.append(("pre", r, a, o.value)))
    rubric.register_forward_hook(lambda r, a, o, score: seen.append(("post", r, a, o.value, score)))
    rubric(ACTION, obs(3.0))
    assert seen == [("pre", rubric, ACTION, 3.0), ("post", rubric, ACTION, 3.0, 3.0)]


def test_a_removed_hook_is_no_longer_called() -> None:
    rubric, seen = Echo(), []
    handle = rubric.register_forward_hook(lambda r, a, o, score: seen.append(score))
    rubric(ACTION, obs(1.0))
    handle.remove()
    handle.remove()  # twice is harmless
    rubric(ACTION, obs(2.0))
    assert seen == [1.0]


async def test_an_async_hook_makes_the_call_awaitable_and_is_awaited() -> None:
    rubric, seen = Echo(), []

    async def pre(r: Rubric, a: Any, o: Any) -> None:
        await asyncio.sleep(0)
        seen.append("pre")

    async def post(r: Rubric, a: Any, o: Any, score: float) -> None:
        await asyncio.sleep(0)
        seen.append(("post", score))

    rubric.register_forward_pre_hook(pre)
    rubric.register_forward_hook(post)
    result = rubric(ACTION, obs(5.0))
    assert inspect.iscoroutine(result)
    assert await result == 5.0
    assert seen == ["pre", ("post", 5.0)]


def test_a_sync_hook_returning_an_awaitable_is_an_error_on_a_sync_call() -> None:
    async def later() -> None:
        pass

    rubric = Echo()
    rubric.register_forward_hook(lambda r, a, o, score: later())
    with pytest.raises(TypeError, match="returned an awaitable from a sync rubric call"):
        rubric(ACTION, obs(1.0))


# --- async forward ----------------------------------------------------------------------------------


async def test_an_async_forward_returns_a_coroutine_that_runs_the_hooks() -> None:
    rubric, seen = AsyncFixed(0.4), []
    rubric.register_forward_pre_hook(lambda r, a, o: seen.append("pre"))
    rubric.register_forward_hook(lambda r, a, o, score: seen.append(score))
    result = rubric(ACTION, obs())
    assert inspect.iscoroutine(result)
    assert seen == []  # nothing runs before it is awaited
    assert await result == 0.4
    assert (seen, rubric.last_score) == (["pre", 0.4], 0.4)


async def test_a_sync_parent_of_an_async_child_becomes_awaitable() -> None:
    class Doubler(Rubric):
        def __init__(self) -> None:
            super().__init__()
            self.inner = AsyncFixed(0.25)

        def forward(self, action: Any, observation: Any) -> Any:
            return self.inner(action, observation)

    doubler = Doubler()
    result = doubler(ACTION, obs())
    assert inspect.isawaitable(result)
    assert await result == 0.25
    assert (doubler.last_score, doubler.component_scores()) == (0.25, {"inner": 0.25})


# --- Sequential -------------------------------------------------------------------------------------


def test_sequential_returns_the_last_score_when_no_child_fails() -> None:
    log: List[str] = []
    chain = Sequential(Fixed(0.5, log, "a"), Fixed(0.9, log, "b"))
    assert chain(ACTION, obs()) == 0.9
    assert log == ["a", "b"]


def test_sequential_stops_at_the_first_exact_zero_and_skips_the_rest() -> None:
    log: List[str] = []
    chain = Sequential(Fixed(1.0, log, "a"), Fixed(0.0, log, "b"), Fixed(1.0, log, "c"))
    assert chain(ACTION, obs()) == 0.0
    assert log == ["a", "b"]


def test_sequential_by_default_does_not_stop_at_negative_or_small_scores() -> None:
    """The upstream rule: only exactly 0.0 stops (so a penalty of -1 flows on to the next child)."""
    log: List[str] = []
    assert Sequential(Fixed(-1.0, log, "a"), Fixed(0.7, log, "b"))(ACTION, obs()) == 0.7
    assert log == ["a", "b"]


def test_sequential_with_stop_below_returns_the_failing_score() -> None:
    log: List[str] = []
    chain = Sequential(Fixed(0.9, log, "a"), Fixed(-1.0, log, "b"), Fixed(1.0, log, "c"), stop_below=0.0)
    assert chain(ACTION, obs()) == -1.0
    assert log == ["a", "b"]
    assert Sequential(Fixed(0.3), Fixed(1.0), stop_below=0.5)(ACTION, obs()) == 0.3


def test_sequential_with_stop_below_does_not_stop_at_the_threshold_itself() -> None:
    assert Sequential(Fixed(0.5), Fixed(0.8), stop_below=0.5)(ACTION, obs()) == 0.8


@pytest.mark.parametrize(
    ("aggregate", "expected"),
    [("last", 0.5), ("min", 0.2), ("mean", (0.8 + 0.2 + 0.5) / 3), ("sum", 1.5), ("product", 0.8 * 0.2 * 0.5)],
)
def test_sequential_aggregates_the_scores_when_no_child_fails(aggregate: str, expected: float) -> None:
    chain = Sequential(Fixed(0.8), Fixed(0.2), Fixed(0.5), aggregate=aggregate)
    assert chain(ACTION, obs()) == pytest.approx(expected)


def test_an_empty_sequential_scores_one() -> None:
    assert Sequential()(ACTION, obs()) == 1.0
    assert Sequential(aggregate="sum")(ACTION, obs()) == 1.0


def test_sequential_rejects_unknown_aggregates_and_non_rubrics() -> None:
    with pytest.raises(ValueError, match="aggregate must be one of last, min, mean, sum, product"):
        Sequential(Fixed(1.0), aggregate="max")
    with pytest.raises(TypeError, match="Sequential child 1 must be a Rubric, got function"):
        Sequential(Fixed(1.0), lambda a, o: 1.0)  # type: ignore[arg-type]


def test_sequential_supports_len_indexing_and_iteration_with_numbered_children() -> None:
    a, b = Fixed(1.0), Fixed(0.5)
    chain = Sequential(a, b)
    assert (len(chain), chain[0], chain[-1], list(chain)) == (2, a, b, [a, b])
    assert [name for name, _ in chain.named_children()] == ["rubric_0", "rubric_1"]


def test_children_skipped_by_a_short_circuit_drop_out_of_the_component_scores() -> None:
    gate_value = Fixed(1.0)
    chain = Sequential(gate_value, Fixed(0.6))
    chain(ACTION, obs())
    assert chain.component_scores() == {"rubric_0": 1.0, "rubric_1": 0.6}
    gate_value.score = 0.0
    chain(ACTION, obs())
    assert chain.component_scores() == {"rubric_0": 0.0}  # not a stale 0.6 from the last step
    assert chain[1].last_score is None


async def test_sequential_awaits_async_children_in_order() -> None:
    log: List[str] = []
    chain = Sequential(Fixed(1.0, log, "sync1"), AsyncFixed(0.5, log, "async"), Fixed(0.7, log, "sync2"))
    result = chain(ACTION, obs())
    assert inspect.isawaitable(result)
    assert log == ["sync1"]  # evaluation pauses at the first async child
    assert await result == 0.7
    assert log == ["sync1", "async", "sync2"]
    assert chain.last_score == 0.7


async def test_an_async_child_scoring_zero_stops_the_chain() -> None:
    log: List[str] = []
    chain = Sequential(AsyncFixed(0.0, log, "async"), Fixed(1.0, log, "sync"), AsyncFixed(1.0, log, "later"))
    assert await chain(ACTION, obs()) == 0.0
    assert log == ["async"]


async def test_an_all_sync_sequential_returns_a_float_inside_a_running_loop() -> None:
    result = Sequential(Fixed(0.5), Fixed(0.25))(ACTION, obs())
    assert result == 0.25 and isinstance(result, float)  # a number (that can also be awaited)


# --- Gate -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("score", "expected"), [(0.95, 0.0), (1.0, 1.0), (1.2, 1.2)])
def test_gate_passes_scores_at_or_above_its_threshold(score: float, expected: float) -> None:
    assert Gate(Fixed(score))(ACTION, obs()) == expected


def test_gate_threshold_is_configurable() -> None:
    gate = Gate(Echo(), threshold=0.5)
    assert [gate(ACTION, obs(v)) for v in (0.4, 0.5, 0.9)] == [0.0, 0.5, 0.9]


async def test_gate_of_an_async_child_is_awaitable() -> None:
    assert await Gate(AsyncFixed(0.4), threshold=0.5)(ACTION, obs()) == 0.0
    assert await Gate(AsyncFixed(0.6), threshold=0.5)(ACTION, obs()) == 0.6


def test_gate_needs_a_rubric() -> None:
    with pytest.raises(TypeError, match="Gate's rubric must be a Rubric"):
        Gate(0.5)  # type: ignore[arg-type]


# --- WeightedSum ------------------------------------------------------------------------------------


def test_weighted_sum_is_a_weighted_average() -> None:
    total = WeightedSum([Fixed(1.0), Fixed(0.5), Fixed(0.0)], [0.5, 0.3, 0.2])
    assert total(ACTION, obs()) == pytest.approx(0.65)
    assert total.component_scores() == {"rubric_0": 1.0, "rubric_1": 0.5, "rubric_2": 0.0}


def test_weights_that_do_not_sum_to_one_are_refused_with_the_way_out() -> None:
    with pytest.raises(ValueError, match=r"weights must sum to 1\.0 \(they sum to 1\.2\).*normalized=False"):
        WeightedSum([Fixed(1.0), Fixed(1.0)], [0.6, 0.6])


def test_normalized_false_allows_any_weights_including_penalties() -> None:
    total = WeightedSum([Fixed(1.0), Fixed(1.0)], [1.0, -0.25], normalized=False)
    assert total(ACTION, obs()) == 0.75


def test_weighted_sum_checks_lengths_and_finite_weights() -> None:
    with pytest.raises(ValueError, match="rubrics and weights must match in number: 2 rubrics but 1 weights"):
        WeightedSum([Fixed(1.0), Fixed(1.0)], [1.0])
    with pytest.raises(ValueError, match="must be finite"):
        WeightedSum([Fixed(1.0)], [float("nan")], normalized=False)
    with pytest.raises(TypeError, match="WeightedSum child 0 must be a Rubric"):
        WeightedSum(["nope"], [1.0])  # type: ignore[list-item]


def test_weights_property_is_a_copy() -> None:
    total = WeightedSum([Fixed(1.0), Fixed(0.0)], [0.25, 0.75])
    total.weights[0] = 100.0
    assert total.weights == [0.25, 0.75]
    assert total(ACTION, obs()) == 0.25


async def test_weighted_sum_runs_async_children_concurrently() -> None:
    """Each child waits for the other to start: only concurrent evaluation can finish."""
    started = [asyncio.Event(), asyncio.Event()]

    class Rendezvous(Rubric):
        def __init__(self, me: int, score: float) -> None:
            super().__init__()
            self.me, self.score = me, score

        async def forward(self, action: Any, observation: Any) -> float:
            started[self.me].set()
            await started[1 - self.me].wait()
            return self.score

    total = WeightedSum([Rendezvous(0, 1.0), Rendezvous(1, 0.5), Fixed(0.0)], [0.5, 0.25, 0.25])
    assert await asyncio.wait_for(total(ACTION, obs()), timeout=2.0) == 0.625


# --- RubricList / RubricDict ------------------------------------------------------------------------


def test_rubric_list_holds_numbered_children() -> None:
    a, b, c = Fixed(1.0), Fixed(0.5), Fixed(0.2)
    items = RubricList([a])
    items.append(b)
    items.extend([c])
    assert (len(items), items[1], list(items)) == (3, b, [a, b, c])
    assert [name for name, _ in items.named_rubrics()] == ["0", "1", "2"]
    assert items.get_rubric("2") is c


def test_rubric_list_is_not_callable_and_takes_only_rubrics() -> None:
    with pytest.raises(NotImplementedError, match="RubricList only holds rubrics"):
        RubricList([Fixed(1.0)])(ACTION, obs())
    with pytest.raises(TypeError, match="RubricList item must be a Rubric"):
        RubricList().append(1.0)  # type: ignore[arg-type]


def test_rubric_dict_maps_names_to_children() -> None:
    fmt, length = Fixed(1.0), Fixed(0.5)
    checks = RubricDict({"format": fmt})
    checks["length"] = length
    checks.update({"tone": Fixed(0.1)})
    assert "format" in checks and "style" not in checks
    assert (len(checks), checks["length"], list(checks)) == (3, length, ["format", "length", "tone"])
    assert checks.keys() == ["format", "length", "tone"]
    assert checks.values()[:2] == [fmt, length]
    assert checks.items()[0] == ("format", fmt)
    assert checks.format is fmt  # also an attribute, so dotted paths work
    assert [name for name, _ in checks.named_rubrics(prefix="checks")] == [
        "checks.format",
        "checks.length",
        "checks.tone",
    ]


def test_rubric_dict_refuses_keys_that_are_not_names_or_would_hide_methods() -> None:
    checks = RubricDict()
    for bad in ("two words", "a.b", "_private", ""):
        with pytest.raises(ValueError, match="must be identifiers"):
            checks[bad] = Fixed(1.0)
    for taken in ("reset", "keys", "forward", "last_score"):
        with pytest.raises(ValueError, match=f"would hide the attribute RubricDict.{taken}"):
            checks[taken] = Fixed(1.0)
    with pytest.raises(NotImplementedError, match="RubricDict only holds rubrics"):
        checks(ACTION, obs())


def test_containers_inside_a_rubric_give_full_component_names() -> None:
    class Grader(Rubric):
        def __init__(self) -> None:
            super().__init__()
            self.checks = RubricDict({"syntax": Fixed(1.0), "tests": Fixed(0.5)})

        def forward(self, action: Any, observation: Any) -> float:
            return min(self.checks["syntax"](action, observation), self.checks["tests"](action, observation))

    grader = Grader()
    assert grader(ACTION, obs()) == 0.5
    assert grader.component_scores() == {"checks.syntax": 1.0, "checks.tests": 0.5}


# --- reset and state_dict ---------------------------------------------------------------------------


def test_reset_reaches_every_descendant() -> None:
    leaves = [Fixed(1.0), Fixed(1.0), Fixed(1.0)]
    tree = Sequential(Gate(leaves[0]), WeightedSum(leaves[1:], [0.5, 0.5]))
    tree.reset()
    assert [leaf.resets for leaf in leaves] == [1, 1, 1]


async def test_reset_async_resets_too() -> None:
    leaf = Fixed(1.0)
    await Gate(leaf).reset_async()
    assert leaf.resets == 1


def build_tree() -> Sequential:
    return Sequential(
        Gate(Echo(), threshold=0.5),
        WeightedSum([Echo(), Fixed(1.0)], [0.5, 0.5]),
        stop_below=0.1,
        aggregate="mean",
    )


def test_state_dict_holds_the_configuration_of_the_whole_tree() -> None:
    assert build_tree().state_dict() == {
        "stop_below": 0.1,
        "aggregate": "mean",
        "rubric_0": {"threshold": 0.5},
        "rubric_1": {"weights": [0.5, 0.5], "normalized": True},
    }


def test_state_dict_round_trip_restores_behaviour() -> None:
    tuned = build_tree()
    tuned.load_state_dict(
        {
            "aggregate": "last",
            "rubric_0": {"threshold": 0.9},
            "rubric_1": {"weights": [2.0, -1.0], "normalized": False},
        }
    )
    saved = tuned.state_dict()
    fresh = build_tree()
    assert fresh(ACTION, obs(0.6)) == pytest.approx((0.6 + 0.8) / 2)
    fresh.load_state_dict(saved)
    assert fresh.state_dict() == saved
    assert fresh(ACTION, obs(0.95)) == pytest.approx(2 * 0.95 - 1.0)
    assert fresh(ACTION, obs(0.6)) == 0.0  # the gate now needs 0.9


def test_loading_weights_that_break_the_sum_rule_is_refused() -> None:
    total = WeightedSum([Fixed(1.0), Fixed(1.0)], [0.5, 0.5])
    with pytest.raises(ValueError, match="sum to 3"):
        total.load_state_dict({"weights": [1.0, 2.0]})
    with pytest.raises(ValueError, match="2 rubrics but 3 weights"):
        total.load_state_dict({"weights": [0.2, 0.3, 0.5]})
    assert total.weights == [0.5, 0.5]


# --- delayed rewards: trajectory rubrics -----------------------------------------------------------


class FinalValue(TrajectoryRubric):
    """Scores an episode by its final observation's value, credit spread evenly."""

    def score_trajectory(self, trajectory: List[Tuple[Any, Any]]) -> float:
        return float(trajectory[-1][1].value)

    def compute_step_rewards(self) -> List[float]:
        steps = self.trajectory
        return [self.final_score / len(steps)] * len(steps) if steps and self.final_score is not None else []


def test_trajectory_rubric_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        TrajectoryRubric()  # type: ignore[abstract]


def test_intermediate_reward_until_done_then_the_episode_score() -> None:
    rubric = FinalValue(intermediate_reward=-0.01)
    scores = [rubric(ACTION, obs(v)) for v in (1.0, 2.0)] + [rubric(ACTION, obs(6.0, done=True))]
    assert scores == [-0.01, -0.01, 6.0]
    assert [o.value for _, o in rubric.trajectory] == [1.0, 2.0, 6.0]
    assert rubric.compute_step_rewards() == [2.0, 2.0, 2.0]


def test_trajectory_property_is_a_copy() -> None:
    rubric = FinalValue()
    rubric(ACTION, obs(1.0))
    rubric.trajectory.clear()
    assert len(rubric.trajectory) == 1


def test_reset_clears_the_trajectory() -> None:
    rubric = FinalValue()
    rubric(ACTION, obs(1.0))
    rubric(ACTION, obs(2.0, done=True))
    rubric.reset()
    assert (rubric.trajectory, rubric.final_score, rubric.compute_step_rewards()) == ([], None, [])


def test_a_step_after_a_done_step_starts_a_new_trajectory() -> None:
    rubric = FinalValue()
    rubric(ACTION, obs(1.0, done=True))
    rubric(ACTION, obs(4.0))
    assert [o.value for _, o in rubric.trajectory] == [4.0]
    assert rubric.final_score is None


def test_trajectories_are_bounded_and_say_what_they_dropped(caplog: pytest.LogCaptureFixture) -> None:
    rubric = FinalValue(max_steps=3)
    with caplog.at_level(logging.WARNING, logger="openenv.core.rubrics.trajectory"):
        for value in range(1, 7):
            rubric(ACTION, obs(float(value)))
    assert [o.value for _, o in rubric.trajectory] == [4.0, 5.0, 6.0]
    assert rubric.dropped_steps == 3
    assert len([r for r in caplog.records if "keeps at most 3 steps" in r.getMessage()]) == 1
    rubric.reset()
    assert rubric.dropped_steps == 0


def test_max_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_steps must be at least 1"):
        FinalValue(max_steps=0)


def test_exponential_discounting_credits_earlier_steps_less() -> None:
    rubric = ExponentialDiscountingTrajectoryRubric(gamma=0.5)
    assert rubric.compute_step_rewards() == []
    assert rubric(ACTION, obs(reward=0.3)) == 0.0
    assert rubric(ACTION, obs(reward=0.1)) == 0.0
    assert rubric(ACTION, obs(done=True, reward=8.0)) == 8.0  # the final observation's reward
    assert rubric.compute_step_rewards() == [2.0, 4.0, 8.0]


def test_exponential_discounting_uses_a_custom_episode_score() -> None:
    class Length(ExponentialDiscountingTrajectoryRubric):
        def score_trajectory(self, trajectory: List[Tuple[Any, Any]]) -> float:
            return float(len(trajectory))

    rubric = Length(gamma=1.0, intermediate_reward=0.5)
    assert [rubric(ACTION, obs(done=d)) for d in (False, True)] == [0.5, 2.0]
    assert rubric.compute_step_rewards() == [2.0, 2.0]


def test_discounting_over_a_bounded_trajectory_covers_the_kept_steps() -> None:
    rubric = ExponentialDiscountingTrajectoryRubric(gamma=0.5, max_steps=2)
    for done in (False, False, False, True):
        rubric(ACTION, obs(done=done, reward=4.0 if done else None))
    assert (rubric.dropped_steps, rubric.compute_step_rewards()) == (2, [2.0, 4.0])


@pytest.mark.parametrize("gamma", [-0.1, 1.5])
def test_gamma_must_lie_in_the_unit_interval(gamma: float) -> None:
    with pytest.raises(ValueError, match="gamma must be within"):
        ExponentialDiscountingTrajectoryRubric(gamma=gamma)
    with pytest.raises(ValueError, match="gamma must be within"):
        ExponentialDiscountingTrajectoryRubric().load_state_dict({"gamma": gamma})


def test_trajectory_state_dict_round_trip() -> None:
    rubric = ExponentialDiscountingTrajectoryRubric(gamma=0.9, intermediate_reward=-0.1, max_steps=50)
    rubric(ACTION, obs())
    saved = rubric.state_dict()
    assert saved == {"gamma": 0.9, "intermediate_reward": -0.1, "max_steps": 50}  # config, not the episode
    fresh = ExponentialDiscountingTrajectoryRubric()
    fresh.load_state_dict(saved)
    assert fresh.state_dict() == saved
    assert fresh(ACTION, obs()) == -0.1


def test_a_container_resets_its_trajectory_children() -> None:
    trajectory = FinalValue()
    total = WeightedSum([trajectory, Fixed(1.0)], [0.5, 0.5])
    total(ACTION, obs(1.0))
    total.reset()
    assert trajectory.trajectory == []


# --- LLMJudge: reading replies ---------------------------------------------------------------------


class Unused(OpenAIClient):
    def __init__(self) -> None:
        super().__init__("http://127.0.0.1", 9, "unused")


def judge(**kwargs: Any) -> LLMJudge:
    return LLMJudge("Rate {action} given {observation}.", Unused(), **kwargs)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Reasoning... <score>0.8</score>", 0.8),
        ("<score> 7 / 10 </score>", 0.7),
        ('```json\n{"reasoning": "fine", "score": 0.5}\n```', 0.5),
        ("Score: 0.3", 0.3),
        ("**Final score:** 9 out of 10", 0.9),
        ("Rating = 3/4", 0.75),
        ("I would give it 8/10.", 0.8),
        ("On a 0-1 scale this deserves 0.65", 0.65),  # not the 0 of the echoed scale
        ("Scores range 0 to 1; it is clearly a 0.2 because step 3 failed", 0.2),
        ("<score>1.7</score>", 1.0),  # clamped into the range
        ("score: -3", 0.0),
    ],
)
def test_judge_reads_the_score_a_reply_gives(reply: str, expected: float) -> None:
    assert judge().parse_score(reply) == pytest.approx(expected)


def test_tags_win_over_other_numbers_and_the_last_occurrence_counts() -> None:
    assert judge().parse_score("Score: 0.1 (draft). Revised: <score>0.4</score> <score>0.6</score>") == 0.6


@pytest.mark.parametrize(
    ("reply", "expected"),
    [("Score: 7", 0.7), ("Score: 7/10", 0.7), ("It merits 4 out of 5", 0.8), ("<score>12</score>", 1.0)],
)
def test_a_score_range_normalizes_to_the_unit_interval(reply: str, expected: float) -> None:
    assert judge(score_range=(0, 10)).parse_score(reply) == pytest.approx(expected)


def test_without_normalize_scores_stay_on_the_range_scale() -> None:
    ten = judge(score_range=(1, 10), normalize=False)
    assert [ten.parse_score(r) for r in ("Score: 7", "8/10", "<score>42</score>", "The answer: 0.5")] == [
        7.0,
        pytest.approx(8.2),
        10.0,
        None,
    ]


def test_a_custom_pattern_takes_its_first_match() -> None:
    custom = judge(score_pattern=r"VERDICT=(\d+)", score_range=(0, 100))
    assert custom.parse_score("VERDICT=85 VERDICT=10 Score: 1") == 0.85
    assert custom.parse_score("Score: 1") is None


def test_without_normalize_or_a_range_the_number_read_is_the_score() -> None:
    """As upstream's LLMJudge(normalize=False): no scale to clamp to, so 7 stays 7."""
    raw = judge(normalize=False)
    assert [raw.parse_score(r) for r in ("Score: 7", "<score>42</score>", "I'd say 3.5", "8/10")] == [
        7.0,
        42.0,
        3.5,
        pytest.approx(0.8),
    ]
    assert raw.parse_score("score: -3") == -3.0
    assert raw.state_dict()["score_range"] is None


def test_a_custom_pattern_without_normalize_keeps_its_number() -> None:
    custom = judge(score_pattern=r"VERDICT=(\d+)", normalize=False)
    assert custom.parse_score("VERDICT=85 then Score: 1") == 85.0
    assert custom.parse_score("Score: 1") is None  # nothing else is tried
    either = judge(score_pattern=r"score=(\d+)|rating=(\d+)", normalize=False)
    assert either.parse_score("rating=7") == 7.0  # the group that took part in the match
    assert judge(score_pattern=r"score=(\d+)|rating=(\d+)").parse_score("rating=7") == 1.0  # normalized: clamped


def test_nothing_in_range_parses_to_none() -> None:
    assert judge().parse_score("I cannot judge this.") is None
    assert judge().parse_score("There are 12 issues in 40 lines") is None


def test_prompt_templates_may_only_use_action_and_observation() -> None:
    assert judge().render_prompt("A", "O") == "Rate A given O."
    assert LLMJudge('Answer as {{"score": x}} for {action}', Unused()).render_prompt("A", "O") == (
        'Answer as {"score": x} for A'
    )
    with pytest.raises(ValueError, match=r"only use \{action\} and \{observation\}, found \['reference'\]"):
        LLMJudge("{action} vs {reference}", Unused())
    with pytest.raises(ValueError, match="literal braces"):
        LLMJudge('Reply {"score": x}', Unused())


def test_judge_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="lo < hi"):
        judge(score_range=(1, 1))
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'default'"):
        judge(on_error="ignore")


def test_judge_state_dict_round_trip_without_the_client() -> None:
    tuned = LLMJudge("Judge {action}", Unused(), score_range=(0, 10), default_score=0.1, on_error="default")
    saved = tuned.state_dict()
    assert saved == {
        "prompt_template": "Judge {action}",
        "score_pattern": None,
        "default_score": 0.1,
        "normalize": True,
        "score_range": [0.0, 10.0],
        "on_error": "default",
    }
    fresh = judge()
    fresh.load_state_dict(saved)
    assert fresh.state_dict() == saved
    assert fresh.parse_score("Score: 5") == 0.5


# --- LLMJudge against a real OpenAI-compatible server ----------------------------------------------


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with fake_llm_server() as fake:
        yield fake


async def test_judge_asks_the_model_and_scores_its_reply(llm: FakeLLM) -> None:
    llm.script("The code compiles but one test fails. <score>6</score>")
    client = OpenAIClient(llm.base_url, None, "judge")
    rubric = LLMJudge("Action: {action}\nResult: {observation.value}", client, score_range=(0, 10))
    assert await rubric(CounterAction(delta=3), obs(4.0)) == pytest.approx(0.6)
    assert llm.last_body["messages"] == [
        {"role": "user", "content": "Action: metadata={} delta=3 sleep_s=0.0 fail=False\nResult: 4.0"}
    ]
    assert (rubric.last_reply, rubric.last_error, rubric.last_score) == (
        "The code compiles but one test fails. <score>6</score>",
        None,
        pytest.approx(0.6),
    )


async def test_a_judge_without_normalize_scores_what_the_model_says(llm: FakeLLM) -> None:
    llm.script("Solid work. SCORE=8.5 (of 10)", "Meh. Score: 4")
    client = OpenAIClient(llm.base_url, None, "judge")
    custom = LLMJudge("{action}", client, score_pattern=r"SCORE=([\d.]+)", normalize=False)
    assert await custom(ACTION, obs()) == 8.5
    assert await LLMJudge("{action}", client, normalize=False)(ACTION, obs()) == 4.0


async def test_an_unparseable_reply_gives_the_default_and_is_recorded(llm: FakeLLM) -> None:
    llm.script("I'd rather not say.", "Score: 1")
    rubric = LLMJudge("{action}", OpenAIClient(llm.base_url, None, "judge"), default_score=0.25)
    assert await rubric(ACTION, obs()) == 0.25
    assert rubric.parse_failures == 1
    assert 'no score found in the reply: "I\'d rather not say."' in (rubric.last_error or "")
    assert await rubric(ACTION, obs()) == 1.0
    assert (rubric.parse_failures, rubric.last_error) == (1, None)


async def test_a_failing_endpoint_raises_by_default(llm: FakeLLM) -> None:
    llm.script(Scripted(body={"error": "overloaded"}, status=503))
    rubric = LLMJudge("{action}", OpenAIClient(llm.base_url, None, "judge"))
    with pytest.raises(LLMError, match="HTTP 503"):
        await rubric(ACTION, obs())


async def test_on_error_default_scores_the_default_and_records_the_error() -> None:
    client = OpenAIClient("http://127.0.0.1", closed_port(), "judge", timeout_s=5)
    rubric = LLMJudge("{action}", client, default_score=-1.0, on_error="default")
    assert await rubric(ACTION, obs()) == -1.0
    assert rubric.request_errors == 1
    assert (rubric.last_error or "").startswith("request failed: LLMError: cannot reach")


async def test_judges_in_a_weighted_sum_are_asked_concurrently(llm: FakeLLM) -> None:
    llm.script(Scripted(body={"choices": [{"message": {"content": "<score>1</score>"}}]}, delay_s=0.5))
    llm.script(Scripted(body={"choices": [{"message": {"content": "<score>0</score>"}}]}, delay_s=0.5))
    client = OpenAIClient(llm.base_url, None, "judge")
    total = WeightedSum([LLMJudge("a {action}", client), LLMJudge("b {action}", client)], [0.5, 0.5])
    started = asyncio.get_running_loop().time()
    assert await total(ACTION, obs()) == 0.5
    assert asyncio.get_running_loop().time() - started < 0.9  # two 0.5 s replies, side by side
    assert sorted(r["body"]["messages"][0]["content"][0] for r in llm.requests) == ["a", "b"]


# --- environments: applying rubrics and reporting reward components --------------------------------


class ScoredEnv(Environment[CounterAction, CounterObservation, CounterState]):
    """A counter whose reward comes from its rubric; done at 10."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, rubric: Optional[Rubric] = None) -> None:
        super().__init__(rubric=rubric if rubric is not None else counter_rubric())
        self._state = CounterState(episode_id="e", step_count=0, value=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CounterObservation:
        self._reset_rubric()
        self._state = CounterState(episode_id=episode_id or "e", step_count=0, value=0)
        return CounterObservation(value=0, reward=0.0)

    def step(self, action: CounterAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        self._state.step_count += 1
        self._state.value += action.delta
        observation = CounterObservation(value=self._state.value, done=self._state.value >= 10)
        observation.reward = self._apply_rubric(action, observation)
        return observation

    @property
    def state(self) -> CounterState:
        return self._state


class ReportingEnv(ScoredEnv):
    REPORT_REWARD_COMPONENTS = True


class Progress(Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        return min(observation.value / 10, 1.0)


class BigStep(Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        return 1.0 if action.delta > 3 else 0.0


class CounterRubric(Rubric):
    """Progress towards 10, minus a penalty for big steps."""

    def __init__(self) -> None:
        super().__init__()
        self.progress = Progress()
        self.penalty = WeightedSum([BigStep()], [0.5], normalized=False)

    def forward(self, action: Any, observation: Any) -> float:
        return self.progress(action, observation) - self.penalty(action, observation)


def counter_rubric() -> Rubric:
    return CounterRubric()


def scored_app(env: Any) -> Any:
    return create_app(env, CounterAction, CounterObservation, env_name="scored", state_cls=CounterState)


def test_apply_rubric_leaves_metadata_alone_unless_the_env_opts_in() -> None:
    env = ScoredEnv()
    env.reset()
    observation = env.step(CounterAction(delta=5))
    assert observation.reward == pytest.approx(0.0)
    assert observation.metadata == {}


def test_apply_rubric_reports_named_components_when_the_env_opts_in() -> None:
    env = ReportingEnv()
    env.reset()
    observation = env.step(CounterAction(delta=2))
    assert observation.reward == pytest.approx(0.2)
    assert observation.metadata["reward_components"] == {
        "progress": pytest.approx(0.2),
        "penalty": 0.0,
        "penalty.rubric_0": 0.0,
    }


def test_apply_rubric_runs_an_async_rubric_outside_an_event_loop() -> None:
    env = ReportingEnv(rubric=Sequential(Fixed(1.0), AsyncFixed(0.4)))
    env.reset()
    observation = env.step(CounterAction(delta=1))
    assert observation.reward == 0.4
    assert observation.metadata["reward_components"] == {"rubric_0": 1.0, "rubric_1": 0.4}


async def test_apply_rubric_inside_an_event_loop_points_to_the_async_helper() -> None:
    env = ScoredEnv(rubric=AsyncFixed(0.4))
    with pytest.raises(TypeError, match=r"await self._apply_rubric_async\(action, observation\)"):
        env._apply_rubric(CounterAction(), CounterObservation())
    observation = CounterObservation()
    assert await env._apply_rubric_async(CounterAction(), observation) == 0.4


async def test_apply_rubric_async_reports_components_too() -> None:
    env = ReportingEnv(rubric=WeightedSum([AsyncFixed(1.0), Fixed(0.5)], [0.5, 0.5]))
    observation = CounterObservation()
    assert await env._apply_rubric_async(CounterAction(), observation) == 0.75
    assert observation.metadata["reward_components"] == {"rubric_0": 1.0, "rubric_1": 0.5}


def test_a_plain_callable_rubric_still_works_with_reporting_on() -> None:
    env = ReportingEnv(rubric=lambda action, observation: 0.5)  # type: ignore[arg-type]
    observation = CounterObservation()
    assert env._apply_rubric(CounterAction(), observation) == 0.5
    assert "reward_components" not in observation.metadata


async def test_reward_components_reach_the_client_beside_the_reward() -> None:
    with serve(scored_app(ReportingEnv)) as server:
        async with CounterClient(base_url=server.base_url) as client:
            await client.reset()
            first = await client.step(CounterAction(delta=2))
            second = await client.step(CounterAction(delta=5))
    assert first.reward == pytest.approx(0.2)
    assert first.metadata["reward_components"] == {"progress": 0.2, "penalty": 0.0, "penalty.rubric_0": 0.0}
    assert second.reward == pytest.approx(0.2)
    assert second.metadata["reward_components"] == {"progress": 0.7, "penalty": 0.5, "penalty.rubric_0": 1.0}


async def test_a_server_env_without_reporting_sends_only_the_reward() -> None:
    with serve(scored_app(ScoredEnv)) as server:
        async with CounterClient(base_url=server.base_url) as client:
            await client.reset()
            result = await client.step(CounterAction(delta=2))
    assert result.reward == pytest.approx(0.2)
    assert "reward_components" not in (result.metadata or {})


async def test_an_llm_judged_env_served_end_to_end(llm: FakeLLM) -> None:
    """Client → env server → sync step in the worker pool → LLMJudge → the scripted LLM server."""
    llm.script("Decent progress. Score: 4/10", "Reached the goal. <score>10</score>")
    judge_client = OpenAIClient(llm.base_url, None, "judge")

    def make_env() -> ReportingEnv:
        quality = LLMJudge("Counter now {observation.value} after {action.delta}", judge_client, score_range=(0, 10))
        return ReportingEnv(rubric=Sequential(Gate(Progress(), threshold=0.0), quality))

    with serve(scored_app(make_env)) as server:
        async with CounterClient(base_url=server.base_url) as client:
            await client.reset()
            first = await client.step(CounterAction(delta=4))
            last = await client.step(CounterAction(delta=6))
    assert (first.reward, last.reward, last.done) == (pytest.approx(0.4), 1.0, True)
    assert last.metadata["reward_components"] == {"rubric_0": 1.0, "rubric_0.rubric": 1.0, "rubric_1": 1.0}
    assert [r["body"]["messages"][0]["content"] for r in llm.requests] == [
        "Counter now 4 after 4",
        "Counter now 10 after 6",
    ]


class _ToolSucceeded(Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        return 0.0 if getattr(observation, "error", None) else 1.0


class _ToolCallCost(Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        return 0.25


def test_an_mcp_environment_reports_reward_components_of_tool_calls() -> None:
    from openenv.core.env_server.mcp_types import CallToolAction

    from .envs import ToolEnv

    class ScoredTools(ToolEnv):
        REPORT_REWARD_COMPONENTS = True

    env = ScoredTools()
    env.rubric = WeightedSum([_ToolSucceeded(), _ToolCallCost()], [1.0, -1.0], normalized=False)
    env.reset()
    observation = env.step(CallToolAction(tool_name="add", arguments={"a": 1}))
    assert observation.reward == pytest.approx(0.75)
    assert observation.metadata["reward_components"] == {"rubric_0": 1.0, "rubric_1": 0.25}
    failed = env.step(CallToolAction(tool_name="boom", arguments={}))
    assert failed.reward == pytest.approx(-0.25)
    assert failed.metadata["reward_components"] == {"rubric_0": 0.0, "rubric_1": 0.25}
    env.close()
