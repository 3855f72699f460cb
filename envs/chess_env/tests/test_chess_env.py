"""The chess environment, served in the sandbox (SandboxProvider) and driven through ChessEnv."""

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

import chess
import pytest
from chess_env import ChessAction, ChessEnv, ChessObservation, ChessState
from chess_env.server.opponents import choose

from openenv.core.client_errors import ActionValidationError, EnvironmentExecutionError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap

PACKAGE = Path(__file__).resolve().parents[1]
FOOLS_MATE = "rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2"  # Black mates with Qh4#


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


def _replay(state: ChessState) -> chess.Board:
    board = chess.Board(state.start_fen)
    for move in state.move_history:
        board.push_uci(move)
    return board


def test_reset_gives_the_start_position_its_legal_moves_and_a_board(url: str) -> None:
    with ChessEnv(base_url=url).sync() as env:
        result = env.reset(seed=0, episode_id="game-0", opponent="random")
        state = env.state()
    obs = result.observation
    assert isinstance(obs, ChessObservation) and isinstance(state, ChessState)
    assert obs.fen == chess.STARTING_FEN and obs.result == "*" and not result.done and result.reward == 0.0
    assert sorted(obs.legal_moves) == sorted(m.uci() for m in chess.Board().legal_moves)
    assert len(obs.legal_moves_san) == 20 and "Nf3" in obs.legal_moves_san
    assert obs.ascii_board.splitlines()[0] == "8 r n b q k b n r"
    assert obs.ascii_board.splitlines()[-1] == "  a b c d e f g h"
    assert obs.ascii_board in obs.text and f"FEN: {obs.fen}" in obs.text
    assert (state.episode_id, state.step_count, state.agent_color, state.opponent) == ("game-0", 0, "white", "random")


@pytest.mark.parametrize("move", ["e2e4", "e4"])
def test_moves_in_uci_and_san_are_played_and_answered(url: str, move: str) -> None:
    with ChessEnv(base_url=url).sync() as env:
        env.reset(seed=1, opponent="random")
        result = env.step(ChessAction(move=move))
        state = env.state()
    obs = result.observation
    assert state.move_history[0] == "e2e4" and len(state.move_history) == 2
    assert obs.opponent_move == state.move_history[1]
    assert obs.fen == _replay(state).fen() == state.fen
    assert chess.Board(obs.fen).turn == chess.WHITE and result.reward == 0.0 and obs.error is None


def test_illegal_and_unreadable_moves_are_penalised_and_the_game_goes_on(url: str) -> None:
    with ChessEnv(base_url=url).sync() as env:
        start = env.reset(seed=2, opponent="random").observation
        for move, error in [
            ("e2e5", "illegal move 'e2e5' in this position"),
            ("Ke2", "illegal move 'Ke2' in this position"),
            ("castle!", "cannot read move 'castle!': give it in UCI (e2e4) or SAN (e4, Nf3, O-O)"),
        ]:
            refused = env.step(ChessAction(move=move))
            assert refused.reward == -0.1 and not refused.done
            assert refused.observation.error == error
            assert refused.observation.fen == start.fen
            assert refused.observation.text.startswith(f"Error: {error}.")
        assert env.state().move_history == []
        assert env.step(ChessAction(move="d4")).observation.error is None


def test_an_ambiguous_san_move_says_so(url: str) -> None:
    with ChessEnv(base_url=url).sync() as env:
        env.reset(fen="4k3/8/8/8/8/8/4K3/R6R w - - 0 1", opponent="random")  # Rd1 fits both rooks
        refused = env.step(ChessAction(move="Rd1"))
    assert refused.observation.error.startswith("ambiguous move 'Rd1'")


def test_checkmate_pays_the_winner_and_spreads_the_reward_back(url: str) -> None:
    with ChessEnv(base_url=url).sync() as env:
        env.reset(fen=FOOLS_MATE, agent_color="black", opponent="random")
        env.step(ChessAction(move="a7a6"))
        won = env.reset(fen=FOOLS_MATE, agent_color="black")
        assert won.observation.legal_moves and won.observation.agent_color == "black"
        result = env.step(ChessAction(move="Qh4#"))
        late = env.step(ChessAction(move="e2e4"))
    obs = result.observation
    assert result.done and result.reward == 1.0
    assert (obs.result, obs.termination, obs.legal_moves) == ("0-1", "checkmate", [])
    assert result.metadata["discounted_rewards"] == [1.0] and result.metadata["gamma"] == 0.99
    assert late.done and late.reward == 0.0 and late.observation.error.startswith("the game is over")


def test_the_minimax_opponent_mates_when_it_can_and_the_agent_loses(url: str) -> None:
    # White (the agent) blunders into fool's mate: 1. f3 e5 2. g4?? and the opponent must find Qh4#.
    with ChessEnv(base_url=url).sync() as env:
        env.reset(seed=0, fen="rnbqkbnr/pppp1ppp/8/4p3/8/5P2/PPPPP1PP/RNBQKBNR w KQkq - 0 2", opponent="minimax")
        result = env.step(ChessAction(move="g4"))
    assert result.observation.opponent_move == "d8h4"
    assert (result.observation.result, result.reward, result.done) == ("0-1", -1.0, True)


def test_the_minimax_opponent_takes_a_free_queen() -> None:
    board = chess.Board("4k3/8/8/3q4/8/8/8/3RK3 w - - 0 1")  # Rxd5 wins the queen
    assert choose("minimax", board, random.Random(0), depth=2) == chess.Move.from_uci("d1d5")


def test_the_ply_limit_ends_the_game_in_a_draw(url: str) -> None:
    with ChessEnv(base_url=url).sync() as env:
        result = env.reset(seed=3, opponent="random", max_plies=6)
        steps = 0
        while not result.done:
            result = env.step(ChessAction(move=result.observation.legal_moves[-1]))
            steps += 1
        state = env.state()
    assert (result.observation.result, result.observation.termination, result.reward) == ("1/2-1/2", "max_plies", 0.0)
    assert steps == 3 and len(state.move_history) == 6
    assert result.metadata["discounted_rewards"] == [0.0, 0.0, 0.0]


def test_the_same_seed_replays_the_same_game(url: str) -> None:
    games = []
    with ChessEnv(base_url=url).sync() as one, ChessEnv(base_url=url).sync() as other:
        for env in (one, other):
            result = env.reset(seed=11, opponent="random", max_plies=40)
            observations = [result.observation]
            while not result.done:
                result = env.step(ChessAction(move=result.observation.legal_moves_san[0]))
                observations.append(result.observation)
            games.append(observations)
        assert games[0] == games[1]
        openings = {
            one.reset(seed=s, agent_color="black", opponent="random").observation.opponent_move for s in range(10)
        }
    assert len(openings) > 1


def test_bad_options_and_malformed_actions_are_errors_the_session_survives(url: str) -> None:
    with ChessEnv(base_url=url).sync() as env:
        with pytest.raises(EnvironmentExecutionError, match="unknown opponent"):
            env.reset(opponent="stockfish")
        with pytest.raises(EnvironmentExecutionError, match="bad fen"):
            env.reset(fen="not a fen")
        with pytest.raises(EnvironmentExecutionError, match="not a legal position"):
            env.reset(fen="8/8/8/8/8/8/8/8 w - - 0 1")  # no kings
        env.reset(seed=0, opponent="random")
        with warnings.catch_warnings(), pytest.raises(ActionValidationError):
            warnings.simplefilter("ignore")
            env.step(ChessAction.model_construct(move=42, metadata={}))
        assert env.step(ChessAction(move="e4")).observation.error is None
        assert env.state().step_count == 1


@pytest.mark.asyncio
async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with ChessEnv(base_url=url) as white, ChessEnv(base_url=url) as black:
        await asyncio.gather(white.reset(seed=1, opponent="random"), black.reset(seed=1, agent_color="black"))
        await asyncio.gather(white.step(ChessAction(move="e4")), black.step(ChessAction(move="e5")))
        states = await asyncio.gather(white.state(), black.state())
    assert states[0].move_history[0] == "e2e4" and len(states[0].move_history) == 2
    assert states[1].move_history[1] == "e7e5" and len(states[1].move_history) == 3
    assert (states[0].opponent, states[1].opponent) == ("random", "minimax")


def test_a_random_agent_plays_100_episodes(url: str) -> None:
    rng = random.Random(0)
    steps = 0
    started = time.perf_counter()
    with ChessEnv(base_url=url).sync() as env:
        for episode in range(100):
            result = env.reset(
                seed=episode, opponent="random", max_plies=40, agent_color=("white", "black")[episode % 2]
            )
            while not result.done:
                result = env.step(ChessAction(move=rng.choice(result.observation.legal_moves)))
                assert result.observation.error is None
                steps += 1
    elapsed = time.perf_counter() - started
    print(
        f"\nchess_env: 100 random episodes ({steps} steps, 40 plies max) in {elapsed:.2f} s = {100 / elapsed:.0f} episodes/s"
    )


def test_the_readme_example_runs_as_written() -> None:
    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    code = re.search(r"```python\n(.*?)```", (PACKAGE / "README.md").read_text(), re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "8 r n b q k b n r" and lines[8] == "  a b c d e f g h"
    assert lines[9] == "-0.1 illegal move 'Qxe1' in this position"
    assert lines[10] == "0-1 checkmate 1.0"
    assert re.fullmatch(r"(1-0|0-1|1/2-1/2) \w+ (1\.0|-1\.0|0\.0)", lines[11])


def _history(board: chess.Board) -> list:
    """Every position of the game back to its start (with the en-passant square as held)."""
    board = board.copy()
    positions = [board.fen(en_passant="fen")]
    while board.move_stack:
        board.pop()
        positions.append(board.fen(en_passant="fen"))
    return positions


@pytest.mark.parametrize("opponent", ["random", "minimax"])
def test_a_restored_snapshot_replays_the_game_and_the_opponent_exactly(opponent: str) -> None:
    """In process: the board comes back move for move (its whole history, which draw claims read,
    from a FEN start with an en-passant square), and the seeded opponent answers as it would have."""
    from chess_env.server.chess_environment import ChessEnvironment

    from openenv.core.env_server.snapshots import SnapshotSeal

    seal = SnapshotSeal()
    start = "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 3"  # exd6 e.p. is legal
    original, twin = ChessEnvironment(), ChessEnvironment()
    original.reset(seed=5, opponent=opponent, opponent_depth=1, fen=start)
    rng = random.Random(2)
    for _ in range(3):
        original.step(ChessAction(move=rng.choice(sorted(original._board.legal_moves, key=str)).uci()))
    before = seal.seal(original)
    seal.restore(twin, before)
    assert twin._board is not original._board and _history(twin._board) == _history(original._board)
    assert twin._board.root().ep_square == chess.D6
    assert twin._opponent_move == original._opponent_move and twin.state == original.state

    def play(env: ChessEnvironment) -> list:
        pick = random.Random(3)
        out = []
        for _ in range(6):
            observation = env.step(ChessAction(move=pick.choice(sorted(env._board.legal_moves, key=str)).uci()))
            out.append((observation.model_dump(), env._board.can_claim_draw()))
        return [*out, _history(env._board), env.state.model_dump()]

    assert play(twin) == play(original)


def test_a_snapshot_of_a_session_before_its_first_reset_restores_too() -> None:
    from chess_env.server.chess_environment import ChessEnvironment

    from openenv.core.env_server.snapshots import SnapshotSeal

    seal = SnapshotSeal()
    fresh, played = ChessEnvironment(), ChessEnvironment()
    played.reset(seed=1)
    played.step(ChessAction(move="e4"))
    seal.restore(played, seal.seal(fresh))
    assert played._board is None and played.step(ChessAction(move="e4")).error.startswith("no game")
