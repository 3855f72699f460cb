"""Gymnasium's classic-control environments served by OpenEnv (client ``GymnasiumEnv``)."""

from .client import GymnasiumEnv
from .models import GymnasiumAction, GymnasiumObservation, GymnasiumState

__all__ = ["GymnasiumAction", "GymnasiumEnv", "GymnasiumObservation", "GymnasiumState"]
