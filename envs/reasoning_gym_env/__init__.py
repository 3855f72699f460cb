"""The Reasoning Gym environment: verifiable reasoning questions from the reasoning-gym package."""

from .client import ReasoningGymEnv
from .models import ReasoningGymAction, ReasoningGymObservation, ReasoningGymState

__all__ = ["ReasoningGymAction", "ReasoningGymEnv", "ReasoningGymObservation", "ReasoningGymState"]
