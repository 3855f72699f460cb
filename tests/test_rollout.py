"""openenv.core.rollout: many episodes over concurrent sessions of real servers."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import pytest

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.generic_client import GenericEnvClient
from openenv.core.rollout import BatchedPolicy, Episode, group_advantages, rollout, rollout_async

from .conftest import counter_app, serve
from .envs import TRACKER

OPENSPIEL = Path(__file__).resolve().parents[1] / "envs" / "openspiel_env"


def step_by(delta: int):
    return lambda observation, episode: {"delta": delta}


def test_a_sync_policy_plays_every_episode_to_the_end(counter_server) -> None:
    result = rollout(counter_server.base_url, step_by(4), [{"seed": s} for s in range(5)], concurrency=2)

    assert [e.index for e in result.episodes] == [0, 1, 2, 3, 4]
    for seed, episode in enumerate(result.episodes):
        values = [o["value"] for o in episode.observations]
        assert values[0] == seed % 5 and values[-1] >= 10
        assert values == [seed + 4 * i for i in range(len(values))]
        assert episode.actions == [{"delta": 4}] * (len(values) - 1)
        assert episode.rewards == [4.0] * (len(values) - 1)
        assert episode.done and not episode.truncated and episode.ok
    summary = result.summary
    assert summary.episodes == summary.completed == 5 and summary.errors == 0
    assert summary.steps == sum(len(e.rewards) for e in result.episodes)
    returns = [e.total_return for e in result.episodes]
    assert summary.mean_return == pytest.approx(statistics.fmean(returns))
    assert summary.std_return == pytest.approx(statistics.pstdev(returns))
    assert summary.success_rate is None
    assert summary.episodes_per_s > 0 and summary.steps_per_s > 0


async def test_concurrency_sessions_play_at_the_same_time(counter_server) -> None:
    in_flight, peak = 0, 0

    async def slow_policy(observation, episode):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return {"delta": 10}

    began = time.perf_counter()
    result = await rollout_async(counter_server.base_url, slow_policy, 12, concurrency=4)
    elapsed = time.perf_counter() - began

    assert peak == 4
    assert {e.session for e in result.episodes} == {0, 1, 2, 3}
    assert TRACKER.created == 4  # one environment per session, reused by its episodes
    assert elapsed < 12 * 0.05  # 3 rounds of 4, not 12 one after the other
    assert all(e.ok and e.done for e in result.episodes)


async def test_the_steps_of_concurrent_sessions_overlap_on_the_server(counter_server) -> None:
    slow_step = {"delta": 10, "sleep_s": 0.2}  # the server's environment blocks 0.2 s in step
    began = time.perf_counter()
    result = await rollout_async(
        counter_server.base_url, lambda o, e: slow_step, 4, concurrency=4, client_cls=GenericEnvClient
    )
    elapsed = time.perf_counter() - began

    spans = [(e.started_at, e.started_at + e.duration_s) for e in result.episodes]
    assert max(start for start, _ in spans) < min(end for _, end in spans)  # all four open at one moment
    assert elapsed < 4 * 0.2


def test_max_steps_truncates_an_episode(counter_server) -> None:
    result = rollout(counter_server.base_url, step_by(1), [{"seed": 0}], max_steps=3)

    (episode,) = result.episodes
    assert episode.truncated and not episode.done
    assert len(episode.actions) == 3 and len(episode.observations) == 4
    assert result.summary.truncated == 1


def test_groups_repeat_each_reset_and_start_identically(counter_server) -> None:
    rng = random.Random(0)
    result = rollout(
        counter_server.base_url,
        lambda observation, episode: {"delta": rng.choice([1, 2, 3, 5])},
        [{"seed": 2}, {"seed": 4}],
        group_size=3,
        concurrency=3,
    )

    groups = [[e for e in result.episodes if e.group == g] for g in (0, 1)]
    assert [len(g) for g in groups] == [3, 3]
    assert {e.observations[0]["value"] for e in groups[0]} == {2}
    assert {e.observations[0]["value"] for e in groups[1]} == {4}
    assert all(e.reset_kwargs == {"seed": 2} for e in groups[0])

    advantages = result.advantages()
    for group in groups:
        values = [advantages[e.index] for e in group]
        returns = [e.total_return for e in group]
        assert sum(values) == pytest.approx(0.0, abs=1e-6)
        if len(set(returns)) > 1:
            assert statistics.pstdev(values) == pytest.approx(1.0, rel=1e-3)
            best = max(group, key=lambda e: e.total_return)
            assert advantages[best.index] > 0


def test_group_advantages_normalise_within_each_group_only() -> None:
    advantages = group_advantages([1.0, -1.0, 0.0, 0.0, 5.0, 5.0], ["a", "a", "b", "b", "c", "c"])
    assert advantages[0] == pytest.approx(1.0, rel=1e-4) and advantages[1] == pytest.approx(-1.0, rel=1e-4)
    assert advantages[2:] == [0.0, 0.0, 0.0, 0.0]
    assert group_advantages([3.0, 1.0], [0, 0], scale=False) == [1.0, -1.0]
    with pytest.raises(ValueError, match="2 returns but 1 group"):
        group_advantages([1.0, 2.0], [0])


def test_episodes_are_written_as_jsonl(counter_server, tmp_path: Path) -> None:
    path = tmp_path / "out" / "episodes.jsonl"
    result = rollout(counter_server.base_url, step_by(5), [{"seed": 1}, {"seed": 3}], group_size=2, jsonl_path=path)

    records = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["index"])
    assert [r["index"] for r in records] == [0, 1, 2, 3]
    for record, episode in zip(records, result.episodes, strict=True):
        assert record["group"] == episode.group and record["reset_kwargs"] == episode.reset_kwargs
        assert [o["value"] for o in record["observations"]] == [o["value"] for o in episode.observations]
        assert record["actions"] == [{"delta": 5}] * len(record["rewards"])
        assert record["return"] == sum(record["rewards"]) == episode.total_return
        assert record["done"] is True and record["error"] is None
        assert len(record["step_s"]) == len(record["rewards"]) and record["duration_s"] > 0


def test_a_failing_episode_is_recorded_and_the_others_go_on(counter_server) -> None:
    def policy(observation, episode: Episode):
        return {"delta": 10, "fail": episode.group == 1}

    result = rollout(counter_server.base_url, policy, [{"seed": 0}, {"seed": 1}, {"seed": 2}], concurrency=1)

    failed = result.episodes[1]
    assert failed.error is not None and "the step failed on purpose" in failed.error
    assert failed.actions == [{"delta": 10, "fail": True}] and failed.rewards == []
    assert [e.ok and e.done for e in result.episodes] == [True, False, True]
    assert result.summary.errors == 1 and result.summary.completed == 2
    assert result.advantages()[1] == 0.0


def test_a_session_lost_in_one_episode_does_not_fail_the_next(counter_server) -> None:
    """A reply that never comes drops the client's connection (its server session ends); the
    episodes after it on the same worker get a fresh session instead of failing in turn."""

    def factory():
        return GenericEnvClient(base_url=counter_server.base_url, message_timeout_s=0.3)

    def policy(observation, episode: Episode):
        return {"delta": 10, "sleep_s": 1.0 if episode.group == 0 else 0.0}

    result = rollout(factory, policy, [{"seed": 0}, {"seed": 1}, {"seed": 2}], concurrency=1)
    assert result.episodes[0].error is not None and "Timeout" in result.episodes[0].error
    assert [e.ok and e.done for e in result.episodes] == [False, True, True]


def test_a_session_whose_server_went_away_asks_the_factory_for_a_fresh_client() -> None:
    """After its connection is lost a session opens its next client from the factory again (a
    pool hands out one of a replica that answers) instead of retrying the server that went away."""
    with serve(counter_app()) as first, serve(counter_app()) as second:
        current, opened = [first.base_url], []

        def factory():
            opened.append(current[0])
            return GenericEnvClient(base_url=current[0])

        def policy(observation, episode: Episode):
            if episode.index == 0 and episode.step == 1:
                current[0] = second.base_url
                first.stop()
            return {"delta": 4}

        result = rollout(factory, policy, [{"seed": 0}, {"seed": 1}, {"seed": 2}], concurrency=1, policy_in_thread=True)
    # (stopped on purpose, the server said so: ServerStoppedError, a SessionLostError)
    assert result.episodes[0].error is not None and "ServerStoppedError" in result.episodes[0].error
    assert [e.ok and e.done for e in result.episodes] == [False, True, True]
    assert opened == [first.base_url, second.base_url]


def test_a_policy_exception_is_recorded(counter_server) -> None:
    def policy(observation, episode):
        if observation["value"] == 3:
            raise RuntimeError("no idea what to do")
        return {"delta": 10}

    result = rollout(counter_server.base_url, policy, [{"seed": 2}, {"seed": 3}])
    assert result.episodes[0].ok
    assert result.episodes[1].error == "RuntimeError: no idea what to do"


def test_on_error_raise_stops_the_rollout(counter_server) -> None:
    with pytest.raises(Exception, match="the step failed on purpose"):
        rollout(counter_server.base_url, lambda o, e: {"fail": True}, 4, on_error="raise", concurrency=2)


def test_success_rate_counts_episodes_the_predicate_accepts(counter_server) -> None:
    result = rollout(
        counter_server.base_url, step_by(10), [{"seed": s} for s in range(4)], success=lambda e: e.total_return > 0
    )
    assert result.summary.success_rate == 1.0
    result = rollout(
        counter_server.base_url, step_by(10), [{"seed": s} for s in range(4)], success=lambda e: e.group < 1
    )
    assert result.summary.success_rate == 0.25


async def test_a_batched_policy_answers_concurrent_sessions_together(counter_server) -> None:
    calls = []

    def forward(observations, episodes):
        calls.append(len(observations))
        return [{"delta": 10} for _ in observations]

    policy = BatchedPolicy(forward, max_batch=4, max_wait_s=0.01)
    result = await rollout_async(counter_server.base_url, policy, 16, concurrency=4)

    assert all(e.ok and e.done for e in result.episodes)
    assert sum(calls) == 16 and max(calls) > 1
    assert policy.batch_sizes == calls


def test_the_progress_bar_goes_to_stderr(counter_server, capsys) -> None:
    rollout(counter_server.base_url, step_by(10), 3, progress=True)
    captured = capsys.readouterr()
    assert "rollout" in captured.err and "3/3" in captured.err
    assert captured.out == ""


async def test_rollout_can_be_called_from_a_running_event_loop(counter_server) -> None:
    result = rollout(counter_server.base_url, step_by(10), 2)
    assert result.summary.completed == 2


def test_a_client_factory_over_a_unix_socket() -> None:
    with serve(counter_app(), uds=True) as server:
        url = server.base_url
        result = rollout(lambda: GenericEnvClient(base_url=url), step_by(10), 3, concurrency=3)
    assert result.summary.completed == 3


def test_more_sessions_than_the_server_holds_wait_for_a_free_one_and_every_episode_is_played() -> None:
    with serve(counter_app(max_concurrent_envs=2)) as server:
        result = rollout(server.base_url, step_by(4), 16, concurrency=8, max_steps=3)
    failed = [episode.error for episode in result.episodes if episode.error]
    assert failed == [] and result.summary.completed == 16, failed[:3]
    assert all(len(episode.rewards) == 3 and episode.observations for episode in result.episodes)
    assert len({episode.session for episode in result.episodes}) >= 2


def test_a_server_full_of_other_sessions_fails_the_episodes_after_the_capacity_timeout() -> None:
    with serve(counter_app(max_concurrent_envs=1)) as server:
        holder = GenericEnvClient(base_url=server.base_url).sync()
        with holder:
            holder.reset()  # someone else's session holds the only slot
            began = time.perf_counter()
            result = rollout(server.base_url, step_by(1), 2, concurrency=2, max_steps=1, capacity_timeout_s=0.5)
            took = time.perf_counter() - began
    assert [e.error is not None for e in result.episodes] == [True, True]
    assert "the server stayed full" in result.episodes[0].error and "capacity_timeout_s" in result.episodes[0].error
    assert took < 10  # not the default minute


@pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
def test_openspiel_blackjack_in_the_sandbox_groups_share_the_deal() -> None:
    from openspiel_env import OpenSpielAction, OpenSpielEnv

    def hit_below_15(observation, episode):
        return OpenSpielAction(action_id=0 if observation.metadata["player_total"] < 15 else 1)

    with OpenSpielEnv.from_env(str(OPENSPIEL)).sync() as env:
        assert env.async_client.base_url.startswith("unix://")
        deals = [{"seed": 1000 + s, "game_name": "blackjack"} for s in range(6)]
        result = rollout(env, hit_below_15, deals, group_size=4, concurrency=4, success=lambda e: e.total_return > 0)

    assert result.summary.completed == 24 and result.summary.errors == 0
    assert {e.session for e in result.episodes} == {0, 1, 2, 3}
    for g in range(6):
        group = [e for e in result.episodes if e.group == g]
        # the same deal, and (a deterministic policy) the same game, in every episode of a group
        assert len({e.observations[0].text for e in group}) == 1
        assert len({e.observations[-1].text for e in group}) == 1
        assert all(e.done and e.total_return in (-1.0, 0.0, 1.0) for e in group)
    assert len({result.episodes[4 * g].observations[0].text for g in range(6)}) > 1
    wins = sum(e.total_return > 0 for e in result.episodes) / 24
    assert result.summary.success_rate == pytest.approx(wins)
