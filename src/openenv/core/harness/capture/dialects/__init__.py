"""The four wire dialects of the capture proxy, each to and from OpenAI chat completions.

An agent speaks OpenAI chat completions, OpenAI Responses, Anthropic Messages or Google
``generateContent``; the engine only speaks chat completions. ``detect`` names the dialect of a
call and ``dialect_for`` gives the object that translates it::

    dialect = dialect_for(detect(path, headers, body))
    chat_request = dialect.to_chat(body, path=path, served_model="Qwen/Qwen3-0.6B")
    reply = dialect.from_chat(engine_answer, request=body, path=path)
    frames = dialect.sse(reply) if dialect.stream_requested(path_and_query, body) else None

Everything here is pure: no I/O, no state between calls.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from ._base import APIType, Dialect, DialectError
from .anthropic import Anthropic
from .google import Google
from .openai_chat import OpenAIChat
from .openai_responses import OpenAIResponses

__all__ = [
    "APIType",
    "Dialect",
    "DialectError",
    "count_tokens_reply",
    "detect",
    "dialect_for",
    "is_count_tokens_path",
]

_DIALECTS: Dict[APIType, Dialect] = {
    APIType.ANTHROPIC: Anthropic(),
    APIType.OPENAI_CHAT: OpenAIChat(),
    APIType.OPENAI_RESPONSES: OpenAIResponses(),
    APIType.GOOGLE: Google(),
}


def detect(path: str, headers: Mapping[str, str], body: Dict[str, Any]) -> APIType:
    """The dialect of a call: by route first, then the ``anthropic-version`` header, then the body.

    Routes: ``/v1/messages`` (Anthropic), ``/chat/completions``, ``/responses``, and Google's
    ``:generateContent`` / ``:streamGenerateContent`` / ``:countTokens``. A body with
    ``contents`` is Google's; one with ``input`` (and ``instructions`` or no ``messages``) is a
    Responses call; anything else is chat completions.
    """
    lowered = path.lower()
    if "/v1/messages" in lowered:
        return APIType.ANTHROPIC
    if "/chat/completions" in lowered:
        return APIType.OPENAI_CHAT
    if "/responses" in lowered:
        return APIType.OPENAI_RESPONSES
    if "generatecontent" in lowered or ":counttokens" in lowered:
        return APIType.GOOGLE
    if any(name.lower() == "anthropic-version" for name in headers.keys()):
        return APIType.ANTHROPIC
    if "contents" in body:
        return APIType.GOOGLE
    if "input" in body and ("instructions" in body or "messages" not in body):
        return APIType.OPENAI_RESPONSES
    return APIType.OPENAI_CHAT


def dialect_for(api_type: APIType) -> Dialect:
    """The translator of one dialect (a shared, stateless object)."""
    return _DIALECTS[APIType(api_type)]


def is_count_tokens_path(path: str) -> bool:
    """Whether ``path`` is a token-count route (Anthropic ``/v1/messages/count_tokens``, Google ``:countTokens``)."""
    lowered = path.lower().rstrip("/")
    return lowered.endswith("/messages/count_tokens") or lowered.endswith(":counttokens")


def count_tokens_reply(
    api_type: APIType, body: Dict[str, Any], *, path: Optional[str] = None
) -> Optional[Dict[str, Any]]:
    """The answer to a token-count call, estimated at four characters a token (never below 1).

    The proxy never tokenises: agents only use this to decide when to compact their context, and
    an estimate serves that. ``None`` for a dialect without such a route, or when ``path`` is
    given and is not a token-count route.
    """
    if path is not None and not is_count_tokens_path(path):
        return None
    api_type = APIType(api_type)
    if api_type is APIType.ANTHROPIC:
        counted = {key: body.get(key) for key in ("system", "messages", "tools") if body.get(key) is not None}
        return {"input_tokens": _estimate(counted)}
    if api_type is APIType.GOOGLE:
        # countTokens takes either the contents or a whole generateContentRequest.
        inner = body.get("generateContentRequest") or body.get("generate_content_request") or body
        keys = ("contents", "systemInstruction", "system_instruction", "tools")
        n = _estimate({key: inner.get(key) for key in keys if isinstance(inner, dict) and inner.get(key) is not None})
        return {
            "totalTokens": n,
            "totalBillableCharacters": 4 * n,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}],
        }
    return None


def _estimate(value: Any) -> int:
    return max(1, _chars(value) // 4)


def _chars(value: Any) -> int:
    """Characters of text: string leaves, less base64 media (``data``), which is not text."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(item) for key, item in value.items() if key != "data")
    if isinstance(value, list):
        return sum(_chars(item) for item in value)
    return 0
