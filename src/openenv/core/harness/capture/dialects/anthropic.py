"""Anthropic Messages (``/v1/messages``), as Claude Code and the ``anthropic`` SDK speak it.

In: ``system`` becomes the leading system message (less Claude Code's billing-header line);
assistant ``tool_use`` blocks become ``tool_calls`` and ``thinking`` becomes ``reasoning_content``;
user ``tool_result`` blocks become ``tool`` messages, with their images moved to a user message
after them; ``thinking`` asks the chat template for reasoning; Anthropic's own (server) tools go.
Out: a ``message`` with thinking, text and ``tool_use`` blocks and Anthropic's stop reasons; a
stream is the named-event sequence ``message_start`` … ``message_stop``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

from ._base import (
    Answer,
    APIType,
    Dialect,
    DialectError,
    arguments_object,
    as_dict,
    as_list,
    data_url,
    finish_messages,
    function_tool,
    image_part,
    json_arguments,
    set_thinking,
    signature,
    split_data_url,
    sse_frame,
    tool_call,
    user_content,
)

DEFAULT_MAX_TOKENS = 4096
_BILLING_HEADER = "x-anthropic-billing-header:"
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_STATUS_TYPES = {  # statuses with an error type of their own
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_KNOWN_TYPES = frozenset({*_STATUS_TYPES.values(), "invalid_request_error", "api_error"})
# Blocks of Anthropic's hosted tools (the engine ran none of them) and encrypted thinking it cannot read.
_DROPPED_BLOCKS = frozenset(
    {"server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result"}
)
_DROPPED_BLOCKS |= {"bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "mcp_tool_use"}
_DROPPED_BLOCKS |= {"mcp_tool_result", "container_upload", "redacted_thinking", "tool_search_tool_result"}


class Anthropic(Dialect):
    api_type = APIType.ANTHROPIC

    def to_chat(self, body: Dict[str, Any], *, path: str, served_model: str) -> Dict[str, Any]:
        messages: List[Dict[str, Any]] = []
        system = _system_text(body.get("system"))
        if system:
            messages.append({"role": "system", "content": system})
        for index, message in enumerate(as_list(body.get("messages"), "messages")):
            message = as_dict(message, f"messages[{index}]")
            role = message.get("role")
            blocks = _blocks(message.get("content"), f"messages[{index}].content")
            if role == "assistant":
                messages.append(_assistant(blocks))
            elif role == "user":
                messages.extend(_user(blocks))
            else:
                raise DialectError(f"messages[{index}].role must be user or assistant, not {role!r}")
        if not messages:
            raise DialectError("messages must not be empty")
        chat: Dict[str, Any] = {"model": served_model or body.get("model"), "messages": finish_messages(messages)}
        max_tokens = body.get("max_tokens")
        chat["max_tokens"] = max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS
        for key in ("temperature", "top_p", "top_k"):
            if body.get(key) is not None:
                chat[key] = body[key]
        if body.get("stop_sequences"):
            chat["stop"] = body["stop_sequences"]
        tools = [_tool(tool) for tool in body.get("tools") or [] if _client_tool(tool)]
        if tools:
            chat["tools"] = tools
            _tool_choice(body.get("tool_choice"), chat)
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive", "disabled"):
            set_thinking(chat, thinking["type"] != "disabled")
        return chat

    def from_chat(self, chat: Dict[str, Any], *, request: Dict[str, Any], path: str) -> Dict[str, Any]:
        answer = Answer(chat)
        content: List[Dict[str, Any]] = []
        if answer.reasoning:
            content.append(
                {"type": "thinking", "thinking": answer.reasoning, "signature": signature("sg_oe_", answer.reasoning)}
            )
        if answer.text:
            content.append({"type": "text", "text": answer.text})
        for url in answer.images:
            content.append({"type": "image", "source": _image_source(url)})
        for call in answer.tool_calls:
            content.append(
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["name"],
                    "input": arguments_object(call["arguments"]),
                }
            )
        stop_reason = _STOP_REASONS.get(answer.finish_reason, "end_turn")
        if answer.tool_calls and stop_reason == "end_turn":
            stop_reason = "tool_use"  # a forced tool call ends with "stop" on vLLM
        stop_sequence = None
        if (
            stop_reason == "end_turn"
            and answer.stop_string
            and answer.stop_string in (request.get("stop_sequences") or [])
        ):
            stop_reason, stop_sequence = "stop_sequence", answer.stop_string
        msg_id = answer.id.removeprefix("chatcmpl-")
        return {
            "id": msg_id if msg_id.startswith("msg_") else f"msg_{msg_id}",
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": request.get("model") or chat.get("model") or "",
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {
                "input_tokens": max(answer.prompt_tokens - answer.cached_tokens, 0),
                "output_tokens": answer.completion_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": answer.cached_tokens,
            },
        }

    def sse(self, reply: Dict[str, Any]) -> Iterator[bytes]:
        usage = dict(reply.get("usage") or {})
        start = {
            **reply,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 0},
        }
        yield sse_frame({"type": "message_start", "message": start}, "message_start")
        for index, block in enumerate(reply.get("content") or []):
            yield from _block_events(index, block)
        delta_usage = {"output_tokens": usage.get("output_tokens", 0)}
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            if key in usage:
                delta_usage[key] = usage[key]
        delta = {"stop_reason": reply.get("stop_reason"), "stop_sequence": reply.get("stop_sequence")}
        yield sse_frame({"type": "message_delta", "delta": delta, "usage": delta_usage}, "message_delta")
        yield sse_frame({"type": "message_stop"}, "message_stop")

    def error_body(self, status: int, message: str, *, code: str) -> Dict[str, Any]:
        return {"type": "error", "error": {"type": _error_type(status, code), "message": message}}

    def sse_error(self, message: str, *, code: str, status: int = 500) -> bytes:
        return sse_frame(self.error_body(status, message, code=code), "error")


def _error_type(status: int, code: str) -> str:
    if status in _STATUS_TYPES:
        return _STATUS_TYPES[status]
    if code in _KNOWN_TYPES:
        return code
    return "api_error" if status >= 500 else "invalid_request_error"


def _block_events(index: int, block: Dict[str, Any]) -> Iterator[bytes]:
    kind = block.get("type")
    if kind == "thinking":
        start: Dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block.get("thinking", "")}]
        deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
    elif kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block.get("text", "")}]
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": json_arguments(block.get("input") or {})}]
    else:  # an image: no delta type carries one, so the block starts complete
        start, deltas = block, []
    yield sse_frame({"type": "content_block_start", "index": index, "content_block": start}, "content_block_start")
    for delta in deltas:
        yield sse_frame({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
    yield sse_frame({"type": "content_block_stop", "index": index}, "content_block_stop")


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        texts = [system]
    else:
        texts = [block.get("text", "") for block in as_list(system, "system") if isinstance(block, dict)]
    kept = []
    for text in texts:
        # Claude Code sends a per-request billing line first: it would change every prompt's tokens.
        if text.startswith(_BILLING_HEADER):
            text = text.split("\n", 1)[1] if "\n" in text else ""
        if text:
            kept.append(text)
    return "\n\n".join(kept)


def _blocks(content: Any, what: str) -> List[Dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [as_dict(block, f"{what} block") for block in as_list(content, what)]


def _assistant(blocks: List[Dict[str, Any]]) -> Dict[str, Any]:
    texts: List[str] = []
    thinking: List[str] = []
    calls: List[Dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            calls.append(
                tool_call(str(block.get("id", "")), str(block.get("name", "")), json_arguments(block.get("input")))
            )
        elif kind not in _DROPPED_BLOCKS:
            raise DialectError(f"assistant content blocks of type {kind!r} are not supported")
    # Joined without separators: the text the engine produced is one string, however a client splits it.
    message: Dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Tool results first (they must follow the assistant's calls), then what the user added."""
    results: List[Dict[str, Any]] = []
    moved: List[Dict[str, Any]] = []
    parts: List[Dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "tool_result":
            text, images = _tool_result_content(block.get("content"))
            if block.get("is_error") is True:
                text = "[Tool Error] " + text
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text})
            moved.extend(images)
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image(block))
        elif kind == "document" and isinstance(block.get("source"), dict) and block["source"].get("type") == "text":
            parts.append({"type": "text", "text": str(block["source"].get("data", ""))})
        elif kind not in _DROPPED_BLOCKS:
            raise DialectError(f"user content blocks of type {kind!r} are not supported")
    out = list(results)
    if moved or parts:
        out.append({"role": "user", "content": user_content(moved + parts)})
    return out


def _tool_result_content(content: Any) -> tuple[str, List[Dict[str, Any]]]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts: List[str] = []
    images: List[Dict[str, Any]] = []
    for block in as_list(content, "tool_result content"):
        block = as_dict(block, "tool_result content block")
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "image":
            images.append(_image(block))
        else:
            raise DialectError(f"tool_result blocks of type {block.get('type')!r} are not supported")
    return "\n".join(texts), images


def _image(block: Dict[str, Any]) -> Dict[str, Any]:
    source = as_dict(block.get("source"), "image source")
    if source.get("type") == "base64":
        return image_part(data_url(str(source.get("media_type", "image/png")), str(source.get("data", ""))))
    if source.get("type") == "url":
        return image_part(str(source.get("url", "")))
    raise DialectError(f"image sources of type {source.get('type')!r} are not supported (send base64 or a URL)")


def _image_source(url: str) -> Dict[str, Any]:
    inline = split_data_url(url)
    if inline is not None:
        return {"type": "base64", "media_type": inline[0], "data": inline[1]}
    return {"type": "url", "url": url}


def _client_tool(tool: Any) -> bool:
    """A tool the agent runs and described by a schema (Anthropic's typed tools run on its servers)."""
    return isinstance(tool, dict) and tool.get("type") in (None, "custom") and "input_schema" in tool


def _tool(tool: Dict[str, Any]) -> Dict[str, Any]:
    return function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"))


def _tool_choice(choice: Any, chat: Dict[str, Any]) -> None:
    if not isinstance(choice, dict):
        return
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False
