"""Client of the OpenSpiel environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import OpenSpielAction, OpenSpielObservation, OpenSpielState


class OpenSpielEnv(EnvClient[OpenSpielAction, OpenSpielObservation, OpenSpielState]):
    """Drives one session of an OpenSpiel environment server over its WebSocket.

    ``reset(seed=..., game_name=..., game_params=..., agent_player=..., opponent_policy=...)``
    starts an episode; ``step(OpenSpielAction(action_id=...))`` plays a move::

        async with OpenSpielEnv(base_url="http://127.0.0.1:8000") as env:
            result = await env.reset(seed=0, game_name="blackjack")
            print(result.observation.text)
            result = await env.step(OpenSpielAction(action_id=1))  # STAND

        with OpenSpielEnv.from_env("openspiel_env").sync() as env:  # its own sandboxed server
            result = env.reset(seed=0, game_name="tic_tac_toe")
    """

    def _step_payload(self, action: OpenSpielAction) -> Dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[OpenSpielObservation]:
        known = OpenSpielObservation.model_fields
        fields = {k: v for k, v in (payload.get("observation") or {}).items() if k in known}
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = OpenSpielObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> OpenSpielState:
        return OpenSpielState.model_validate(payload)
