"""Clients for language-model endpoints, used by LLM judges and agent loops.

``OpenAIClient`` speaks the OpenAI chat-completions API that vLLM, SGLang, llama.cpp, Ollama,
TGI and the hosted services all serve; ``AnthropicClient`` speaks Anthropic's messages API. Both
go over ``httpx`` (no vendor SDK needed), with a timeout and a clear error for every failure.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit


class LLMError(RuntimeError):
    """The endpoint could not be reached or answered something unusable."""


@dataclass
class ToolCall:
    """One function call the model asked for."""

    id: str
    name: str
    args: Dict[str, Any] = field(default_factory=dict)


@dataclass
class LLMResponse:
    """A model's reply: text and/or tool calls."""

    content: Optional[str] = None
    tool_calls: List[ToolCall] = field(default_factory=list)

    def to_message_dict(self) -> Dict[str, Any]:
        """The reply as an OpenAI-format assistant message (to append to a conversation)."""
        message: Dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.args)}}
                for c in self.tool_calls
            ]
        return message


def _base_url(endpoint: str, port: Optional[int]) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"an LLM endpoint must be an http(s) URL, got {endpoint!r}")
    if not parts.hostname:
        raise ValueError(f"the LLM endpoint {endpoint!r} has no host")
    if parts.username or parts.password:
        raise ValueError("put credentials in api_key, not in the endpoint URL")
    if parts.query or parts.fragment:
        raise ValueError(f"the LLM endpoint {endpoint!r} must not have a query or fragment")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"port must be within 1-65535, got {port}")
    try:
        url_port = parts.port
    except ValueError:
        raise ValueError(f"the LLM endpoint {endpoint!r} has an invalid port") from None
    if url_port is not None and port is not None and url_port != port:
        raise ValueError(f"the endpoint says port {url_port} but port={port} was given")
    netloc = parts.netloc if url_port is not None or port is None else f"{parts.netloc}:{port}"
    return f"{parts.scheme}://{netloc}{parts.path}".rstrip("/")


class LLMClient(ABC):
    """An LLM endpoint: ``await complete(prompt)`` returns the reply's text.

    ``endpoint`` and ``port`` are checked when a request needs them (:attr:`base_url`), not at
    construction, so a test double built with a placeholder (``("http://mock", 0)``, as upstream
    users write) works as long as it answers ``complete`` itself."""

    def __init__(self, endpoint: str, port: Optional[int] = None) -> None:
        self.endpoint = endpoint
        self.port = port

    @property
    def base_url(self) -> str:
        """The endpoint with its port, checked: ``ValueError`` saying what is wrong with it."""
        return _base_url(self.endpoint, self.port)

    @abstractmethod
    async def complete(self, prompt: str, **kwargs: Any) -> str:
        """The model's text reply to ``prompt``."""

    async def complete_with_tools(
        self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]], **kwargs: Any
    ) -> LLMResponse:
        """A reply to a conversation, with MCP-style ``tools`` (name, description, inputSchema)."""
        raise NotImplementedError(f"{type(self).__name__} does not support tool calls")


def clean_schema(schema: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """An MCP input schema made acceptable to function calling: an object with properties."""
    schema = dict(schema or {})
    for key in ("oneOf", "anyOf"):
        options = schema.pop(key, None)
        if options:
            chosen = next((o for o in options if isinstance(o, dict) and o.get("type") == "object"), options[0])
            schema.update({k: v for k, v in chosen.items() if k not in schema})
    for part in schema.pop("allOf", None) or []:
        if isinstance(part, dict):
            schema.setdefault("properties", {}).update(part.get("properties") or {})
            required = schema.setdefault("required", [])
            required.extend(r for r in part.get("required") or [] if r not in required)
    schema["type"] = "object"
    schema.setdefault("properties", {})
    return schema


class _HTTPClient(LLMClient):
    def __init__(self, endpoint: str, port: Optional[int], timeout_s: float) -> None:
        super().__init__(endpoint, port)
        self.timeout_s = timeout_s

    async def _post(self, url: str, payload: Dict[str, Any], headers: Dict[str, str]) -> Dict[str, Any]:
        import httpx  # imported on first use: ``import openenv.core`` stays light

        # One connection per request: a judge may be called from short-lived event loops
        # (``Environment._apply_rubric`` from a worker thread), which a pooled client cannot outlive.
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as http:
                response = await http.post(url, json=payload, headers=headers)
        except httpx.TimeoutException:
            raise LLMError(f"{url} did not answer within {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise LLMError(f"cannot reach {url}: {exc}") from None
        if response.status_code >= 400:
            raise LLMError(f"{url} answered HTTP {response.status_code}: {response.text[:500]}")
        try:
            data = response.json()
        except ValueError:
            raise LLMError(f"{url} answered something that is not JSON: {response.text[:200]!r}") from None
        if not isinstance(data, dict):
            raise LLMError(f"{url} answered {type(data).__name__} JSON, expected an object")
        return data


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


class OpenAIClient(_HTTPClient):
    """An OpenAI-compatible chat-completions endpoint (``/v1`` is added when the URL has no path)."""

    def __init__(
        self,
        endpoint: str,
        port: Optional[int] = None,
        model: str = "default",
        api_key: Optional[str] = None,
        system_prompt: Optional[str] = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
        use_max_completion_tokens: bool = False,
        timeout_s: float = 60.0,
    ) -> None:
        super().__init__(endpoint, port, timeout_s)
        self.model = model
        self.api_key = api_key or "not-needed"
        self.system_prompt = system_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.use_max_completion_tokens = use_max_completion_tokens

    @property
    def api_url(self) -> str:
        return self.base_url if urlsplit(self.base_url).path else f"{self.base_url}/v1"

    def _payload(self, messages: List[Dict[str, Any]], kwargs: Dict[str, Any]) -> Dict[str, Any]:
        payload: Dict[str, Any] = {"model": self.model, "messages": messages}
        if self.use_max_completion_tokens:
            payload["max_completion_tokens"] = kwargs.pop("max_tokens", self.max_tokens)
        else:
            payload["max_tokens"] = kwargs.pop("max_tokens", self.max_tokens)
            payload["temperature"] = kwargs.pop("temperature", self.temperature)
        payload.update(kwargs)
        return payload

    async def _chat(self, payload: Dict[str, Any]) -> Dict[str, Any]:
        data = await self._post(
            f"{self.api_url}/chat/completions", payload, {"Authorization": f"Bearer {self.api_key}"}
        )
        try:
            return data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise LLMError(f"the reply has no choices[0].message: {json.dumps(data)[:300]}") from None

    async def complete(self, prompt: str, **kwargs: Any) -> str:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": prompt})
        message = await self._chat(self._payload(messages, kwargs))
        return _text(message.get("content"))

    async def complete_with_tools(
        self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]], **kwargs: Any
    ) -> LLMResponse:
        payload = self._payload(list(messages), kwargs)
        if tools:
            payload["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t.get("description") or "",
                        "parameters": clean_schema(t.get("inputSchema") or t.get("input_schema")),
                    },
                }
                for t in tools
            ]
        message = await self._chat(payload)
        calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            raw = function.get("arguments") or "{}"
            try:
                args = json.loads(raw) if isinstance(raw, str) else dict(raw)
            except ValueError:
                raise LLMError(f"tool call {function.get('name')!r} has arguments that are not JSON: {raw!r}") from None
            calls.append(ToolCall(id=call.get("id") or "", name=function.get("name") or "", args=args))
        return LLMResponse(content=_text(message.get("content")) or None, tool_calls=calls)


class AnthropicClient(_HTTPClient):
    """Anthropic's messages API (OpenAI-format conversations are converted)."""

    def __init__(
        self,
        endpoint: str = "https://api.anthropic.com",
        port: Optional[int] = None,
        model: str = "claude-sonnet-4-5",
        api_key: Optional[str] = None,
        system_prompt: Optional[str] = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
        timeout_s: float = 60.0,
    ) -> None:
        super().__init__(endpoint, port, timeout_s)
        self.model = model
        self.api_key = api_key or ""
        self.system_prompt = system_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens

    async def _messages(self, payload: Dict[str, Any]) -> Dict[str, Any]:
        headers = {"x-api-key": self.api_key, "anthropic-version": "2023-06-01"}
        return await self._post(f"{self.base_url}/v1/messages", payload, headers)

    def _payload(self, system: Optional[str], messages: List[Dict[str, Any]], kwargs: Dict[str, Any]) -> Dict:
        payload: Dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": kwargs.pop("max_tokens", self.max_tokens),
            "temperature": kwargs.pop("temperature", self.temperature),
        }
        if system:
            payload["system"] = system
        payload.update(kwargs)
        return payload

    async def complete(self, prompt: str, **kwargs: Any) -> str:
        data = await self._messages(self._payload(self.system_prompt, [{"role": "user", "content": prompt}], kwargs))
        return _text(data.get("content"))

    async def complete_with_tools(
        self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]], **kwargs: Any
    ) -> LLMResponse:
        system, converted = to_anthropic_messages(messages)
        payload = self._payload(system or self.system_prompt, converted, kwargs)
        if tools:
            payload["tools"] = [
                {
                    "name": t["name"],
                    "description": t.get("description") or "",
                    "input_schema": clean_schema(t.get("inputSchema") or t.get("input_schema")),
                }
                for t in tools
            ]
        data = await self._messages(payload)
        blocks = [b for b in data.get("content") or [] if isinstance(b, dict)]
        calls = [
            ToolCall(id=b.get("id") or "", name=b.get("name") or "", args=b.get("input") or {})
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        return LLMResponse(content=_text(blocks) or None, tool_calls=calls)


def to_anthropic_messages(messages: List[Dict[str, Any]]) -> Tuple[Optional[str], List[Dict[str, Any]]]:
    """``(system, messages)`` in Anthropic's format from an OpenAI-format conversation."""
    system_parts: List[str] = []
    out: List[Dict[str, Any]] = []

    def add(role: str, block: Dict[str, Any]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].append(block)
        else:
            out.append({"role": role, "content": [block]})

    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role == "system":
            system_parts.append(_text(content))
        elif role == "tool":
            result = content if isinstance(content, (str, list)) else json.dumps(content)
            add("user", {"type": "tool_result", "tool_use_id": message.get("tool_call_id", ""), "content": result})
        elif role == "assistant":
            if _text(content):
                add("assistant", {"type": "text", "text": _text(content)})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                raw = function.get("arguments") or "{}"
                try:
                    args = json.loads(raw) if isinstance(raw, str) else dict(raw)
                except ValueError:
                    raise ValueError(
                        f"tool call {function.get('name')!r} has arguments that are not JSON: {raw!r}"
                    ) from None
                add(
                    "assistant",
                    {"type": "tool_use", "id": call.get("id", ""), "name": function.get("name"), "input": args},
                )
        elif isinstance(content, list):  # already content blocks
            for block in content:
                add("user", block)
        else:
            add("user", {"type": "text", "text": content or ""})
    return ("\n\n".join(system_parts) or None), out


_COMPLETION_TOKEN_MODELS = ("gpt-5", "o1", "o3", "o4-mini")


def create_llm_client(
    provider: str,
    model: str,
    api_key: Optional[str] = None,
    *,
    system_prompt: Optional[str] = None,
    temperature: float = 0.0,
    max_tokens: int = 4096,
) -> LLMClient:
    """A client for a hosted provider: ``"openai"`` or ``"anthropic"``."""
    if provider == "openai":
        return OpenAIClient(
            "https://api.openai.com",
            443,
            model=model,
            api_key=api_key,
            system_prompt=system_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
            use_max_completion_tokens=model.startswith(_COMPLETION_TOKEN_MODELS),
        )
    if provider == "anthropic":
        return AnthropicClient(
            "https://api.anthropic.com",
            443,
            model=model,
            api_key=api_key,
            system_prompt=system_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
        )
    raise ValueError(
        f"unknown LLM provider {provider!r} (use 'openai' or 'anthropic', or OpenAIClient for any endpoint)"
    )
