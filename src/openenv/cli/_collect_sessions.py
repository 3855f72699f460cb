"""The sessions and the scripted player of ``openenv collect`` (imported when the command runs).

:class:`OpenSpielSessionFactory` and :class:`ReasoningGymSessionFactory` make the episodes of the
two kinds of environment upstream's command plays, on clients the caller makes (``OpenSpielEnv``,
``ReasoningGymEnv``); :func:`build_scripted_model_step` is the player without a model.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, List, Optional

from openenv.core.harness.rollout import ModelStepResult, ResourceSessionFactory, StepEnvSessionAdapter
from openenv.core.llm_client import LLMResponse, ToolCall

__all__ = ["OpenSpielSessionFactory", "ReasoningGymSessionFactory", "build_scripted_model_step"]


def _tool(name: str, description: str, properties: Dict[str, Any]) -> Any:
    from openenv.core.env_server.mcp_types import Tool

    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return Tool(name=name, description=description, input_schema=schema)


def _legal_actions_line(observation: Any) -> str:
    legal = list(getattr(observation, "legal_actions", None) or [])
    names = list(getattr(observation, "legal_action_names", None) or [])
    if not legal:
        return ""
    shown = (
        [f"{a} ({n})" for a, n in zip(legal, names, strict=True)]
        if len(names) == len(legal)
        else [str(a) for a in legal]
    )
    return f"Legal action ids: {', '.join(shown)}"


class OpenSpielSessionFactory(ResourceSessionFactory[StepEnvSessionAdapter]):
    """Episodes of an OpenSpiel game (``game_name``) on a client from ``client_factory``: one tool,
    ``play(action_id)``; the opening message is the position in words with the legal action ids."""

    def __init__(
        self,
        client_factory: Callable[[], Any],
        *,
        game_name: str,
        system_prompt: Optional[str] = None,
        action_class: Any = None,
    ):
        self.client_factory = client_factory
        self.action_class = action_class
        self.game_name = game_name
        self.system_prompt = system_prompt
        self.tools = [
            _tool(
                "play",
                "Play one of the legal actions, by its id.",
                {"action_id": {"type": "integer", "description": "One of the legal action ids."}},
            )
        ]

    def _action(self, name: str, arguments: Dict[str, Any]) -> Any:
        if self.action_class is None:
            from openspiel_env import OpenSpielAction

            self.action_class = OpenSpielAction
        return self.action_class(action_id=int(arguments["action_id"]), game_name=self.game_name)

    def _opening(self, reset: Any, task: Any) -> List[Dict[str, Any]]:
        observation = reset.observation
        text = "\n".join(p for p in (getattr(observation, "text", ""), _legal_actions_line(observation)) if p)
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*messages, {"role": "user", "content": text or f"A game of {self.game_name}: your move."}]

    def create(self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None) -> StepEnvSessionAdapter:
        return StepEnvSessionAdapter(
            self.client_factory(),
            task=task,
            seed=seed,
            episode_id=episode_id,
            tool_specs=self.tools,
            action_builder=self._action,
            initial_messages_builder=self._opening,
            reset_kwargs={"game_name": self.game_name},
        )


class ReasoningGymSessionFactory(ResourceSessionFactory[StepEnvSessionAdapter]):
    """Questions of a Reasoning Gym dataset (``dataset_name``, ``dataset_config``): one tool,
    ``answer(answer)``, whose step is scored by the environment; the opening message is the question."""

    def __init__(
        self,
        client_factory: Callable[[], Any],
        *,
        dataset_name: str,
        dataset_config: Optional[Dict[str, Any]] = None,
        system_prompt: Optional[str] = None,
        action_class: Any = None,
    ):
        self.client_factory = client_factory
        self.action_class = action_class
        self.dataset_name = dataset_name
        self.dataset_config = dict(dataset_config or {})
        self.system_prompt = system_prompt
        self.tools = [_tool("answer", "Give your final answer.", {"answer": {"type": "string"}})]

    def _action(self, name: str, arguments: Dict[str, Any]) -> Any:
        if self.action_class is None:
            from reasoning_gym_env import ReasoningGymAction

            self.action_class = ReasoningGymAction
        return self.action_class(answer=str(arguments.get("answer", "")))

    def _opening(self, reset: Any, task: Any) -> List[Dict[str, Any]]:
        question = getattr(reset.observation, "question", None) or ""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*messages, {"role": "user", "content": question}]

    def create(self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None) -> StepEnvSessionAdapter:
        reset = {"dataset_name": self.dataset_name}
        if self.dataset_config:
            reset["dataset_config"] = self.dataset_config
        return StepEnvSessionAdapter(
            self.client_factory(),
            task=task,
            seed=seed,
            episode_id=episode_id,
            tool_specs=self.tools,
            action_builder=self._action,
            initial_messages_builder=self._opening,
            reset_kwargs=reset,
        )


_LEGAL = re.compile(r"Legal action ids: ([0-9, ()A-Za-z_\-]+)")


def _legal_from(messages: List[Dict[str, Any]]) -> List[int]:
    """The legal action ids the last observation in the conversation lists."""
    for message in reversed(messages):
        content = message.get("content")
        if not isinstance(content, str):
            continue
        if message.get("role") == "tool":
            try:
                data = json.loads(content.split("\nError: ")[0])
            except ValueError:
                continue
            observation = data.get("observation") if isinstance(data, dict) else None
            if isinstance(observation, dict) and isinstance(observation.get("legal_actions"), list):
                return [int(a) for a in observation["legal_actions"]]
        found = _LEGAL.search(content)
        if found:
            return [int(m) for m in re.findall(r"(?:^|, )(\d+)", found.group(1))]
    return []


def build_scripted_model_step() -> Callable[..., ModelStepResult]:
    """A player without a model: the first legal action (``play``), or an empty answer (``answer``)."""

    def step(messages: List[Dict[str, Any]], tools: List[Any], sampling: Dict[str, Any]) -> ModelStepResult:
        names = [getattr(t, "name", None) or t.get("name") for t in tools]
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if "play" in names:
            legal = _legal_from(messages)
            if not legal:
                return ModelStepResult(LLMResponse("No legal action left."))
            return ModelStepResult(LLMResponse(None, [ToolCall(f"call_{turn}", "play", {"action_id": legal[0]})]))
        if "answer" in names:
            return ModelStepResult(LLMResponse(None, [ToolCall(f"call_{turn}", "answer", {"answer": ""})]))
        return ModelStepResult(LLMResponse("I have no move."))

    return step
