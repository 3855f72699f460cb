"""Server side of the Reasoning Gym environment."""

from .reasoning_gym_environment import ReasoningGymEnvironment

__all__ = ["ReasoningGymEnvironment"]
