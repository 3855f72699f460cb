"""Client of the TextArena environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import TextArenaAction, TextArenaObservation, TextArenaState


class TextArenaEnv(EnvClient[TextArenaAction, TextArenaObservation, TextArenaState]):
    """Drives one session of a TextArena environment server over its WebSocket::

    with TextArenaEnv(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=0, game="Wordle-v0")
        result = env.step(TextArenaAction(message="[crane]"))
    """

    def _step_payload(self, action: TextArenaAction) -> Dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[TextArenaObservation]:
        fields = dict(payload.get("observation") or {})
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = TextArenaObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> TextArenaState:
        return TextArenaState.model_validate(payload)
