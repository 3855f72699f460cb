"""The Connect Four environment, served in the sandbox (SandboxProvider) and driven through Connect4Env."""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Iterator

import pytest
from connect4_env import Connect4Action, Connect4Env, Connect4Observation, Connect4State
from connect4_env.server.board import Board, choose

from openenv.core.client_errors import ActionValidationError, EnvironmentExecutionError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap

PACKAGE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed server for the module."""
    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    provider = SandboxProvider(str(PACKAGE))
    base_url = provider.start()
    try:
        provider.wait_for_ready(60)
        yield base_url
    finally:
        provider.stop()


def _play(env, seed: int, columns, **options) -> list:
    observations = [env.reset(seed=seed, **options).observation]
    while not observations[-1].done:
        observations.append(env.step(Connect4Action(column=columns(observations[-1]))))
        observations[-1] = observations[-1].observation
    return observations


def test_reset_shows_an_empty_board_and_all_columns(url: str) -> None:
    with Connect4Env(base_url=url).sync() as env:
        result = env.reset(seed=0, episode_id="game-0")
        state = env.state()
    obs = result.observation
    assert isinstance(obs, Connect4Observation) and isinstance(state, Connect4State)
    assert obs.board == [[0] * 7 for _ in range(6)]
    assert obs.legal_actions == list(range(7))
    assert result.reward == 0.0 and not result.done and obs.winner is None
    assert obs.text.splitlines()[0] == "0 1 2 3 4 5 6"
    assert (state.episode_id, state.step_count, state.next_player, state.agent_player) == ("game-0", 0, 1, 1)


def test_a_move_lands_at_the_bottom_and_the_opponent_answers(url: str) -> None:
    with Connect4Env(base_url=url).sync() as env:
        env.reset(seed=1)
        result = env.step(Connect4Action(column=3))
        state = env.state()
    obs = result.observation
    assert obs.board[5][3] == 1  # the agent's piece, bottom row
    answer = obs.opponent_last_column
    assert answer is not None and state.moves == [3, answer]
    assert sum(cell == -1 for row in obs.board for cell in row) == 1
    assert state.board[5 if answer != 3 else 4][answer] == -1
    assert "X" in obs.text.splitlines()[-2] and f"Opponent played column {answer}." in obs.text
    assert state.step_count == 1 and state.next_player == 1


def test_win_draw_and_loss_rewards_match_the_final_board(url: str) -> None:
    rng = random.Random(3)
    rewards = set()
    with Connect4Env(base_url=url).sync() as env:
        for seed in range(30):
            last = _play(env, seed, lambda o: rng.choice(o.legal_actions))[-1]
            state = env.state()
            board = Board()
            board.cells = [row[:] for row in state.board]
            assert last.reward == last.winner == (state.winner * state.agent_player)
            assert last.legal_actions == []
            if last.winner:  # the last piece played connects four
                row = next(r for r in range(6) if board.cells[r][state.moves[-1]] != 0)
                assert board.connects_four(row, state.moves[-1])
            else:
                assert board.full()
            rewards.add(last.reward)
    assert {1.0, -1.0} <= rewards


def test_the_same_seed_replays_the_same_game(url: str) -> None:
    with Connect4Env(base_url=url).sync() as one, Connect4Env(base_url=url).sync() as other:
        games = []
        for env in (one, other):
            rng = random.Random(7)
            games.append(_play(env, 21, lambda o, rng=rng: rng.choice(o.legal_actions)))
        assert games[0] == games[1]
        openings = {one.reset(seed=s, agent_player=-1).observation.opponent_last_column for s in range(20)}
    assert len(openings) > 1


def test_an_illegal_move_is_penalised_and_the_game_goes_on(url: str) -> None:
    with Connect4Env(base_url=url).sync() as env:
        env.reset(seed=2, opponent="random")
        outside = env.step(Connect4Action(column=7))
        assert outside.reward == -0.1 and not outside.done
        assert outside.observation.error == (
            "illegal move: column 7 does not exist (columns are 0-6); legal columns are [0, 1, 2, 3, 4, 5, 6]"
        )
        # Against the random opponent seeded 2, the agent's and the opponent's pieces fill column 0
        # in four moves without anyone connecting four.
        for _ in range(4):
            result = env.step(Connect4Action(column=0))
        moves = env.state().moves
        assert not result.done and 0 not in result.observation.legal_actions
        full = env.step(Connect4Action(column=0))
        assert full.reward == -0.1 and not full.done
        assert full.observation.error.startswith("illegal move: column 0 is full; legal columns are [1, ")
        assert env.state().moves == moves and full.observation.board == result.observation.board
        assert env.step(Connect4Action(column=1)).observation.error is None


def test_a_malformed_action_is_refused_and_the_session_survives(url: str) -> None:
    with Connect4Env(base_url=url).sync() as env:
        env.reset(seed=0)
        with warnings.catch_warnings(), pytest.raises(ActionValidationError):
            warnings.simplefilter("ignore")
            env.step(Connect4Action.model_construct(column="middle", metadata={}))
        assert env.step(Connect4Action(column=3)).observation.error is None
        with pytest.raises(EnvironmentExecutionError, match="unknown opponent"):
            env.reset(opponent="alphazero")
        assert env.reset(seed=0).observation.legal_actions == list(range(7))


def test_moves_after_the_end_or_before_a_reset_are_errors(url: str) -> None:
    with Connect4Env(base_url=url).sync() as env:
        assert env.step(Connect4Action(column=0)).observation.error == "no game is running: call reset() first"
        _play(env, 4, lambda o: o.legal_actions[0])
        late = env.step(Connect4Action(column=0))
    assert late.done and late.reward == 0.0
    assert late.observation.error == "the game is over: call reset() to start a new one"


def test_the_greedy_opponent_takes_wins_and_blocks_threats() -> None:
    rng = random.Random(0)
    board = Board()
    for column in (0, 1, 2):
        board.drop(column, 1)
    assert choose("greedy", board, -1, rng) == 3  # blocks 1's open three
    board.drop(3, -1)
    for column in (4, 4, 4):
        board.drop(column, -1)
    assert choose("greedy", board, -1, rng) == 4  # its own vertical win comes first


def test_the_greedy_opponent_beats_a_random_agent(url: str) -> None:
    rng = random.Random(5)
    with Connect4Env(base_url=url).sync() as env:
        rewards = [
            _play(env, s, lambda o: rng.choice(o.legal_actions), opponent="greedy")[-1].reward for s in range(20)
        ]
    assert rewards.count(-1.0) >= 16


@pytest.mark.asyncio
async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with Connect4Env(base_url=url) as first, Connect4Env(base_url=url) as second:
        await asyncio.gather(first.reset(seed=1), second.reset(seed=1, agent_player=-1, opponent="greedy"))
        await asyncio.gather(first.step(Connect4Action(column=0)), second.step(Connect4Action(column=6)))
        states = await asyncio.gather(first.state(), second.state())
    assert states[0].moves[0] == 0 and len(states[0].moves) == 2
    assert states[1].moves[1] == 6 and len(states[1].moves) == 3  # the opponent opened
    assert (states[0].agent_player, states[1].agent_player) == (1, -1)


def test_a_random_agent_plays_100_episodes(url: str) -> None:
    rng = random.Random(0)
    steps = 0
    started = time.perf_counter()
    with Connect4Env(base_url=url).sync() as env:
        for episode in range(100):
            options = {"opponent": "greedy" if episode % 2 else "random", "agent_player": 1 if episode % 3 else -1}
            observations = _play(env, episode, lambda o: rng.choice(o.legal_actions), **options)
            assert all(o.error is None for o in observations)
            steps += len(observations) - 1
    elapsed = time.perf_counter() - started
    print(f"\nconnect4_env: 100 random episodes ({steps} steps) in {elapsed:.2f} s = {100 / elapsed:.0f} episodes/s")


def test_the_readme_example_runs_as_written() -> None:
    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    code = re.search(r"```python\n(.*?)```", (PACKAGE / "README.md").read_text(), re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"Opponent played column \d\.", lines[0])
    assert lines[1] == "0 1 2 3 4 5 6" and lines[7].split()[3] == "X"  # the bottom row
    assert re.fullmatch(
        r"Game over\. (You win\.|You lose\.|Draw: the board is full\.) reward: (1\.0|-1\.0|0\.0)", lines[-1]
    )
