"""Client of the chess environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import ChessAction, ChessObservation, ChessState


class ChessEnv(EnvClient[ChessAction, ChessObservation, ChessState]):
    """Drives one session of a chess environment server over its WebSocket.

    ``reset(seed=..., opponent="random"|"minimax", opponent_depth=2, agent_color="white"|"black",
    max_plies=500, fen=None)`` starts a game; ``step(ChessAction(move="e4"))`` plays a move (UCI or
    SAN)::

        async with ChessEnv(base_url="http://127.0.0.1:8000") as env:
            result = await env.reset(seed=0, opponent="random")
            result = await env.step(ChessAction(move="e2e4"))
            print(result.observation.text)

        with ChessEnv.from_env("chess_env").sync() as env:  # its own sandboxed server
            result = env.reset(seed=0)
    """

    def _step_payload(self, action: ChessAction) -> Dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[ChessObservation]:
        known = ChessObservation.model_fields
        fields = {k: v for k, v in (payload.get("observation") or {}).items() if k in known}
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = ChessObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> ChessState:
        return ChessState.model_validate(payload)
