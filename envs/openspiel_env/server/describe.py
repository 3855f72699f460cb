"""Readable descriptions of OpenSpiel positions, for agents that read text (LLMs).

``describe(state, player)`` gives the position from ``player``'s seat and ``action_names``
names the legal actions. Blackjack and Kuhn poker have descriptions of their own (OpenSpiel's
strings for them are terse codes); every other game shows OpenSpiel's observation string.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import pyspiel

_RANKS = ["A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K"]
_BLACKJACK_ACTIONS = {0: "HIT", 1: "STAND"}
_KUHN_CARDS = ["J", "Q", "K"]


def blackjack_card(card: int) -> str:
    """OpenSpiel blackjack card index (suit * 13 + rank, rank 0 = ace) as its rank: A, 2..10, J, Q, K."""
    return _RANKS[card % 13]


def blackjack_total(cards: List[int]) -> tuple:
    """``(total, soft)``: the best total of a hand, and whether an ace counts 11 in it."""
    hard = sum(min(card % 13 + 1, 10) for card in cards)
    soft = any(card % 13 == 0 for card in cards) and hard + 10 <= 21
    return (hard + 10 if soft else hard), soft


def _hand(cards: List[int]) -> str:
    total, soft = blackjack_total(cards)
    note = ", soft" if soft else (", bust" if total > 21 else "")
    return f"{', '.join(blackjack_card(c) for c in cards)} (total {total}{note})"


def _outcome(value: float) -> str:
    if value > 0:
        return f"You win (reward {value:+g})."
    if value < 0:
        return f"You lose (reward {value:+g})."
    return "Push: a tie (reward 0)."


def _blackjack(state: Any, player: int) -> str:
    mine = list(state.cards(player))
    if state.is_terminal():
        dealer = list(state.cards(state.dealer_id()))
        return f"Your cards: {_hand(mine)}. Dealer's cards: {_hand(dealer)}. {_outcome(state.returns()[player])}"
    return f"Your cards: {_hand(mine)}. Dealer shows: {blackjack_card(state.dealers_visible_card())}."


def _kuhn_poker(state: Any, player: int) -> str:
    history = state.history()
    num_players = state.num_players()
    parts = []
    if len(history) > player:
        parts.append(f"Your card: {_KUHN_CARDS[history[player]]} (J < Q < K).")
    bets = [
        ("You" if i % num_players == player else f"Player {i % num_players}") + (" bet" if a else " passed")
        for i, a in enumerate(history[num_players:])
    ]
    parts.append(f"Betting so far: {', '.join(bets) if bets else 'none'}.")
    if state.is_terminal():
        cards = ", ".join(f"player {p}: {_KUHN_CARDS[c]}" for p, c in enumerate(history[:num_players]))
        parts.append(f"Cards: {cards}. {_outcome(state.returns()[player])}")
    return " ".join(parts)


def facts(game_name: str, state: Any, player: int) -> Dict[str, Any]:
    """Structured facts of the position for games that have them (blackjack: the cards and
    totals), else an empty dict."""
    if game_name != "blackjack":
        return {}
    mine = list(state.cards(player))
    total, soft = blackjack_total(mine)
    found: Dict[str, Any] = {
        "player_cards": [blackjack_card(c) for c in mine],
        "player_total": total,
        "player_soft": soft,
        "dealer_shows": blackjack_card(state.dealers_visible_card()),
    }
    if state.is_terminal():
        dealer = list(state.cards(state.dealer_id()))
        found["dealer_cards"] = [blackjack_card(c) for c in dealer]
        found["dealer_total"] = blackjack_total(dealer)[0]
    return found


_DESCRIBERS: Dict[str, Callable[[Any, int], str]] = {"blackjack": _blackjack, "kuhn_poker": _kuhn_poker}


def action_names(game_name: str, state: Any, player: int, actions: List[int]) -> List[str]:
    """Names of ``actions`` for ``player`` (blackjack's are HIT and STAND)."""
    if game_name == "blackjack":
        return [_BLACKJACK_ACTIONS.get(a, str(a)) for a in actions]
    return [state.action_to_string(player, a) for a in actions]


def describe(game_name: str, state: Any, player: int, opponent_action: Optional[str] = None) -> str:
    """The position seen from ``player``'s seat, the opponent's last move and the legal actions."""
    describer = _DESCRIBERS.get(game_name)
    if describer is not None:
        body = describer(state, player)
    else:
        body = _generic(state, player)
    lines = [body]
    if opponent_action is not None:
        lines.insert(0, f"Opponent played: {opponent_action}.")
    if not state.is_terminal() and state.current_player() == player:
        legal = state.legal_actions(player)
        names = action_names(game_name, state, player, legal)
        lines.append("Actions: " + ", ".join(f"{a}={n}" for a, n in zip(legal, names, strict=True)))
    elif state.is_terminal() and describer is None:
        value = state.returns()[player]
        lines.append(
            f"Game over. {_outcome(value)}" if state.num_players() > 1 else f"Game over. Your return: {value:g}."
        )
    return "\n".join(lines)


def _generic(state: Any, player: int) -> str:
    game_type = state.get_game().get_type()
    header = f"You are player {player}." if state.num_players() > 1 else ""
    try:
        board = state.observation_string(player) if game_type.provides_observation_string else str(state)
    except pyspiel.SpielError:
        board = str(state)
    return "\n".join(part for part in (header, board.rstrip()) if part)
