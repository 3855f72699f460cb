"""OpenAI Responses (``/v1/responses``), as Codex CLI and ``client.responses`` speak it.

In: ``instructions`` becomes the system message; input items become chat messages, an assistant
turn's ``reasoning``, ``message`` and call items folding back into the one assistant message the
engine produced; ``function_call_output`` becomes a ``tool`` message. Custom (free-form) tools and
Codex's ``local_shell`` become function tools the engine can call. The proxy keeps no responses,
so ``previous_response_id`` is refused: the agent sends its whole input (Codex does, store=false).
Out: a ``response`` whose output holds reasoning, message and call items; a stream is the event
sequence ``response.created`` … ``response.completed`` with every item's delta events.
"""

from __future__ import annotations

import json
import time
from itertools import count
from typing import Any, Dict, Iterator, List, Optional

from ._base import (
    Answer,
    APIType,
    Dialect,
    DialectError,
    as_dict,
    as_list,
    b64url,
    content_text,
    finish_messages,
    function_tool,
    image_part,
    json_arguments,
    new_id,
    sse_frame,
    tool_call,
    unb64url,
    user_content,
)
from .openai_chat import openai_error_type

SHELL_TOOL = "shell"
"""The function name under which the engine sees Codex's ``local_shell`` tool."""

_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The command and its arguments."},
        "workdir": {"type": "string", "description": "The working directory to run the command in."},
        "timeout_ms": {"type": "integer", "description": "The timeout for the command in milliseconds."},
    },
    "required": ["command"],
}
_REASONING_PREFIX = "oe:"  # our "encrypted" reasoning: the text itself, base64url, so it round-trips
_CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
# Items of hosted tools (run by OpenAI, not by this engine) and their results: left out.
_HOSTED_ITEMS = frozenset(
    {"web_search_call", "file_search_call", "computer_call", "computer_call_output", "image_generation_call"}
)
_HOSTED_ITEMS |= {"code_interpreter_call", "mcp_call", "mcp_list_tools", "mcp_approval_request"}
_HOSTED_ITEMS |= {"mcp_approval_response", "tool_search_call", "tool_search_output", "compaction"}
_UNSUPPORTED_FIELDS = {
    "previous_response_id": "the proxy keeps no responses: send the whole conversation as input",
    "conversation": "the proxy keeps no conversations: send the whole conversation as input",
    "prompt": "stored prompt templates are not supported: send instructions and input",
}


class OpenAIResponses(Dialect):
    api_type = APIType.OPENAI_RESPONSES

    def to_chat(self, body: Dict[str, Any], *, path: str, served_model: str) -> Dict[str, Any]:
        for key, why in _UNSUPPORTED_FIELDS.items():
            if body.get(key) is not None:
                raise DialectError(f"{key} is not supported: {why}")
        builder = _Conversation()
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            builder.messages.append({"role": "system", "content": instructions})
        elif isinstance(instructions, list):
            for item in instructions:
                builder.add(as_dict(item, "instructions item"))
        items = body.get("input")
        if isinstance(items, str):
            builder.messages.append({"role": "user", "content": items})
        else:
            for index, item in enumerate(as_list(items, "input")):
                builder.add(as_dict(item, f"input[{index}]"))
        messages = builder.finish()
        if not messages:
            raise DialectError("input must not be empty")
        chat: Dict[str, Any] = {"model": served_model or body.get("model"), "messages": finish_messages(messages)}
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        for key in ("temperature", "top_p", "parallel_tool_calls"):
            if body.get(key) is not None:
                chat[key] = body[key]
        tools = [_tool(tool) for tool in body.get("tools") or [] if isinstance(tool, dict) and _engine_tool(tool)]
        if tools:
            chat["tools"] = tools
            choice = _tool_choice(body.get("tool_choice"))
            if choice is not None:
                chat["tool_choice"] = choice
        reasoning = body.get("reasoning")
        if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
            chat["reasoning_effort"] = reasoning["effort"]
        response_format = _response_format(body.get("text"))
        if response_format is not None:
            chat["response_format"] = response_format
        return chat

    def from_chat(self, chat: Dict[str, Any], *, request: Dict[str, Any], path: str) -> Dict[str, Any]:
        answer = Answer(chat)
        tools = [tool for tool in request.get("tools") or [] if isinstance(tool, dict)]
        custom = {tool.get("name") for tool in tools if tool.get("type") == "custom"}
        functions = {tool.get("name") for tool in tools if tool.get("type") == "function"}
        shell = any(tool.get("type") == "local_shell" for tool in tools) and SHELL_TOOL not in functions
        incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(answer.finish_reason)
        output: List[Dict[str, Any]] = []
        if answer.reasoning:
            output.append(_reasoning_item(answer.reasoning, request.get("reasoning")))
        if answer.text or not (answer.reasoning or answer.tool_calls):
            output.append(
                {
                    "id": new_id("msg_"),
                    "type": "message",
                    "role": "assistant",
                    "status": "incomplete" if incomplete else "completed",
                    "content": [{"type": "output_text", "text": answer.text, "annotations": [], "logprobs": []}],
                }
            )
        for call in answer.tool_calls:
            output.append(_call_item(call, custom=call["name"] in custom, shell=shell and call["name"] == SHELL_TOOL))
        reasoning = request.get("reasoning") if isinstance(request.get("reasoning"), dict) else {}
        resp_id = answer.id.removeprefix("chatcmpl-")
        return {
            "id": resp_id if resp_id.startswith("resp_") else f"resp_{resp_id}",
            "object": "response",
            "created_at": answer.created,
            "status": "incomplete" if incomplete else "completed",
            "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"),
            "metadata": request.get("metadata") or {},
            "model": request.get("model") or chat.get("model") or "",
            "output": output,
            "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
            "previous_response_id": None,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": False,
            "temperature": request.get("temperature"),
            "text": request.get("text") or {"format": {"type": "text"}},
            "tool_choice": request.get("tool_choice") or "auto",
            "tools": tools,
            "top_p": request.get("top_p"),
            "truncation": "disabled",
            "usage": {
                "input_tokens": answer.prompt_tokens,
                "input_tokens_details": {"cached_tokens": answer.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": answer.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
                "total_tokens": answer.prompt_tokens + answer.completion_tokens,
            },
        }

    def sse(self, reply: Dict[str, Any]) -> Iterator[bytes]:
        sequence = count()

        def event(kind: str, **fields: Any) -> bytes:
            return sse_frame({"type": kind, **fields, "sequence_number": next(sequence)}, kind)

        snapshot = {**reply, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        yield event("response.created", response=snapshot)
        yield event("response.in_progress", response=snapshot)
        for index, item in enumerate(reply.get("output") or []):
            for kind, fields in _item_events(index, item):
                yield event(kind, **fields)
        final = "response.incomplete" if reply.get("status") == "incomplete" else "response.completed"
        yield event(final, response=reply)

    def error_body(self, status: int, message: str, *, code: str) -> Dict[str, Any]:
        return {"error": {"message": message, "type": openai_error_type(status, code), "param": None, "code": code}}

    def sse_error(self, message: str, *, code: str, status: int = 500) -> bytes:
        """``response.created``, ``error`` and ``response.failed``: the error event upstream sends, framed
        by the lifecycle events that Codex (``response.failed``) and the openai SDK's stream helper
        (``response.created`` first) need; the proxy sends it before any other event."""
        # response.failed takes only the Responses API's own error codes.
        if status == 429 or code == "rate_limit_error":
            kind = "rate_limit_exceeded"
        elif code == "invalid_request_error" or 400 <= status < 500:
            kind = "invalid_prompt"
        else:
            kind = "server_error"
        response = {
            "id": new_id("resp_"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "model": "",
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
        failed = {**response, "status": "failed", "error": {"code": kind, "message": message}}
        events = [
            ("response.created", {"response": response}),
            ("error", {"code": kind, "message": message, "param": None}),
            ("response.failed", {"response": failed}),
        ]
        return b"".join(
            sse_frame({"type": name, **fields, "sequence_number": number}, name)
            for number, (name, fields) in enumerate(events)
        )


class _Conversation:
    """Folds input items into chat messages, one assistant message per assistant turn."""

    def __init__(self) -> None:
        self.messages: List[Dict[str, Any]] = []
        self._assistant: Optional[Dict[str, Any]] = None
        self._moved: List[Dict[str, Any]] = []  # images from tool outputs, for a user message after them

    def add(self, item: Dict[str, Any]) -> None:
        kind = item.get("type", "message")
        if kind == "reasoning":
            text = _reasoning_text(item)
            message = self._open(new_turn=bool(self._assistant and self._started(self._assistant)))
            message["reasoning_content"] = message.get("reasoning_content", "") + text
        elif kind == "message" and item.get("role") == "assistant":
            message = self._open(new_turn=bool(self._assistant and self._spoke(self._assistant)))
            message["content"] = str(message.get("content") or "") + _assistant_text(item.get("content"))
        elif kind in _CALL_ITEMS:
            message = self._open(new_turn=False)
            message.setdefault("tool_calls", []).append(_chat_call(item))
        elif kind in _OUTPUT_ITEMS:
            self._close()
            text, images = _output_content(item.get("output"))
            call_id = item.get("call_id") or item.get("id")
            if not isinstance(call_id, str) or not call_id:
                raise DialectError(f"a {kind} item needs its call_id")
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            self._moved.extend(images)
        elif kind == "message":
            self._close()
            self._flush_moved()
            role = item.get("role")
            if role in ("system", "developer"):
                self.messages.append({"role": "system", "content": content_text(_text_parts(item.get("content")))})
            elif role == "user":
                self.messages.append({"role": "user", "content": _user_content(item.get("content"))})
            else:
                raise DialectError(f"message items need role user, assistant, system or developer, not {role!r}")
        elif kind in _HOSTED_ITEMS:
            return
        elif kind == "item_reference":
            raise DialectError("item_reference is not supported: the proxy keeps no items, send them in full")
        else:
            raise DialectError(f"input items of type {kind!r} are not supported")

    def finish(self) -> List[Dict[str, Any]]:
        self._close()
        self._flush_moved()
        return self.messages

    def _open(self, *, new_turn: bool) -> Dict[str, Any]:
        if self._assistant is None or new_turn:
            self._flush_moved()
            self._assistant = {"role": "assistant", "content": ""}
            self.messages.append(self._assistant)
        return self._assistant

    def _close(self) -> None:
        self._assistant = None

    def _flush_moved(self) -> None:
        if self._moved:
            self.messages.append({"role": "user", "content": self._moved})
            self._moved = []

    @staticmethod
    def _spoke(message: Dict[str, Any]) -> bool:
        return bool(message.get("content") or message.get("tool_calls"))

    @classmethod
    def _started(cls, message: Dict[str, Any]) -> bool:
        return cls._spoke(message) or bool(message.get("reasoning_content"))


def _reasoning_text(item: Dict[str, Any]) -> str:
    """Our own encrypted_content first (exact), then the reasoning text, then the summary."""
    encrypted = item.get("encrypted_content")
    if isinstance(encrypted, str) and encrypted.startswith(_REASONING_PREFIX):
        text = unb64url(encrypted[len(_REASONING_PREFIX) :])
        if text is not None:
            return text
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            return "\n".join(str(part.get("text", "")) for part in parts if isinstance(part, dict))
    return ""


def _text_parts(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content
    parts = []
    for part in as_list(content, "message content"):
        part = as_dict(part, "content part")
        if part.get("type") in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif part.get("type") == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal", ""))})
        else:
            raise DialectError(f"content parts of type {part.get('type')!r} are not supported here")
    return parts


def _assistant_text(content: Any) -> str:
    parts = _text_parts(content)
    if parts is None or isinstance(parts, str):
        return parts or ""
    return "".join(part["text"] for part in parts)


def _user_content(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    parts: List[Dict[str, Any]] = []
    for part in as_list(content, "message content"):
        part = as_dict(part, "content part")
        if part.get("type") == "input_image":
            parts.append(_image(part))
        else:
            parts.extend(_text_parts([part]))
    return user_content(parts)


def _image(part: Dict[str, Any]) -> Dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise DialectError("input_image needs an image_url (a URL or a data: URL); file ids are not supported")
    return image_part(url, part.get("detail"))


def _output_content(output: Any) -> tuple[str, List[Dict[str, Any]]]:
    if output is None:
        return "", []
    if isinstance(output, str):
        return output, []
    texts: List[str] = []
    images: List[Dict[str, Any]] = []
    for part in as_list(output, "output"):
        part = as_dict(part, "output part")
        if part.get("type") in ("input_text", "output_text", "text"):
            texts.append(str(part.get("text", "")))
        elif part.get("type") == "input_image":
            images.append(_image(part))
        else:
            raise DialectError(f"tool output parts of type {part.get('type')!r} are not supported")
    return "\n".join(texts), images


def _chat_call(item: Dict[str, Any]) -> Dict[str, Any]:
    kind = item["type"]
    call_id = item.get("call_id") or item.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise DialectError(f"a {kind} item needs its call_id")
    if kind == "local_shell_call":
        action = item.get("action") if isinstance(item.get("action"), dict) else {}
        arguments: Dict[str, Any] = {"command": action.get("command") or []}
        if action.get("working_directory") is not None:
            arguments["workdir"] = action["working_directory"]
        if action.get("timeout_ms") is not None:
            arguments["timeout_ms"] = action["timeout_ms"]
        return tool_call(call_id, SHELL_TOOL, json_arguments(arguments))
    name = str(item.get("name", ""))
    if kind == "custom_tool_call":
        return tool_call(call_id, name, json_arguments({"input": str(item.get("input", ""))}))
    arguments_text = item.get("arguments")
    return tool_call(
        call_id, name, arguments_text if isinstance(arguments_text, str) else json_arguments(arguments_text)
    )


def _engine_tool(tool: Dict[str, Any]) -> bool:
    return tool.get("type") in ("function", "custom", "local_shell")


def _tool(tool: Dict[str, Any]) -> Dict[str, Any]:
    kind = tool.get("type")
    if kind == "local_shell":
        return function_tool(SHELL_TOOL, "Runs a shell command and returns its output.", _SHELL_PARAMETERS)
    if kind == "custom":
        # A free-form tool takes raw text: the engine fills one string argument with it.
        parameters = {
            "type": "object",
            "properties": {"input": {"type": "string", "description": "The raw input of the tool."}},
            "required": ["input"],
        }
        return function_tool(tool.get("name"), tool.get("description"), parameters)
    return function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), tool.get("strict"))


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom") and isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": choice["name"]}}
        if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
            return choice["mode"]
    return None  # a hosted tool the engine does not have: let the model choose


def _response_format(text: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(text, dict) or not isinstance(text.get("format"), dict):
        return None
    fmt = text["format"]
    if fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name") or "response", "schema": fmt.get("schema") or {}}
        if isinstance(fmt.get("strict"), bool):
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


def _reasoning_item(text: str, reasoning: Any) -> Dict[str, Any]:
    summary_asked = isinstance(reasoning, dict) and reasoning.get("summary") in ("auto", "concise", "detailed")
    return {
        "id": new_id("rs_"),
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}] if summary_asked else [],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": _REASONING_PREFIX + b64url(text),
        "status": "completed",
    }


def _call_item(call: Dict[str, str], *, custom: bool, shell: bool) -> Dict[str, Any]:
    if custom or shell:
        try:
            arguments = json.loads(call["arguments"])
        except ValueError:
            arguments = None
        if custom and isinstance(arguments, dict) and isinstance(arguments.get("input"), str):
            return {
                "id": new_id("ctc_"),
                "type": "custom_tool_call",
                "call_id": call["id"],
                "name": call["name"],
                "input": arguments["input"],
                "status": "completed",
            }
        command = arguments.get("command") if isinstance(arguments, dict) else None
        if shell and isinstance(command, list) and all(isinstance(part, str) for part in command):
            return {
                "id": new_id("lsh_"),
                "type": "local_shell_call",
                "call_id": call["id"],
                "status": "completed",
                "action": {
                    "type": "exec",
                    "command": command,
                    "env": {},
                    "timeout_ms": arguments.get("timeout_ms"),
                    "working_directory": arguments.get("workdir"),
                    "user": None,
                },
            }
    return {
        "id": new_id("fc_"),
        "type": "function_call",
        "call_id": call["id"],
        "name": call["name"],
        "arguments": call["arguments"],
        "status": "completed",
    }


def _item_events(index: int, item: Dict[str, Any]) -> Iterator[tuple[str, Dict[str, Any]]]:
    """The events that stream one output item: added, its deltas and dones, then done."""
    where = {"item_id": item["id"], "output_index": index}
    kind = item.get("type")
    if kind == "message":
        yield (
            "response.output_item.added",
            {"output_index": index, "item": {**item, "status": "in_progress", "content": []}},
        )
        for part_index, part in enumerate(item.get("content") or []):
            at = {**where, "content_index": part_index}
            text = part.get("text", "")
            yield "response.content_part.added", {**at, "part": {**part, "text": ""}}
            yield "response.output_text.delta", {**at, "delta": text, "logprobs": []}
            yield "response.output_text.done", {**at, "text": text, "logprobs": []}
            yield "response.content_part.done", {**at, "part": part}
    elif kind == "reasoning":
        started = {**item, "status": "in_progress", "summary": [], "content": [], "encrypted_content": None}
        yield "response.output_item.added", {"output_index": index, "item": started}
        for summary_index, part in enumerate(item.get("summary") or []):
            at = {**where, "summary_index": summary_index}
            yield "response.reasoning_summary_part.added", {**at, "part": {**part, "text": ""}}
            yield "response.reasoning_summary_text.delta", {**at, "delta": part["text"]}
            yield "response.reasoning_summary_text.done", {**at, "text": part["text"]}
            yield "response.reasoning_summary_part.done", {**at, "part": part}
        for content_index, part in enumerate(item.get("content") or []):
            at = {**where, "content_index": content_index}
            yield "response.content_part.added", {**at, "part": {**part, "text": ""}}
            yield "response.reasoning_text.delta", {**at, "delta": part["text"]}
            yield "response.reasoning_text.done", {**at, "text": part["text"]}
            yield "response.content_part.done", {**at, "part": part}
    elif kind == "function_call":
        yield (
            "response.output_item.added",
            {"output_index": index, "item": {**item, "arguments": "", "status": "in_progress"}},
        )
        yield "response.function_call_arguments.delta", {**where, "delta": item["arguments"]}
        yield "response.function_call_arguments.done", {**where, "arguments": item["arguments"]}
    elif kind == "custom_tool_call":
        yield (
            "response.output_item.added",
            {"output_index": index, "item": {**item, "input": "", "status": "in_progress"}},
        )
        yield "response.custom_tool_call_input.delta", {**where, "delta": item["input"]}
        yield "response.custom_tool_call_input.done", {**where, "input": item["input"]}
    else:
        yield "response.output_item.added", {"output_index": index, "item": {**item, "status": "in_progress"}}
    yield "response.output_item.done", {"output_index": index, "item": item}
