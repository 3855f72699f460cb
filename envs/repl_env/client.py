"""Client of the REPL environment."""

from __future__ import annotations

from typing import Any, Dict, List

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import REPLAction, REPLObservation, REPLState


class REPLEnv(EnvClient[REPLAction, REPLObservation, REPLState]):
    """Drives one session of a REPL environment server: a persistent sandboxed interpreter.

    ``reset(seed=...)`` picks one of the shipped tasks (or ``reset(task_id=...)``, or a task of
    your own: ``reset(context=..., task_prompt=..., expected_answer=...)``); ``execute(code)``
    runs code, keeping variables between steps; ``submit_final_answer(answer)`` ends the
    episode. Like ``reset``/``step``/``state``, these return awaitables in async code and values
    from ``.sync()``::

        with REPLEnv.from_env("repl_env").sync() as env:
            env.reset(task_id="sum_numbers")
            env.execute("numbers = [int(x) for x in context.split(',')]")
            result = env.submit_final_answer("444")
            assert result.done and result.reward == 1.0
    """

    def _step_payload(self, action: REPLAction) -> Dict[str, Any]:
        return {"code": action.code, "is_final": action.is_final, "final_answer": action.final_answer}

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[REPLObservation]:
        fields = dict(payload.get("observation") or {})
        fields.update(reward=payload.get("reward"), done=bool(payload.get("done", False)))
        observation = REPLObservation.model_validate(fields)
        return StepResult(
            observation=observation,
            reward=observation.reward,
            done=observation.done,
            metadata=payload.get("metadata", observation.metadata),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> REPLState:
        return REPLState.model_validate(payload)

    def execute(self, code: str) -> Any:
        """Run ``code`` in the session's interpreter (a step)."""
        return self.step(REPLAction(code=code))

    def submit_final_answer(self, answer: str) -> Any:
        """Give the final answer (a step that ends the episode)."""
        return self.step(REPLAction(is_final=True, final_answer=answer))

    def get_variable(self, name: str) -> Any:
        """A step that prints ``repr(name)`` (to ``observation.result.stdout``)."""
        if not name.isidentifier():
            raise ValueError(f"{name!r} is not a variable name")
        return self.execute(f"print(repr({name}))")

    def list_variables(self) -> Any:
        """The names defined in the session's interpreter (from ``state()``)."""
        return self._dispatch(self._list_variables_async)

    async def _list_variables_async(self) -> List[str]:
        return list((await self._state_async()).namespace_keys)
