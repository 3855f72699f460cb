"""Client of the shell environment."""

from __future__ import annotations

from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_server.types import Observation
from openenv.core.mcp_client import MCPToolClient

from .models import ShellObservation, ShellState


class ShellEnv(MCPToolClient):
    """Talks to a shell environment server.

    ``reset(task_id=...)`` or ``reset(seed=...)`` returns a :class:`ShellObservation` (the task's
    instruction and files); ``step(CallToolAction(tool_name=..., arguments=...))`` calls a tool
    (``run_command``, ``read_file``, ``write_file``, ``list_dir``, ``submit``) and returns its value in
    ``observation.result``; ``submit`` ends the episode with reward 1.0 or 0.0.
    """

    OBSERVATION_CLS = ShellObservation
    STATE_CLS = ShellState

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[Observation]:
        data = payload.get("observation") or {}
        if "instruction" in data:
            observation = self.OBSERVATION_CLS(
                **{**data, "done": payload.get("done", False), "reward": payload.get("reward")}
            )
            return StepResult(observation=observation, reward=observation.reward, done=observation.done)
        return super()._parse_result(payload)

    def _parse_state(self, payload: Dict[str, Any]) -> ShellState:
        return self.STATE_CLS(**payload)
