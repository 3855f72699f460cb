"""Client of the Connect Four environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import Connect4Action, Connect4Observation, Connect4State


class Connect4Env(EnvClient[Connect4Action, Connect4Observation, Connect4State]):
    """Drives one session of a Connect Four environment server over its WebSocket.

    ``reset(seed=..., opponent="random"|"greedy", agent_player=1|-1)`` starts a game;
    ``step(Connect4Action(column=3))`` drops a piece::

        async with Connect4Env(base_url="http://127.0.0.1:8000") as env:
            result = await env.reset(seed=0, opponent="greedy")
            result = await env.step(Connect4Action(column=3))
            print(result.observation.text)

        with Connect4Env.from_env("connect4_env").sync() as env:  # its own sandboxed server
            result = env.reset(seed=0)
    """

    def _step_payload(self, action: Connect4Action) -> Dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[Connect4Observation]:
        known = Connect4Observation.model_fields
        fields = {k: v for k, v in (payload.get("observation") or {}).items() if k in known}
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = Connect4Observation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> Connect4State:
        return Connect4State.model_validate(payload)
