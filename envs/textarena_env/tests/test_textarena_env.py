"""textarena_env served in a real sandbox (SandboxProvider) and driven through TextArenaEnv."""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from textarena_env import TextArenaAction, TextArenaEnv, TextArenaObservation
from textarena_env.server.games import wordle_marks, wordle_words

from openenv.core.client_errors import ActionValidationError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.generic_client import GenericEnvClient

PACKAGE = Path(__file__).resolve().parents[1]
GAMES = ["Wordle-v0", "GuessTheNumber-v0", "Mastermind-v0"]

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed textarena_env server for the whole module."""
    provider = SandboxProvider(str(PACKAGE))
    base_url = provider.start()
    try:
        provider.wait_for_ready(60)
        yield base_url
    finally:
        provider.stop()


def random_legal_move(game: str, rng: random.Random, tried: List[str]) -> str:
    """A move in the game's format that has not been played yet this episode."""
    while True:
        if game == "Wordle-v0":
            move = rng.choice(wordle_words())
        elif game == "GuessTheNumber-v0":
            move = str(rng.randint(1, 20))
        else:
            move = " ".join(str(d) for d in rng.sample(range(1, 7), 4))
        if move not in tried:
            tried.append(move)
            return f"[{move}]"


def play(env, game: str, seed: int, moves: List[str]) -> List[TextArenaObservation]:
    observations = [env.reset(seed=seed, game=game).observation]
    for move in moves:
        result = env.step(TextArenaAction(message=move))
        observations.append(result.observation)
        if result.done:
            break
    return observations


def test_wordle_marks_follow_the_duplicate_letter_rule() -> None:
    assert wordle_marks("crane", "crane") == "GGGGG"
    assert wordle_marks("speed", "abide") == "XXYXY"  # one 'e' in the target: only one e is marked
    assert wordle_marks("eerie", "sleep") == "YYXXX"
    assert wordle_marks("apple", "paper") == "YYGXY"


def test_the_word_list_is_five_letter_lower_case_words() -> None:
    words = wordle_words()
    assert len(words) >= 300 and len(set(words)) == len(words)
    assert all(re.fullmatch(r"[a-z]{5}", w) for w in words)


def test_reset_shows_the_prompt_and_step_answers_a_guess(url: str) -> None:
    with TextArenaEnv(base_url=url).sync() as env:
        first = env.reset(seed=3, game="Wordle-v0", episode_id="ep-1")
        assert "Wordle" in first.observation.prompt
        assert [m.category for m in first.observation.messages] == ["PROMPT"]
        assert (first.reward, first.done) == (0.0, False)
        assert first.observation.legal_players == [0] and first.observation.current_player_id == 0

        result = env.step(TextArenaAction(message="My guess is [crane]"))
        said, answer = result.observation.messages
        assert (said.sender_id, said.category, said.content) == (0, "PLAYER_ACTION", "My guess is [crane]")
        assert (answer.sender_id, answer.category) == (-1, "GAME_MESSAGE")
        assert answer.content.splitlines()[0] == "C R A N E"
        assert re.fullmatch(r"([GYX] ){4}[GYX]", answer.content.splitlines()[1])
        signals = result.observation.info["reward_signals"]
        assert set(signals) == {"wordle.greens", "wordle.yellows", "wordle.repetitions", "wordle.correct"}
        assert signals["wordle.greens"] == answer.content.splitlines()[1].count("G") / 5
        assert result.observation.metadata["reward_signals"] == signals

        state = env.state()
        assert (state.episode_id, state.step_count, state.turn, state.env_id) == ("ep-1", 1, 1, "Wordle-v0")
        assert state.raw_state["moves"] == ["crane"] and "answer" not in state.raw_state


@pytest.mark.parametrize("game", GAMES)
def test_the_same_seed_replays_the_same_episode(url: str, game: str) -> None:
    rng = random.Random(0)
    tried: List[str] = []
    moves = [random_legal_move(game, rng, tried) for _ in range(12)]
    with TextArenaEnv(base_url=url).sync() as a, TextArenaEnv(base_url=url).sync() as b:
        first = play(a, game, 11, moves)
        second = play(b, game, 11, moves)
        other = play(b, game, 12, moves)
    assert [o.model_dump() for o in first] == [o.model_dump() for o in second]
    assert [o.model_dump() for o in first] != [o.model_dump() for o in other]


@pytest.mark.parametrize("game", GAMES)
def test_guessing_the_answer_a_lost_game_revealed_wins(url: str, game: str) -> None:
    with TextArenaEnv(base_url=url).sync() as env:
        env.reset(seed=5, game=game)
        result = None
        for _ in range(3):  # three illegal moves end the game and reveal the answer
            result = env.step(TextArenaAction(message="no brackets here"))
        assert result is not None and result.done and result.observation.info["reason"] == "too many invalid moves"
        answer = result.observation.info["answer"]

        env.reset(seed=5, game=game)
        won = env.step(TextArenaAction(message=f"[{answer}]"))
    assert (won.reward, won.done) == (1.0, True)
    assert won.observation.info["reason"] == "won"
    assert won.observation.info["reward_signals"][f"{game_key(game)}.correct"] == 1.0


def game_key(game: str) -> str:
    return {"Wordle-v0": "wordle", "GuessTheNumber-v0": "guess_the_number", "Mastermind-v0": "mastermind"}[game]


def test_running_out_of_turns_loses_with_zero_reward(url: str) -> None:
    with TextArenaEnv(base_url=url).sync() as env:
        env.reset(seed=1, game="GuessTheNumber-v0")
        for _ in range(3):
            revealed = env.step(TextArenaAction(message="?"))
        wrong = [n for n in range(1, 21) if str(n) != revealed.observation.info["answer"]]
        env.reset(seed=1, game="GuessTheNumber-v0", max_turns=2)
        first = env.step(TextArenaAction(message=f"[{wrong[0]}]"))
        second = env.step(TextArenaAction(message=f"[{wrong[1]}]"))
        after = env.step(TextArenaAction(message=f"[{wrong[2]}]"))
    assert (first.reward, first.done) == (0.0, False)
    assert (second.reward, second.done) == (0.0, True)
    assert second.observation.info["reason"] == "out of turns"
    assert (after.reward, after.done) == (0.0, True)
    assert "call reset()" in after.observation.info["error"]


@pytest.mark.parametrize(
    "game, move, reason",
    [
        ("Wordle-v0", "crane", "square brackets"),
        ("Wordle-v0", "[cranes]", "five-letter"),
        ("GuessTheNumber-v0", "[21]", "outside 1..20"),
        ("GuessTheNumber-v0", "[ten]", "whole number"),
        ("Mastermind-v0", "[1 2 3 9]", "4 digits from 1 to 6"),
    ],
)
def test_an_illegal_move_costs_a_penalty_but_no_turn(url: str, game: str, move: str, reason: str) -> None:
    with TextArenaEnv(base_url=url).sync() as env:
        env.reset(seed=2, game=game)
        result = env.step(TextArenaAction(message=move))
        assert (result.reward, result.done) == (pytest.approx(-0.1), False)
        assert reason in result.observation.info["invalid_move"]
        assert result.observation.messages[-1].category == "GAME_ERROR"
        assert env.state().turn == 0


def test_a_repeated_guess_is_illegal(url: str) -> None:
    with TextArenaEnv(base_url=url).sync() as env:
        env.reset(seed=2, game="Mastermind-v0")
        env.step(TextArenaAction(message="[1 2 3 4]"))
        again = env.step(TextArenaAction(message="[1234]"))
    assert again.reward == pytest.approx(-0.1)
    assert "already guessed" in again.observation.info["invalid_move"]


def test_an_unknown_game_answers_with_an_error_and_the_session_goes_on(url: str) -> None:
    with TextArenaEnv(base_url=url).sync() as env:
        bad = env.reset(game="Chess-v0")
        assert bad.done and "unknown game 'Chess-v0'" in bad.observation.info["error"]
        step = env.step(TextArenaAction(message="[crane]"))
        assert step.done and "call reset() first" in step.observation.info["error"]
        good = env.reset(seed=1, game="mastermind")
    assert not good.done and "Mastermind" in good.observation.prompt


def test_a_malformed_action_is_refused_by_validation_and_the_session_survives(url: str) -> None:
    with GenericEnvClient(base_url=url).sync() as env:
        env.reset(seed=1, game="Wordle-v0")
        with pytest.raises(ActionValidationError):
            env.step({"message": 42})
        with pytest.raises(ActionValidationError):
            env.step({"guess": "[crane]"})
        result = env.step({"message": "[crane]"})
    assert result.observation["messages"][0]["content"] == "[crane]"


@pytest.mark.asyncio
async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with TextArenaEnv(base_url=url) as a, TextArenaEnv(base_url=url) as b:
        await asyncio.gather(a.reset(seed=1, game="Wordle-v0"), b.reset(seed=1, game="Mastermind-v0"))
        await asyncio.gather(a.step(TextArenaAction(message="[crane]")), b.step(TextArenaAction(message="[1 2 3 4]")))
        await a.step(TextArenaAction(message="[slate]"))
        state_a, state_b = await asyncio.gather(a.state(), b.state())
    assert (state_a.env_id, state_a.turn, state_a.raw_state["moves"]) == ("Wordle-v0", 2, ["crane", "slate"])
    assert (state_b.env_id, state_b.turn, state_b.raw_state["moves"]) == ("Mastermind-v0", 1, ["1 2 3 4"])


def test_a_random_legal_agent_plays_100_episodes(url: str) -> None:
    rng = random.Random(1234)
    outcomes = {"won": 0, "out of turns": 0}
    started = time.perf_counter()
    with TextArenaEnv(base_url=url).sync() as env:
        for episode in range(100):
            game = GAMES[episode % 3]
            env.reset(seed=episode, game=game)
            tried: List[str] = []
            result = None
            while result is None or not result.done:
                result = env.step(TextArenaAction(message=random_legal_move(game, rng, tried)))
                assert "invalid_move" not in result.observation.info
            outcomes[result.observation.info["reason"]] += 1
    elapsed = time.perf_counter() - started
    print(f"\ntextarena_env: 100 random episodes in {elapsed:.2f} s = {100 / elapsed:.1f} episodes/s {outcomes}")
    assert sum(outcomes.values()) == 100 and outcomes["won"] > 0


def test_the_readme_example_runs_as_written() -> None:
    readme = (PACKAGE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ), check=True
    ).stdout.splitlines()
    assert out[0].startswith("You are playing Wordle")
    assert all(re.fullmatch(r"([GYX] ){4}[GYX]", line) for line in out[1:-1:2])
    assert out[-1] == "turn: 3"


def test_auto_env_finds_the_installed_package() -> None:
    from openenv import AutoAction, AutoEnv

    assert AutoEnv.get_env_class("textarena") is TextArenaEnv
    assert AutoAction.from_env("textarena_env") is TextArenaAction


@pytest.mark.parametrize("game", GAMES)
def test_a_restored_snapshot_continues_each_game_exactly(game: str) -> None:
    """In process, for each game: the secret, the moves so far and the invalid-move count come
    back, and the game goes on as it would have, to its end."""
    from textarena_env.server.textarena_environment import TextArenaEnvironment

    from openenv.core.env_server.snapshots import SnapshotSeal

    seal = SnapshotSeal()
    original, twin = TextArenaEnvironment(), TextArenaEnvironment(env_id="GuessTheNumber-v0")
    original.reset(seed=8, game=game)
    rng, tried = random.Random(1), []
    for move in ("[?]", random_legal_move(game, rng, tried)):
        original.step(TextArenaAction(message=move))
    seal.restore(twin, seal.seal(original))
    assert twin._game is not original._game and type(twin._game) is type(original._game)
    assert vars(twin._game).keys() == vars(original._game).keys()
    for name, value in vars(original._game).items():  # (random.Random has no == of its own)
        same = getattr(twin._game, name)
        assert same.getstate() == value.getstate() if name == "rng" else same == value

    def play(env: TextArenaEnvironment) -> list:
        moves, rng, out = list(tried), random.Random(2), []
        while not env._done:
            observation = env.step(TextArenaAction(message=random_legal_move(game, rng, moves)))
            out.append(observation.model_dump())
        return [*out, env.state.model_dump()]

    assert play(twin) == play(original)
