"""Client of the Reasoning Gym environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import ReasoningGymAction, ReasoningGymObservation, ReasoningGymState


class ReasoningGymEnv(EnvClient[ReasoningGymAction, ReasoningGymObservation, ReasoningGymState]):
    """Drives one session of a Reasoning Gym environment server over its WebSocket::

    with ReasoningGymEnv(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(dataset_name="leg_counting", seed=42, size=10)
        result = env.step(ReasoningGymAction(answer="4"))
    """

    def _step_payload(self, action: ReasoningGymAction) -> Dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[ReasoningGymObservation]:
        fields = dict(payload.get("observation") or {})
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = ReasoningGymObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> ReasoningGymState:
        return ReasoningGymState.model_validate(payload)
