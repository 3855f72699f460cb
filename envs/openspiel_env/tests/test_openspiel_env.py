"""The OpenSpiel environment, served in the sandbox (SandboxProvider) and driven through OpenSpielEnv."""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Iterator

import pyspiel
import pytest
from openspiel_env import OpenSpielAction, OpenSpielEnv, OpenSpielObservation, OpenSpielState
from openspiel_env.server.describe import blackjack_card, blackjack_total
from openspiel_env.server.openspiel_environment import OpenSpielEnvironment

from openenv.core.client_errors import ActionValidationError, EnvironmentExecutionError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap

PACKAGE = Path(__file__).resolve().parents[1]
HIT, STAND = 0, 1

needs_sandbox = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed server for the module (its default game is catch)."""
    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    provider = SandboxProvider(str(PACKAGE))
    base_url = provider.start()
    try:
        provider.wait_for_ready(60)
        yield base_url
    finally:
        provider.stop()


def _play(env, game: str, seed: int, actions) -> list:
    """Observations of an episode whose agent plays ``actions(observation)`` until it ends."""
    observations = [env.reset(seed=seed, game_name=game).observation]
    while not observations[-1].done:
        observations.append(env.step(OpenSpielAction(action_id=actions(observations[-1]))).observation)
    return observations


def _replay(game: str, history: list):
    state = pyspiel.load_game(game).new_initial_state()
    for action in history:
        state.apply_action(action)
    return state


def test_reset_step_and_state_of_a_blackjack_hand(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        first = env.reset(seed=3, game_name="blackjack", episode_id="hand-3")
        obs = first.observation
        assert isinstance(obs, OpenSpielObservation)
        assert (obs.game_phase, obs.legal_actions, obs.legal_action_names) == ("initial", [0, 1], ["HIT", "STAND"])
        assert obs.current_player_id == 0 and not first.done and first.reward == 0.0
        assert len(obs.info_state) == 189
        result = env.step(OpenSpielAction(action_id=STAND))
        state = env.state()
    assert isinstance(state, OpenSpielState)
    assert (state.episode_id, state.step_count, state.game_name, state.seed) == ("hand-3", 1, "blackjack", 3)
    assert result.done and result.observation.game_phase == "terminal" and result.observation.legal_actions == []
    final = _replay("blackjack", state.history)
    assert final.is_terminal()
    assert result.reward == final.returns()[0]


def test_blackjack_text_shows_the_cards_the_total_and_the_dealer_card(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        for seed in range(5):
            obs = env.reset(seed=seed, game_name="blackjack").observation
            spiel = _replay("blackjack", env.state().history)  # the same deal, rebuilt with pyspiel itself
            cards = [blackjack_card(c) for c in spiel.cards(0)]
            total = spiel.get_best_player_total(0)
            dealer = blackjack_card(spiel.dealers_visible_card())
            assert obs.text.startswith(f"Your cards: {', '.join(cards)} (total {total}")
            assert f"Dealer shows: {dealer}." in obs.text
            assert obs.text.endswith("Actions: 0=HIT, 1=STAND")
            assert obs.metadata["player_total"] == total and obs.metadata["dealer_shows"] == dealer


def test_the_terminal_blackjack_text_reveals_the_dealer_hand_and_outcome(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        outcomes = set()
        for seed in range(12):
            last = _play(env, "blackjack", seed, lambda o: STAND)[-1]
            assert "Dealer's cards:" in last.text
            assert last.metadata["dealer_total"] >= 17  # the dealer draws to 17 when the player stands
            outcomes.add(re.search(r"(You win|You lose|Push)", last.text).group(1))
            expected = {1.0: "You win", -1.0: "You lose", 0.0: "Push"}[last.reward]
            assert expected in last.text
    assert {"You win", "You lose"} <= outcomes


def test_the_same_seed_deals_the_same_cards_and_replays_the_same_episode(url: str) -> None:
    def hit_then_stand(o):
        return HIT if o.metadata["player_total"] < 15 else STAND

    with OpenSpielEnv(base_url=url).sync() as one, OpenSpielEnv(base_url=url).sync() as other:
        first = _play(one, "blackjack", 11, hit_then_stand)
        first_history = one.state().history
        second = _play(other, "blackjack", 11, hit_then_stand)
        assert first == second and other.state().history == first_history
        deals = {tuple(one.reset(seed=s, game_name="blackjack").observation.info_state) for s in range(20)}
    assert len(deals) > 10


def test_a_grpo_group_starts_every_rollout_from_the_same_deal(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        starts, ends = [], set()
        for rollout in range(6):
            rng = random.Random(rollout)
            observations = _play(env, "blackjack", 42, lambda o, rng=rng: rng.choice(o.legal_actions))
            starts.append(observations[0])
            ends.add(tuple(env.state().history))
    assert all(start == starts[0] for start in starts)
    assert len(ends) > 1  # different actions, different endings


def test_an_illegal_action_is_answered_with_an_error_and_the_episode_goes_on(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        start = env.reset(seed=5, game_name="tic_tac_toe").observation
        refused = env.step(OpenSpielAction(action_id=42))
        assert refused.observation.error == f"illegal action_id 42: the legal actions are {start.legal_actions}"
        assert refused.reward == 0.0 and not refused.done
        assert refused.observation.legal_actions == start.legal_actions
        assert refused.observation.text.startswith("Error: illegal action_id 42")
        played = env.step(OpenSpielAction(action_id=4))
        assert played.observation.error is None
        assert 4 not in played.observation.legal_actions


def test_a_malformed_action_is_refused_by_validation_and_the_session_survives(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        env.reset(seed=1, game_name="catch")
        malformed = OpenSpielAction.model_construct(action_id="left", game_name="catch", game_params={}, metadata={})
        with warnings.catch_warnings(), pytest.raises(ActionValidationError):
            warnings.simplefilter("ignore")
            env.step(malformed)
        assert env.step(OpenSpielAction(action_id=1)).observation.error is None
        assert env.state().step_count == 1


def test_stepping_after_the_end_or_before_a_reset_is_an_error_not_a_crash(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        early = env.step(OpenSpielAction(action_id=0)).observation
        assert early.error == "no episode is running: call reset() first"
        _play(env, "blackjack", 0, lambda o: STAND)
        late = env.step(OpenSpielAction(action_id=STAND))
        assert late.done and late.reward == 0.0
        assert late.observation.error == "the episode is over: call reset() to start a new one"
        assert env.reset(seed=0, game_name="blackjack").observation.error is None


def test_unknown_games_and_options_are_reported_and_the_session_survives(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        with pytest.raises(EnvironmentExecutionError, match="unknown game"):
            env.reset(game_name="no_such_game")
        with pytest.raises(EnvironmentExecutionError, match="opponent_policy"):
            env.reset(game_name="tic_tac_toe", opponent_policy="minimax")
        with pytest.raises(EnvironmentExecutionError, match="agent_player"):
            env.reset(game_name="tic_tac_toe", agent_player=2)
        assert env.reset(seed=0).observation.game_name == "catch"  # the server's default game


def test_bots_play_the_other_seat(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        # The agent as O: the "first" bot opens in the corner, then answers in the first free cell.
        obs = env.reset(game_name="tic_tac_toe", agent_player=1, opponent_policy="first").observation
        assert obs.opponent_last_action == 0 and obs.current_player_id == 1
        assert obs.text.startswith("Opponent played: x(0,0).")
        after = env.step(OpenSpielAction(action_id=4)).observation
        assert after.opponent_last_action == 1
        # The random bot draws from its own RNG, seeded by the episode's seed.
        moves = []
        for _ in range(2):
            env.reset(seed=9, game_name="connect_four", opponent_policy="random")
            for column in (3, 3, 3):
                env.step(OpenSpielAction(action_id=column))
            moves.append(env.state().history)
        assert moves[0] == moves[1]


def test_rewards_add_up_to_the_return(url: str) -> None:
    with OpenSpielEnv(base_url=url).sync() as env:
        for game in ("kuhn_poker", "cliff_walking", "2048"):
            rng = random.Random(game)
            result = env.reset(seed=2, game_name=game)
            total = result.reward
            steps = 0
            while not result.done and steps < 1000:
                result = env.step(OpenSpielAction(action_id=rng.choice(result.observation.legal_actions)))
                total += result.reward
                steps += 1
            assert result.done
            assert total == pytest.approx(_replay(game, env.state().history).returns()[0])


@pytest.mark.asyncio
async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with OpenSpielEnv(base_url=url) as blackjack, OpenSpielEnv(base_url=url) as ttt:
        a, b = await asyncio.gather(
            blackjack.reset(seed=1, game_name="blackjack"), ttt.reset(seed=1, game_name="tic_tac_toe")
        )
        await asyncio.gather(ttt.step(OpenSpielAction(action_id=4)), blackjack.step(OpenSpielAction(action_id=STAND)))
        states = await asyncio.gather(blackjack.state(), ttt.state())
    assert a.observation.game_name == "blackjack" and b.observation.game_name == "tic_tac_toe"
    assert [s.game_name for s in states] == ["blackjack", "tic_tac_toe"]
    assert [s.step_count for s in states] == [1, 1]
    assert states[1].history[0] == 4


def test_a_random_agent_plays_100_episodes(url: str) -> None:
    games = ["blackjack", "catch", "tic_tac_toe", "kuhn_poker", "connect_four"]
    rng = random.Random(0)
    steps = 0
    started = time.perf_counter()
    with OpenSpielEnv(base_url=url).sync() as env:
        for episode in range(100):
            observations = _play(env, games[episode % 5], episode, lambda o: rng.choice(o.legal_actions))
            assert all(o.error is None for o in observations)
            steps += len(observations) - 1
    elapsed = time.perf_counter() - started
    print(f"\nopenspiel_env: 100 random episodes ({steps} steps) in {elapsed:.2f} s = {100 / elapsed:.0f} episodes/s")


def test_always_stand_wins_about_40_percent_of_2000_seeded_deals() -> None:
    env = OpenSpielEnvironment(game_name="blackjack")  # in-process: a statistical check of the dealer
    outcomes = Counter()
    for seed in range(2000):
        env.reset(seed=seed)
        outcomes[env.step(OpenSpielAction(action_id=STAND)).reward] += 1
    win_rate = outcomes[1.0] / 2000
    print(
        f"\nalways STAND over 2000 seeded deals: win {win_rate:.1%}, push {outcomes[0.0] / 2000:.1%}, "
        f"loss {outcomes[-1.0] / 2000:.1%}"
    )
    assert 0.38 <= win_rate <= 0.42
    assert sum(outcomes.values()) == 2000


def test_blackjack_totals_count_aces_as_11_when_that_does_not_bust() -> None:
    assert blackjack_total([0, 9]) == (21, True)  # A, 10
    assert blackjack_total([0, 9, 5]) == (17, False)  # A, 10, 6
    assert blackjack_total([0, 13, 5]) == (18, True)  # A, A, 6
    assert blackjack_total([9, 22, 11]) == (30, False)  # 10, 10, Q


@needs_sandbox
def test_the_readme_example_runs_as_written() -> None:
    code = re.search(r"```python\n(.*?)```", (PACKAGE / "README.md").read_text(), re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Your cards: ") and lines[1] == "Actions: 0=HIT, 1=STAND"
    assert "Dealer's cards: " in lines[2]
    assert re.fullmatch(r"won \d+ of 20 hands", lines[3])
