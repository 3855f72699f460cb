"""Client of the Grid World environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import GridWorldAction, GridWorldObservation, GridWorldState


class GridWorldEnv(EnvClient[GridWorldAction, GridWorldObservation, GridWorldState]):
    """Drives one session of a Grid World server over its WebSocket.

    ``reset(seed=..., size=..., num_walls=..., num_pits=..., max_steps=...)`` starts an episode;
    ``step(GridWorldAction(action="UP"))`` moves. Use it with ``async with``, or through
    ``.sync()`` from blocking code.
    """

    def _step_payload(self, action: GridWorldAction) -> Dict[str, Any]:
        return action.model_dump(mode="json")

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[GridWorldObservation]:
        fields = dict(payload.get("observation") or {})
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = GridWorldObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> GridWorldState:
        return GridWorldState.model_validate(payload)
