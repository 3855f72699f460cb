"""Models of the TextArena environment (the field names of upstream OpenEnv's textarena_env)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from pydantic import BaseModel, ConfigDict, Field

from openenv.core.env_server.types import Action, Observation, State


class TextArenaAction(Action):
    """One move: the text a player sends to the game, e.g. ``"[crane]"`` in Wordle."""

    message: str = Field(..., max_length=10_000)


class TextArenaMessage(BaseModel):
    """One message of the game's conversation.

    ``sender_id`` is the player's id, or ``-1`` for the game itself; ``category`` is one of
    ``PROMPT``, ``PLAYER_ACTION``, ``GAME_MESSAGE`` and ``GAME_ERROR``.
    """

    model_config = ConfigDict(extra="forbid")

    sender_id: int
    content: str
    category: str = "MESSAGE"


class TextArenaObservation(Observation):
    """What a player sees after ``reset`` or ``step``.

    ``prompt`` holds the game's instructions; ``messages`` the messages since the previous
    observation (the player's move and the game's answer to it); ``info`` per-step details such as
    ``reward_signals``, ``invalid_move``, ``turn`` and, once the game is over, ``reason``.
    """

    prompt: str = ""
    messages: List[TextArenaMessage] = Field(default_factory=list)
    current_player_id: int = 0
    legal_players: List[int] = Field(default_factory=list)
    info: Dict[str, Any] = Field(default_factory=dict)


class TextArenaState(State):
    """The session's state: which game (``env_id``), its turn, and a snapshot of the game.

    ``raw_state`` never holds the secret while a game is running.
    """

    env_id: str = "Wordle-v0"
    num_players: int = 1
    max_turns: Optional[int] = None
    turn: int = 0
    last_reward: float = 0.0
    last_info: Dict[str, Any] = Field(default_factory=dict)
    raw_state: Dict[str, Any] = Field(default_factory=dict)


__all__ = ["TextArenaAction", "TextArenaMessage", "TextArenaObservation", "TextArenaState"]
