"""Models of the Reasoning Gym environment (the field names of upstream OpenEnv's reasoning_gym_env)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from pydantic import Field

from openenv.core.env_server.types import Action, Observation, State


class ReasoningGymAction(Action):
    """The agent's answer to the current question."""

    answer: str = Field(..., max_length=100_000)


class ReasoningGymObservation(Observation):
    """After ``reset``: the ``question``. After ``step``: the ``score`` (also the reward), the
    ``correct_answer`` and the entry's ``dataset_metadata``; the episode is then done.

    A reset or step that cannot be served (an unknown dataset, a bad config, a step without a
    question) says why in ``metadata["error"]``.
    """

    question: Optional[str] = None
    score: Optional[float] = None
    correct_answer: Optional[str] = None
    dataset_metadata: Optional[Dict[str, Any]] = None


class ReasoningGymState(State):
    """Which dataset the session draws from, and where in it the current question is."""

    dataset_name: Optional[str] = None
    dataset_config: Dict[str, Any] = Field(default_factory=dict)
    dataset_specs: Optional[List[Dict[str, Any]]] = None
    seed: Optional[int] = None
    size: Optional[int] = None
    index: Optional[int] = None
    answered: bool = False


__all__ = ["ReasoningGymAction", "ReasoningGymObservation", "ReasoningGymState"]
