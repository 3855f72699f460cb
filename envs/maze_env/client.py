"""Client of the Maze environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import MazeAction, MazeObservation, MazeState


class MazeEnv(EnvClient[MazeAction, MazeObservation, MazeState]):
    """Drives one session of a Maze server over its WebSocket.

    ``reset(seed=..., size=9)`` starts an episode in a new maze; ``step(MazeAction(action=3))``
    (or ``action="right"``) moves. Use it with ``async with``, or through ``.sync()`` from
    blocking code.
    """

    def _step_payload(self, action: MazeAction) -> Dict[str, Any]:
        return action.model_dump(mode="json")

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[MazeObservation]:
        fields = dict(payload.get("observation") or {})
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = MazeObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> MazeState:
        return MazeState.model_validate(payload)
