"""Client of the Snake environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import SnakeAction, SnakeObservation, SnakeState


class SnakeEnv(EnvClient[SnakeAction, SnakeObservation, SnakeState]):
    """Drives one session of a Snake server over its WebSocket.

    ``reset(seed=..., height=..., width=..., observer=...)`` starts an episode;
    ``step(SnakeAction(action=1))`` turns left (``action="up"`` heads up). Use it with
    ``async with``, or through ``.sync()`` from blocking code.
    """

    def _step_payload(self, action: SnakeAction) -> Dict[str, Any]:
        return action.model_dump(mode="json")

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[SnakeObservation]:
        fields = dict(payload.get("observation") or {})
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = SnakeObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> SnakeState:
        return SnakeState.model_validate(payload)
