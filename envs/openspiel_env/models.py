"""What an agent sends to the OpenSpiel environment and what it sees back.

Class and field names are those of upstream OpenEnv's ``openspiel_env``, so code written for its
client runs against this one; ``text``, ``legal_action_names``, ``game_name`` and ``error`` are
additions.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from pydantic import Field

from openenv.core.env_server.types import Action, Observation, State


class OpenSpielAction(Action):
    """Play ``action_id`` (one of the observation's ``legal_actions``).

    ``game_name`` and ``game_params`` are kept for compatibility with upstream's client, which
    sends them with every step; the game itself is chosen at ``reset`` and they do not change it.
    """

    action_id: int
    game_name: str = "catch"
    game_params: Dict[str, Any] = Field(default_factory=dict)


class OpenSpielObservation(Observation):
    """The game as the agent's seat sees it.

    ``info_state`` is OpenSpiel's information-state tensor of the agent's seat (its observation
    tensor for games without one). ``game_phase`` is ``"initial"`` after reset, ``"playing"``,
    then ``"terminal"``. ``current_player_id`` is OpenSpiel's current player (the agent's seat
    while it must act, negative once the game is over). ``opponent_last_action`` is the last
    action a bot seat played. ``text`` describes the position in words (for blackjack: the
    agent's cards and total and the dealer's visible card) and lists the legal actions, whose
    names are in ``legal_action_names`` (same order as ``legal_actions``). ``error`` says why a
    step was refused (illegal action, episode over); the episode then goes on unchanged.
    """

    info_state: List[float] = Field(default_factory=list)
    legal_actions: List[int] = Field(default_factory=list)
    game_phase: str = "playing"
    current_player_id: int = 0
    opponent_last_action: Optional[int] = None
    game_name: str = ""
    text: str = ""
    legal_action_names: List[str] = Field(default_factory=list)
    error: Optional[str] = None


class OpenSpielState(State):
    """The episode's settings and progress: ``history`` is every action applied to the game so
    far, chance outcomes and bot moves included (replaying it rebuilds the position)."""

    game_name: str = "catch"
    agent_player: int = 0
    opponent_policy: str = "random"
    game_params: Dict[str, Any] = Field(default_factory=dict)
    num_players: int = 1
    seed: Optional[int] = None
    history: List[int] = Field(default_factory=list)
