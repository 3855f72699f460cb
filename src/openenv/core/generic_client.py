"""A client for any environment, speaking plain dicts (no typed models needed)."""

from __future__ import annotations

from typing import Any, Dict

from .client_types import StepResult
from .env_client import EnvClient


class GenericAction(dict):
    """An action as a plain dict: ``GenericAction(message="hi")``."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.items())
        return f"GenericAction({fields})"


class GenericEnvClient(EnvClient[Dict[str, Any], Dict[str, Any], Dict[str, Any]]):
    """Sends actions as dicts and returns observations and state as dicts."""

    def _step_payload(self, action: Any) -> Dict[str, Any]:
        if isinstance(action, dict):
            return dict(action)
        model_dump = getattr(action, "model_dump", None)
        if callable(model_dump):
            return model_dump()
        if hasattr(action, "__dict__"):
            return dict(vars(action))
        return dict(action)

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[Dict[str, Any]]:
        return StepResult(
            observation=payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> Dict[str, Any]:
        return payload
