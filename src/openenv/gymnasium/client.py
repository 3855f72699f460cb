"""``GymnasiumClient``: the typed client of a served Gymnasium environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import GymnasiumAction, GymnasiumObservation, GymnasiumState


class GymnasiumClient(EnvClient[GymnasiumAction, GymnasiumObservation, GymnasiumState]):
    """Drives one session of a :class:`~openenv.gymnasium.GymnasiumEnvironment` server.

    ``reset(seed=..., env_id="CartPole-v1", **make_kwargs)`` makes and resets the environment;
    ``step(GymnasiumAction(action=1))`` steps it. Values are in JSON form; wrap the client with
    :func:`~openenv.gymnasium.to_gymnasium` for a ``gymnasium.Env`` that speaks NumPy.
    """

    def _step_payload(self, action: GymnasiumAction) -> Dict[str, Any]:
        return action.model_dump(mode="json")

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[GymnasiumObservation]:
        fields = dict(payload.get("observation") or {})
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = GymnasiumObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> GymnasiumState:
        return GymnasiumState.model_validate(payload)
