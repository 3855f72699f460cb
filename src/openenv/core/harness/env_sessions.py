"""Any served environment as harness sessions: its tools, its opening message, its reward.

``openenv eval`` runs a model over the tasks of whatever environment a URL serves, without code
written for that environment. :func:`describe_environment` reads the server's ``/schema``: an MCP
environment (its action is ``CallToolAction``) offers its own tools, listed over MCP; any other
offers one tool, ``act``, whose arguments are the environment's action (its JSON schema, the
``metadata`` field aside). :class:`EnvSessionFactory` then makes a
:class:`~openenv.core.harness.rollout.StepEnvSessionAdapter` per rollout: it resets the episode
(the task as ``seed``, or as the reset argument the caller names), opens the conversation with the
reset observation as text, and turns each tool call into one step, whose reward is the
environment's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from .rollout import Message, ResourceSessionFactory, StepEnvSessionAdapter, ToolResult, _error_text, _plain
from .tools import RESERVED_TOOL_NAMES

__all__ = ["ACT_TOOL", "EnvInterface", "EnvSessionFactory", "describe_environment", "observation_text"]

ACT_TOOL = "act"
"""The one tool of an environment that is not an MCP environment: its arguments are the action."""

TEXT_FIELDS = ("instruction", "question", "prompt", "text", "task", "goal", "message", "echoed_message", "content")
"""Observation fields that hold what an agent reads, in the order they are looked for."""
_NOT_SHOWN = ("reward", "done", "metadata")


@dataclass
class EnvInterface:
    """What an agent gets from an environment: ``kind`` ``"mcp"`` (its own tools) or ``"action"``
    (the one :data:`ACT_TOOL`), the tools, and the action's JSON schema (``"action"`` kind)."""

    kind: str
    tools: List[Any]
    action_schema: Dict[str, Any] = field(default_factory=dict)
    name: str = ""


def _get_json(base_url: str, path: str, headers: Optional[Dict[str, str]], timeout_s: float) -> Any:
    import httpx

    from openenv.core.utils import parse_endpoint

    endpoint = parse_endpoint(base_url)
    transport = httpx.HTTPTransport(uds=endpoint.uds) if endpoint.uds else None
    with httpx.Client(transport=transport, timeout=timeout_s, headers=headers or {}) as http:
        response = http.get(endpoint.http_url.rstrip("/") + path)
    if response.status_code >= 400:
        raise RuntimeError(f"{base_url}{path} answered HTTP {response.status_code}: {response.text[:300]}")
    return response.json()


def _action_tool(schema: Mapping[str, Any]) -> Any:
    from openenv.core.env_server.mcp_types import Tool

    arguments = {k: v for k, v in schema.items() if k not in ("title", "description")}
    properties = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    arguments["properties"] = properties
    arguments["required"] = [r for r in schema.get("required") or [] if r in properties]
    arguments["type"] = "object"
    title = schema.get("title") or "action"
    about = (schema.get("description") or "").strip()
    description = f"Take one step in the environment: its action ({title}) as the arguments."
    return Tool(name=ACT_TOOL, description=f"{description} {about}".strip(), input_schema=arguments)


def describe_environment(
    base_url: str, *, headers: Optional[Dict[str, str]] = None, timeout_s: float = 30.0
) -> EnvInterface:
    """The tools an agent gets from the environment at ``base_url`` (``http(s)://`` or ``unix://``).

    ``RuntimeError`` when the server does not answer its schema or (MCP) its tool list."""
    schema = _get_json(base_url, "/schema", headers, timeout_s)
    action = schema.get("action") if isinstance(schema, Mapping) else None
    if not isinstance(action, Mapping):
        raise RuntimeError(f"{base_url}/schema has no action schema")
    try:
        name = str(_get_json(base_url, "/metadata", headers, timeout_s).get("name") or "")
    except Exception:  # metadata is informative only
        name = ""
    if "tool_name" not in (action.get("properties") or {}):
        return EnvInterface("action", [_action_tool(action)], dict(action), name)
    from openenv.core.mcp_client import MCPToolClient

    with MCPToolClient(base_url=base_url, headers=headers, connect_timeout_s=timeout_s).sync() as client:
        tools = [t for t in client.list_tools() if t.name not in RESERVED_TOOL_NAMES]
    if not tools:
        raise RuntimeError(f"the MCP environment at {base_url} lists no tools an agent may call")
    return EnvInterface("mcp", tools, dict(action), name)


def observation_text(observation: Any) -> str:
    """What an agent reads of an observation: its text field (see :data:`TEXT_FIELDS`) when it has
    one, else the observation as JSON (reward, done and metadata left out)."""
    data = _plain(observation)
    if not isinstance(data, Mapping):
        return str(data)
    shown = {k: v for k, v in data.items() if k not in _NOT_SHOWN and v not in (None, "", [], {})}
    for name in TEXT_FIELDS:
        value = shown.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return json.dumps(shown, sort_keys=True, default=str)


class EnvSessionFactory(ResourceSessionFactory[StepEnvSessionAdapter]):
    """Sessions of the environment at ``base_url``, one per rollout (see the module docstring).

    ``create(task, seed=, episode_id=)`` resets with ``reset_kwargs``, plus ``seed`` and
    ``episode_id``, plus ``task`` as the reset argument ``task_key`` when that is not ``"seed"``
    (``task_key="task_id"``, say, for an environment that picks its task that way). The opening
    messages are ``system_prompt`` (when given) and the reset observation as text. Every call on
    the environment is bounded by ``call_timeout_s`` (see ``StepEnvSessionAdapter``); a client
    that loses its server gives up reconnecting after ``reconnect_timeout_s``."""

    def __init__(
        self,
        base_url: str,
        *,
        interface: Optional[EnvInterface] = None,
        reset_kwargs: Optional[Dict[str, Any]] = None,
        system_prompt: Optional[str] = None,
        task_key: str = "seed",
        call_timeout_s: Optional[float] = 60.0,
        reconnect_timeout_s: float = 5.0,
        headers: Optional[Dict[str, str]] = None,
    ) -> None:
        self.base_url = base_url
        self.headers = dict(headers or {})
        self.interface = interface or describe_environment(base_url, headers=self.headers)
        self.reset_kwargs = dict(reset_kwargs or {})
        self.system_prompt = system_prompt
        self.task_key = task_key
        self.call_timeout_s = call_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s

    def _client(self) -> Any:
        # One client for both kinds: an MCP environment's tool call is its CallToolAction as a dict
        # (MCPToolClient would read an observation with a "tools" field as a tool listing).
        from openenv.core.generic_client import GenericEnvClient

        return GenericEnvClient(
            base_url=self.base_url,
            headers=self.headers or None,
            connect_timeout_s=10.0,
            message_timeout_s=self.call_timeout_s or 60.0,
            reconnect_timeout_s=self.reconnect_timeout_s,
        )

    def _action(self, name: str, arguments: Dict[str, Any]) -> Any:
        if self.interface.kind == "mcp":
            return {"type": "call_tool", "tool_name": name, "arguments": dict(arguments)}
        return dict(arguments)

    @staticmethod
    def _mcp_result(name: str, arguments: Dict[str, Any], step: Any, state: Any) -> ToolResult:
        """An MCP tool call's result as the model reads it: the value the tool returned (not the
        MCP envelope around it), or its error; the step's reward and the state as metadata."""
        from openenv.core.env_server.mcp_types import tool_result_value

        observation = _plain(getattr(step, "observation", None))
        value = tool_result_value(observation.get("result")) if isinstance(observation, Mapping) else observation
        reward = getattr(step, "reward", None)
        return ToolResult(
            data=value,
            done=bool(getattr(step, "done", False)),
            metadata={"reward": reward, "state": _plain(state)},
            error=_error_text(observation),
        )

    def _opening(self, reset: Any, task: Any) -> List[Message]:
        messages: List[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": observation_text(getattr(reset, "observation", reset))})
        return messages

    def create(self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None) -> StepEnvSessionAdapter:
        kwargs = dict(self.reset_kwargs)
        if self.task_key != "seed" and task is not None:
            kwargs[self.task_key] = task
        return StepEnvSessionAdapter(
            self._client(),
            task=task,
            seed=seed if self.task_key == "seed" else None,
            episode_id=episode_id,
            tool_specs=self.interface.tools,
            action_builder=self._action,
            initial_messages_builder=self._opening,
            tool_result_builder=self._mcp_result if self.interface.kind == "mcp" else None,
            reset_kwargs=kwargs,
            call_timeout_s=self.call_timeout_s,
        )
