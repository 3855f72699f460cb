"""OpenSpiel games as an OpenEnv environment.

The agent plays one seat (``agent_player``) of any sequential OpenSpiel game; bots play the other
seats (``opponent_policy``: ``random``, ``first``/``fixed`` or ``last``), and chance nodes
(cards dealt, balls dropped, tiles spawned) are sampled from the episode's own RNG. With
``reset(seed=s)`` both RNGs start from ``s``, so the same seed deals the same cards and, given the
same actions, replays the same episode: G rollouts of a GRPO group can start from one deal.

The reward of a step is the change in the agent's OpenSpiel return that the step (with the bot
moves and chance outcomes after it) brought; over an episode the rewards add up to the agent's
return, and in games that pay only at the end (blackjack: +1 win, 0 push, -1 loss) the terminal
reward is the return.

Defaults come from ``OPENSPIEL_GAME`` (``catch``), ``OPENSPIEL_AGENT_PLAYER`` (0) and
``OPENSPIEL_OPPONENT_POLICY`` (``random``); ``reset(game_name=..., game_params=...,
agent_player=..., opponent_policy=...)`` overrides them for one episode.

Snapshots (fork, save, restore) save the game and its position through OpenSpiel's own
serialisation (``pyspiel.serialize_game_and_state``: the game with its parameters, and the
position as the actions that led to it, chance outcomes included), and the rest as plain data:
the chance RNG and the bot (its policy and its own RNG, both ``random.Random`` with their
state), the episode's state (step count, history), the last return and the opponent's last
move. A restored session continues exactly as the saved one would. Refused (``NOT_SUPPORTED``,
with the reason) are the games whose chance is drawn inside the engine (OpenSpiel's
"sampled stochastic" games, such as ``stones_and_gems``: their serialisation does not carry the
engine's generator), and any position that does not come back identical from its serialisation
(checked at each snapshot).
"""

from __future__ import annotations

import functools
import html
import os
import random
from typing import Any, Dict, List, Optional
from uuid import uuid4

import pyspiel

from openenv.core.env_server.exceptions import SnapshotUnsupportedError
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

try:
    from ..models import OpenSpielAction, OpenSpielObservation, OpenSpielState
    from .describe import action_names, describe, facts
except ImportError:  # served from the package directory as `server.app:app`
    from models import OpenSpielAction, OpenSpielObservation, OpenSpielState  # type: ignore[no-redef]
    from server.describe import action_names, describe, facts  # type: ignore[no-redef]

OPPONENT_POLICIES = ("random", "first", "fixed", "last")
"""Bot policies: uniform random over legal actions (own seeded RNG), first legal action
(``fixed`` is an alias), last legal action."""

DOCUMENTED_GAMES = ("blackjack", "catch", "cliff_walking", "2048", "tic_tac_toe", "kuhn_poker", "connect_four")


@functools.lru_cache(maxsize=64)
def _load_game(name: str, params: tuple) -> Any:
    # Games are immutable once loaded: sessions share them.
    try:
        return pyspiel.load_game(name, dict(params)) if params else pyspiel.load_game(name)
    except pyspiel.SpielError as exc:
        known = name in pyspiel.registered_names()
        hint = (
            f"bad game_params {dict(params)}" if known else f"unknown game (try one of {', '.join(DOCUMENTED_GAMES)})"
        )
        raise ValueError(f"cannot load OpenSpiel game {name!r}: {hint}: {exc}") from None


def load_game(name: str, params: Optional[Dict[str, Any]] = None) -> Any:
    """The OpenSpiel game ``name`` with ``params``; ``ValueError`` when it cannot be played here."""
    try:
        key = tuple(sorted((params or {}).items()))
        hash(key)
    except TypeError:
        raise ValueError(f"game_params must map names to numbers, strings or booleans, got {params!r}") from None
    game = _load_game(name, key)
    if game.get_type().dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        raise ValueError(f"{name!r} is a simultaneous-move game; only sequential games are supported")
    return game


class _Bot:
    def __init__(self, policy: str, rng: random.Random) -> None:
        self.policy = policy
        self.rng = rng

    def choose(self, legal: List[int]) -> int:
        if self.policy == "random":
            return self.rng.choice(legal)
        return legal[-1] if self.policy == "last" else legal[0]


def _position(spiel: Any) -> tuple:
    """What must be equal for two OpenSpiel states to be the same position."""
    terminal = spiel.is_terminal()
    return (
        str(spiel),
        spiel.history(),
        spiel.current_player(),
        terminal,
        spiel.returns(),
        None if terminal else spiel.legal_actions(),
    )


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


class OpenSpielEnvironment(Environment[OpenSpielAction, OpenSpielObservation, OpenSpielState]):
    """One seat of an OpenSpiel game against bots; see the module docstring."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True
    SNAPSHOT_EXCLUDE = ("_game", "_spiel_state")  # native: saved by OpenSpiel's own serialisation

    def __init__(
        self,
        game_name: Optional[str] = None,
        agent_player: Optional[int] = None,
        opponent_policy: Optional[str] = None,
        game_params: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__()
        self.default_game = game_name or os.environ.get("OPENSPIEL_GAME") or "catch"
        self.default_agent_player = agent_player if agent_player is not None else _env_int("OPENSPIEL_AGENT_PLAYER", 0)
        self.default_opponent_policy = opponent_policy or os.environ.get("OPENSPIEL_OPPONENT_POLICY") or "random"
        self.default_game_params = dict(game_params or {})
        self._game: Any = None
        self._spiel_state: Any = None
        self._chance_rng = random.Random()
        self._bot = _Bot("random", random.Random())
        self._opponent_last_action: Optional[int] = None
        self._opponent_last_text = ""
        self._last_return = 0.0
        self._state = OpenSpielState(
            game_name=self.default_game,
            agent_player=self.default_agent_player,
            opponent_policy=self.default_opponent_policy,
            game_params=self.default_game_params,
        )

    # --- the contract -----------------------------------------------------------------------

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        game_name: Optional[str] = None,
        game_params: Optional[Dict[str, Any]] = None,
        agent_player: Optional[int] = None,
        opponent_policy: Optional[str] = None,
        **kwargs: Any,
    ) -> OpenSpielObservation:
        """Start an episode of ``game_name`` (default: the environment's game) and play the chance
        nodes and bot moves until the agent's seat must act."""
        if kwargs:
            raise ValueError(
                f"unknown reset options {sorted(kwargs)}: accepted are seed, episode_id, game_name, "
                "game_params, agent_player, opponent_policy"
            )
        name = game_name or self.default_game
        params = dict(
            self.default_game_params if game_params is None and name == self.default_game else game_params or {}
        )
        player = self.default_agent_player if agent_player is None else agent_player
        policy = (opponent_policy or self.default_opponent_policy).lower()
        if policy not in OPPONENT_POLICIES:
            raise ValueError(f"unknown opponent_policy {policy!r}: choose one of {', '.join(OPPONENT_POLICIES)}")
        game = load_game(name, params)
        if not 0 <= player < game.num_players():
            raise ValueError(f"agent_player must be in 0..{game.num_players() - 1} for {name!r}, got {player}")

        self._game = game
        self._spiel_state = game.new_initial_state()
        if seed is None:
            seed_material: Any = random.SystemRandom().getrandbits(64)
        else:
            seed_material = seed
        self._chance_rng = random.Random(f"{seed_material}/chance")
        self._bot = _Bot(policy, random.Random(f"{seed_material}/opponent"))
        self._opponent_last_action = None
        self._last_return = 0.0
        self._state = OpenSpielState(
            episode_id=episode_id or str(uuid4()),
            step_count=0,
            game_name=name,
            agent_player=player,
            opponent_policy=policy,
            game_params=params,
            num_players=game.num_players(),
            seed=seed,
        )
        self._advance()
        return self._observe(phase="initial")

    def step(self, action: OpenSpielAction, timeout_s: Optional[float] = None, **kwargs: Any) -> OpenSpielObservation:
        """Play ``action.action_id`` for the agent, then the bots and chance until the agent's next
        turn or the end. An illegal action changes nothing and is answered with ``error``."""
        if self._spiel_state is None:
            return OpenSpielObservation(
                game_name=self._state.game_name,
                game_phase="initial",
                reward=0.0,
                error="no episode is running: call reset() first",
                text="No episode is running: call reset() first.",
            )
        self._state.step_count += 1
        spiel = self._spiel_state
        if spiel.is_terminal():
            return self._refuse("the episode is over: call reset() to start a new one")
        legal = spiel.legal_actions(self._state.agent_player)
        if action.action_id not in legal:
            return self._refuse(f"illegal action_id {action.action_id}: the legal actions are {legal}")
        self._apply(action.action_id)
        self._opponent_last_action = None
        self._advance()
        return self._observe(phase="terminal" if spiel.is_terminal() else "playing")

    @property
    def state(self) -> OpenSpielState:
        return self._state

    # --- snapshots ----------------------------------------------------------------------------

    def snapshot_state(self) -> Dict[str, Any]:
        """The plain attributes, and the game and position as OpenSpiel serialises them (see the
        module docstring); refuses a position that its serialisation would not give back."""
        data = super().snapshot_state()
        data["spiel"] = None if self._spiel_state is None else self._serialised()
        return data

    def restore_state(self, data: Dict[str, Any]) -> None:
        data = dict(data)
        text = data.pop("spiel")
        super().restore_state(data)
        if text is None:
            self._game = self._spiel_state = None
            return
        game, spiel = pyspiel.deserialize_game_and_state(text)
        try:  # the game the episode was started with, shared with the server's other sessions
            shared = load_game(self._state.game_name, self._state.game_params)
        except ValueError:
            shared = None
        if shared is not None and str(shared) == str(game):
            game, spiel = shared, shared.deserialize_state(spiel.serialize())
        self._game, self._spiel_state = game, spiel

    def _serialised(self) -> str:
        game, spiel = self._game, self._spiel_state
        name = self._state.game_name
        if game.get_type().chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
            raise SnapshotUnsupportedError(
                f"{name!r} draws its chance inside the OpenSpiel engine (a sampled-stochastic game), and "
                "OpenSpiel's serialisation does not carry the engine's generator: a restored game would not "
                "continue exactly, so its sessions cannot be snapshotted"
            )
        text = pyspiel.serialize_game_and_state(game, spiel)
        _, back = pyspiel.deserialize_game_and_state(text)
        if _position(back) != _position(spiel):
            raise SnapshotUnsupportedError(
                f"this position of {name!r} does not come back identical from OpenSpiel's serialisation, "
                "so it cannot be snapshotted exactly"
            )
        return text

    # --- the web playground -------------------------------------------------------------------

    def render_web(self, observation: dict) -> Optional[str]:
        """Blackjack: the cards, face up (the dealer's hidden card once the hand is over); other
        games: the position's description."""
        facts = observation.get("metadata") or {}
        text = html.escape(observation.get("text") or "")
        if "player_cards" not in facts:
            return f"<pre style='font:14px monospace;white-space:pre-wrap'>{text}</pre>"

        def hand(cards: List[str], hidden: int = 0) -> str:
            shown = "".join(f"<span class='card'>{html.escape(str(c))}</span>" for c in cards)
            return shown + "<span class='card back'>?</span>" * hidden

        dealer = facts.get("dealer_cards")
        dealer_hand = hand(dealer) if dealer else hand([facts.get("dealer_shows", "?")], hidden=1)
        dealer_total = f" (total {facts['dealer_total']})" if "dealer_total" in facts else ""
        style = (
            "body{font:15px sans-serif;background:#1f6b3a;color:#fff;padding:8px}"
            ".card{display:inline-block;width:46px;height:66px;margin:4px;border-radius:6px;background:#fff;"
            "color:#222;font:bold 22px sans-serif;text-align:center;line-height:66px}"
            ".back{background:#8a1c1c;color:#fff}"
        )
        return (
            f"<style>{style}</style><p>Dealer{dealer_total}</p><div id='cards-dealer'>{dealer_hand}</div>"
            f"<p>You (total {facts.get('player_total', '?')})</p><div id='cards-you'>{hand(facts['player_cards'])}</div>"
            f"<p>{text}</p>"
        )

    def web_actions(self, observation: dict) -> List[tuple]:
        """A button per legal action, named as the observation names it."""
        actions = observation.get("legal_actions") or []
        names = observation.get("legal_action_names") or [str(a) for a in actions]
        game = observation.get("game_name") or self._state.game_name
        return [(name, {"action_id": a, "game_name": game}) for a, name in zip(actions, names, strict=False)]

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="openspiel_env",
            description="OpenSpiel games (blackjack, catch, tic_tac_toe, kuhn_poker, connect_four, ...) "
            "against bot opponents, with seeded chance and a readable text view",
            version="0.1.0",
        )

    # --- the game -----------------------------------------------------------------------------

    def _apply(self, action_id: int) -> None:
        self._spiel_state.apply_action(action_id)
        self._state.history.append(action_id)

    def _advance(self) -> None:
        spiel = self._spiel_state
        while not spiel.is_terminal():
            if spiel.is_chance_node():
                self._apply(self._sample_chance(spiel.chance_outcomes()))
            elif spiel.current_player() == self._state.agent_player:
                return
            else:
                move = self._bot.choose(spiel.legal_actions())
                self._opponent_last_action = move
                self._opponent_last_text = spiel.action_to_string(spiel.current_player(), move)
                self._apply(move)

    def _sample_chance(self, outcomes: List[tuple]) -> int:
        point = self._chance_rng.random()
        cumulative = 0.0
        for outcome, probability in outcomes:
            cumulative += probability
            if point < cumulative:
                return outcome
        return outcomes[-1][0]

    # --- observations -----------------------------------------------------------------------------

    def _info_state(self) -> List[float]:
        game_type = self._game.get_type()
        player = self._state.agent_player
        try:
            if game_type.provides_information_state_tensor:
                return list(self._spiel_state.information_state_tensor(player))
            if game_type.provides_observation_tensor:
                return list(self._spiel_state.observation_tensor(player))
        except pyspiel.SpielError:
            pass
        return []

    def _observe(self, phase: str, reward: Optional[float] = None, error: Optional[str] = None) -> OpenSpielObservation:
        spiel = self._spiel_state
        player = self._state.agent_player
        if reward is None:
            reward = self._reward_since_last()
        legal = [] if spiel.is_terminal() else spiel.legal_actions(player)
        name = self._state.game_name
        opponent = self._opponent_last_action
        text = describe(name, spiel, player, self._opponent_last_text if opponent is not None else None)
        if error is not None:
            text = f"Error: {error}.\n{text}"
        return OpenSpielObservation(
            info_state=self._info_state(),
            legal_actions=legal,
            game_phase=phase,
            current_player_id=spiel.current_player(),
            opponent_last_action=opponent,
            game_name=name,
            text=text,
            legal_action_names=action_names(name, spiel, player, legal),
            error=error,
            done=spiel.is_terminal(),
            reward=reward,
            metadata=facts(name, spiel, player),
        )

    def _reward_since_last(self) -> float:
        total = float(self._spiel_state.returns()[self._state.agent_player])
        reward, self._last_return = total - self._last_return, total
        return reward

    def _refuse(self, error: str) -> OpenSpielObservation:
        phase = "terminal" if self._spiel_state.is_terminal() else "playing"
        return self._observe(phase=phase, reward=0.0, error=error)
