"""textarena_env: single-player text games in TextArena's message style.

Games: ``Wordle-v0``, ``GuessTheNumber-v0`` and ``Mastermind-v0`` (see ``games.py``). The game is
chosen by ``reset(game=...)`` (it stays chosen for the session's later resets), else by the
constructor, else by ``$TEXTARENA_ENV_ID`` (default ``Wordle-v0``).

Rewards, per step:

* a legal move that does not end the game: ``0.0``;
* the move that wins: ``1.0`` (done);
* the legal move that uses the last turn without winning: ``0.0`` (done);
* an illegal move (no ``[...]``, wrong format, out of range, repeated guess): ``-0.1``
  (``INVALID_MOVE_PENALTY``). It uses no turn and the game goes on, except that the
  ``MAX_INVALID_MOVES``-th illegal move of an episode ends it (done, still ``-0.1``).

Each legal move also reports shaped signals in ``info["reward_signals"]`` (e.g. ``wordle.greens``,
the fraction of letters in the right place) without adding them to the reward.
"""

from __future__ import annotations

import os
import random
from typing import Any, Dict, List, Optional, Type
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

try:
    from ..models import TextArenaAction, TextArenaMessage, TextArenaObservation, TextArenaState
    from .games import Game, InvalidMove, game_class
except ImportError:  # served from the package directory as `server.app:app`
    from models import TextArenaAction, TextArenaMessage, TextArenaObservation, TextArenaState  # type: ignore[no-redef]
    from server.games import Game, InvalidMove, game_class  # type: ignore[no-redef]

INVALID_MOVE_PENALTY = -0.1
MAX_INVALID_MOVES = 3
GAME = -1
PLAYER = 0


def _message(sender_id: int, content: str, category: str) -> TextArenaMessage:
    return TextArenaMessage(sender_id=sender_id, content=content, category=category)


class TextArenaEnvironment(Environment[TextArenaAction, TextArenaObservation, TextArenaState]):
    """Plays one single-player text game per episode; see the module docstring for the rewards.

    Snapshots save the session's attributes as they are (the default: it is all plain data): the
    game in progress (its secret, moves, best result so far and seeded generator), the chosen game
    (its class, by name), the turn limit, the invalid-move count, the done flag and the state.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True

    def __init__(self, env_id: Optional[str] = None, *, num_players: int = 1, max_turns: Optional[int] = None) -> None:
        super().__init__()
        if num_players != 1:
            raise ValueError(f"textarena_env's games are single-player: num_players must be 1, not {num_players}")
        if max_turns is None and os.environ.get("TEXTARENA_MAX_TURNS"):
            max_turns = int(os.environ["TEXTARENA_MAX_TURNS"])
        self._game_cls: Optional[Type[Game]] = game_class(env_id or os.environ.get("TEXTARENA_ENV_ID", "Wordle-v0"))
        self._max_turns = max_turns
        self._game: Optional[Game] = None
        self._invalid_moves = 0
        self._done = True
        self._state = TextArenaState(env_id=self._game_cls.env_id, episode_id=str(uuid4()))

    # --- the Environment contract -------------------------------------------------------------

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        game: Optional[str] = None,
        max_turns: Optional[int] = None,
        **kwargs: Any,
    ) -> TextArenaObservation:
        """Start a game. ``game`` picks it (``"Wordle-v0"``, ``"wordle"``, ...); ``max_turns``
        overrides its turn limit for this episode; the same ``seed`` gives the same secret. Other
        keyword arguments are ignored."""
        self._state = TextArenaState(episode_id=episode_id or str(uuid4()), env_id=self._state.env_id)
        self._game, self._invalid_moves, self._done = None, 0, True
        try:
            if game is not None:
                self._game_cls = game_class(str(game))
            turns = max_turns if max_turns is not None else self._max_turns
            if turns is not None and (not isinstance(turns, int) or turns < 1):
                raise ValueError(f"max_turns must be a positive integer, not {turns!r}")
        except ValueError as exc:
            return self._error_observation(str(exc))
        cls = self._game_cls
        assert cls is not None
        rng = random.Random(seed) if seed is not None else random.Random()
        self._game = cls(rng=rng, max_turns=turns or cls.default_max_turns)
        self._done = False
        self._state.env_id = cls.env_id
        self._state.max_turns = self._game.max_turns
        self._state.raw_state = self._game.snapshot()
        prompt = self._game.prompt()
        return TextArenaObservation(
            prompt=prompt,
            messages=[_message(GAME, prompt, "PROMPT")],
            current_player_id=PLAYER,
            legal_players=[PLAYER],
            info={"env_id": cls.env_id, "turn": 0, "max_turns": self._game.max_turns},
            reward=0.0,
            done=False,
        )

    def step(self, action: TextArenaAction, timeout_s: Optional[float] = None, **kwargs: Any) -> TextArenaObservation:
        game = self._game
        if game is None or self._done:
            reason = "the game is over: call reset() to play again" if game else "no game: call reset() first"
            return self._observe([_message(GAME, reason, "GAME_ERROR")], 0.0, {"error": reason}, done=True)
        self._state.step_count += 1
        said = _message(PLAYER, action.message, "PLAYER_ACTION")
        try:
            outcome = game.play(action.message)
        except InvalidMove as exc:
            self._invalid_moves += 1
            info: Dict[str, Any] = {"invalid_move": str(exc), "invalid_moves": self._invalid_moves}
            lines = [f"Invalid move: {exc}."]
            if self._invalid_moves >= MAX_INVALID_MOVES:
                lines.append(f"That is {MAX_INVALID_MOVES} invalid moves: you lose. The answer was {game.secret()}.")
                info.update(reason="too many invalid moves", answer=game.secret())
                self._done = True
            return self._observe([said, _message(GAME, " ".join(lines), "GAME_ERROR")], INVALID_MOVE_PENALTY, info)
        info = {"reward_signals": outcome.signals}
        feedback = outcome.feedback
        reward = 0.0
        if outcome.won:
            reward, self._done = 1.0, True
            info.update(reason="won", answer=game.secret())
            feedback += f"\nYou won in {len(game.moves)} turns!"
        elif len(game.moves) >= game.max_turns:
            self._done = True
            info.update(reason="out of turns", answer=game.secret())
            feedback += f"\nNo turns left: you lose. The answer was {game.secret()}."
        return self._observe([said, _message(GAME, feedback, "GAME_MESSAGE")], reward, info)

    @property
    def state(self) -> TextArenaState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="textarena_env",
            description="Wordle, GuessTheNumber and Mastermind in TextArena's message style",
            version="0.1.0",
        )

    # --- helpers ------------------------------------------------------------------------------

    def _observe(
        self, messages: List[TextArenaMessage], reward: float, info: Dict[str, Any], done: Optional[bool] = None
    ) -> TextArenaObservation:
        game = self._game
        if game is not None:
            info = {"env_id": game.env_id, "turn": len(game.moves), "max_turns": game.max_turns, **info}
            self._state.turn = len(game.moves)
            self._state.raw_state = {**game.snapshot(), "done": self._done, "progress": game.progress()}
            if self._done:
                self._state.raw_state["answer"] = game.secret()
        self._state.last_reward = reward
        self._state.last_info = info
        metadata = {"reward_signals": info["reward_signals"]} if "reward_signals" in info else {}
        return TextArenaObservation(
            prompt=game.prompt() if game is not None else "",
            messages=messages,
            current_player_id=PLAYER,
            legal_players=[PLAYER],
            info=info,
            reward=reward,
            done=self._done if done is None else done,
            metadata=metadata,
        )

    def _error_observation(self, error: str) -> TextArenaObservation:
        self._state.last_info = {"error": error}
        return TextArenaObservation(
            messages=[_message(GAME, error, "GAME_ERROR")],
            current_player_id=PLAYER,
            legal_players=[PLAYER],
            info={"error": error},
            reward=None,
            done=True,
        )
