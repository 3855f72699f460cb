"""What every dialect shares: the API types, the error, the Dialect interface and small helpers.

A dialect is a set of pure functions between one wire API and OpenAI chat completions, the
only language the engine speaks. Nothing here does I/O or keeps state between calls.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from enum import Enum
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Tuple


class APIType(str, Enum):
    """The wire dialect an agent speaks to the proxy."""

    ANTHROPIC = "anthropic"
    OPENAI_CHAT = "openai_chat"
    OPENAI_RESPONSES = "openai_responses"
    GOOGLE = "google"


class DialectError(ValueError):
    """A request the dialect cannot translate into a chat request; the agent gets a 400 in its dialect."""


class Dialect:
    """One wire API: its request in, the engine's chat completion out, its stream and error shapes.

    Subclasses implement ``to_chat``, ``from_chat``, ``sse``, ``error_body`` and ``sse_error``;
    every method is pure, so one instance per API type serves all calls.
    """

    api_type: ClassVar[APIType]

    def to_chat(self, body: Dict[str, Any], *, path: str, served_model: str) -> Dict[str, Any]:
        """The OpenAI chat-completions request for the engine; raises DialectError."""
        raise NotImplementedError

    def from_chat(self, chat: Dict[str, Any], *, request: Dict[str, Any], path: str) -> Dict[str, Any]:
        """The engine's (normalised) chat completion as this dialect's JSON reply to ``request``."""
        raise NotImplementedError

    def sse(self, reply: Dict[str, Any]) -> Iterator[bytes]:
        """``reply`` (from ``from_chat``) replayed as this dialect's stream, one complete event per item."""
        raise NotImplementedError

    def error_body(self, status: int, message: str, *, code: str) -> Dict[str, Any]:
        """An error answer with HTTP ``status`` in this dialect's own shape."""
        raise NotImplementedError

    def sse_error(self, message: str, *, code: str, status: int = 500) -> bytes:
        """An error event for a stream whose headers are already sent."""
        raise NotImplementedError

    def sse_keepalive(self) -> bytes:
        """Bytes that keep a stream alive while the engine works, ignored by this dialect's clients."""
        return b": openenv keepalive\n\n"

    def stream_requested(self, path_and_query: str, body: Dict[str, Any]) -> bool:
        """Whether the agent asked for SSE: ``stream: true``, Google's stream route or ``alt=sse``."""
        lowered = path_and_query.lower()
        return body.get("stream") is True or "streamgeneratecontent" in lowered or "alt=sse" in lowered


# --- wire helpers -----------------------------------------------------------------------------


def dumps(value: Any) -> str:
    """Compact JSON, UTF-8 text kept as is (what every dialect puts on the wire)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sse_frame(data: Any, event: Optional[str] = None) -> bytes:
    """One complete SSE event: an optional ``event:`` line, one ``data:`` line, a blank line."""
    text = data if isinstance(data, str) else dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def stable_id(prefix: str, *parts: Any) -> str:
    """An id that is the same every time the same conversation is sent (ids may reach the prompt)."""
    digest = hashlib.sha256(dumps(parts).encode()).hexdigest()
    return f"{prefix}{digest[:24]}"


def b64url(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def unb64url(data: str) -> Optional[str]:
    try:
        return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def as_dict(value: Any, what: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise DialectError(f"{what} must be a JSON object")
    return value


def as_list(value: Any, what: str) -> List[Any]:
    if not isinstance(value, list):
        raise DialectError(f"{what} must be a JSON array")
    return value


def get(d: Dict[str, Any], camel: str, snake: str) -> Any:
    """Google's JSON takes both spellings of a field (``inlineData`` / ``inline_data``)."""
    value = d.get(camel)
    return d.get(snake) if value is None else value


# --- images -----------------------------------------------------------------------------------

_DETAILS = ("auto", "low", "high")


def image_part(url: str, detail: Any = None) -> Dict[str, Any]:
    """An OpenAI ``image_url`` content part; ``detail`` kept only where chat completions knows it."""
    image: Dict[str, Any] = {"url": url}
    if detail in _DETAILS:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def data_url(mime: str, data: str) -> str:
    return f"data:{mime};base64,{data}"


def split_data_url(url: str) -> Optional[Tuple[str, str]]:
    """``(mime, base64 data)`` of a base64 ``data:`` URL, else None (a plain URL)."""
    if not url.startswith("data:") or ";base64," not in url:
        return None
    head, data = url[5:].split(";base64,", 1)
    return head or "application/octet-stream", data


# --- chat request assembly --------------------------------------------------------------------


def content_text(content: Any) -> str:
    """The text of a chat message content (a string or a list of ``text`` parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    raise DialectError("message content must be a string or a list of parts")


def user_content(parts: List[Dict[str, Any]]) -> Any:
    """A lone text part becomes a plain string (what most chat templates expect)."""
    if len(parts) == 1 and parts[0].get("type") == "text":
        return parts[0]["text"]
    return parts


def finish_messages(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``developer`` becomes ``system``, and all system messages merge into one leading message.

    Chat templates accept one system message, first; the texts are joined by a blank line.
    """
    system: List[str] = []
    rest: List[Dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            raise DialectError("each message must be a JSON object")
        if message.get("role") in ("system", "developer"):
            text = content_text(message.get("content"))
            if text:
                system.append(text)
        else:
            rest.append(message)
    if system:
        return [{"role": "system", "content": "\n\n".join(system)}, *rest]
    return rest


def set_thinking(chat: Dict[str, Any], enabled: bool) -> None:
    """Ask the chat template for (or against) a reasoning block, keeping the agent's other kwargs."""
    kwargs = chat.get("chat_template_kwargs")
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    kwargs.setdefault("enable_thinking", enabled)
    chat["chat_template_kwargs"] = kwargs


def function_tool(name: Any, description: Any, parameters: Any, strict: Any = None) -> Dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise DialectError("each tool needs a name")
    function: Dict[str, Any] = {"name": name}
    if isinstance(description, str) and description:
        function["description"] = description
    function["parameters"] = parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    if isinstance(strict, bool):
        function["strict"] = strict
    return {"type": "function", "function": function}


def tool_call(call_id: str, name: str, arguments: str) -> Dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def json_arguments(value: Any) -> str:
    """Tool-call arguments as chat completions carries them: a JSON text."""
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


# --- reading the engine's answer --------------------------------------------------------------


class Answer:
    """The parts of a chat completion every dialect replays: one choice, its calls and usage."""

    def __init__(self, chat: Dict[str, Any]) -> None:
        choices = chat.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        self.id: str = str(chat.get("id") or new_id("chatcmpl-"))
        created = chat.get("created")
        self.created: int = created if isinstance(created, int) else int(time.time())
        self.finish_reason: str = str(choice.get("finish_reason") or "stop")
        # vLLM names the stop string that ended the turn in the choice's ``stop_reason``.
        stop = choice.get("stop_reason")
        self.stop_string: Optional[str] = stop if isinstance(stop, str) else None
        reasoning = message.get("reasoning_content")
        if reasoning is None:
            reasoning = message.get("reasoning")
        self.reasoning: str = reasoning if isinstance(reasoning, str) else ""
        content = message.get("content")
        self.images: List[str] = []
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "image_url" and isinstance(part.get("image_url"), dict):
                    self.images.append(str(part["image_url"].get("url", "")))
                elif isinstance(part.get("text"), str):
                    texts.append(part["text"])
            content = "".join(texts)
        self.text: str = content if isinstance(content, str) else ""
        self.tool_calls: List[Dict[str, str]] = []
        for call in message.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            arguments = function.get("arguments")
            self.tool_calls.append(
                {
                    "id": str(call.get("id") or new_id("call_")),
                    "name": str(function.get("name") or ""),
                    "arguments": arguments if isinstance(arguments, str) else json_arguments(arguments),
                }
            )
        usage = chat.get("usage") if isinstance(chat.get("usage"), dict) else {}
        self.prompt_tokens: int = _count(usage.get("prompt_tokens"))
        self.completion_tokens: int = _count(usage.get("completion_tokens"))
        self.cached_tokens: int = _count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
        self.reasoning_tokens: int = _count((usage.get("completion_tokens_details") or {}).get("reasoning_tokens"))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def arguments_object(arguments: str) -> Dict[str, Any]:
    """Arguments as an object for APIs that carry them parsed (Anthropic ``input``, Google ``args``).

    Text the model produced that is not a JSON object is kept under ``"arguments"`` rather than lost.
    """
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def signature(prefix: str, text: str) -> str:
    """A synthetic, deterministic reasoning signature (we have no provider key to sign with)."""
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:32]
