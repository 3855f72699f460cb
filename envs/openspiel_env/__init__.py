"""OpenSpiel games (blackjack, catch, tic_tac_toe, kuhn_poker, connect_four, ...) as an OpenEnv environment."""

from .client import OpenSpielEnv
from .models import OpenSpielAction, OpenSpielObservation, OpenSpielState

__all__ = ["OpenSpielAction", "OpenSpielEnv", "OpenSpielObservation", "OpenSpielState"]
