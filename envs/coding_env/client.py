"""Client of the coding environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import CodeAction, CodeObservation, CodeState


class CodingEnv(EnvClient[CodeAction, CodeObservation, CodeState]):
    """Drives one session of a coding environment server.

    ``step(CodeAction(code=...))`` runs the code in a fresh sandboxed process and returns its
    ``stdout``, ``stderr`` and ``exit_code``; ``state()`` adds ``last_exit_code``::

        with CodingEnv.from_env("coding_env").sync() as env:
            env.reset()
            result = env.step(CodeAction(code="print(6 * 7)"))
            assert result.observation.stdout == "42\\n"
    """

    def _step_payload(self, action: CodeAction) -> Dict[str, Any]:
        return {"code": action.code}

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[CodeObservation]:
        fields = dict(payload.get("observation") or {})
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = CodeObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> CodeState:
        return CodeState.model_validate(payload)
