"""Google ``generateContent`` (``…/models/<m>:generateContent``), as Gemini CLI and ``google-genai`` speak it.

In: ``systemInstruction`` becomes the system message, ``model`` turns the assistant's, ``thought``
parts its ``reasoning_content``; a ``functionCall`` keeps its id or gets a stable ``call_<hex>``
one, and a ``functionResponse`` without an id is matched to the earliest unanswered call of the
same name in the model turn before it (upstream fell back to the function's name, which collides
when a turn calls one function twice). ``generationConfig`` maps onto the chat sampling fields.
Both JSON spellings (``inlineData`` / ``inline_data``) are read; replies use camelCase.
Out: one candidate with thought, text and ``functionCall`` parts; a stream sends the thought in a
frame of its own (Gemini CLI reads a frame whose first part is a thought as thought only).
"""

from __future__ import annotations

import base64
import mimetypes
import re
from typing import Any, Dict, Iterator, List, Optional

from ._base import (
    Answer,
    APIType,
    Dialect,
    DialectError,
    arguments_object,
    as_dict,
    as_list,
    data_url,
    dumps,
    finish_messages,
    function_tool,
    get,
    image_part,
    json_arguments,
    set_thinking,
    signature,
    split_data_url,
    sse_frame,
    stable_id,
    tool_call,
    user_content,
)

_MODEL_IN_PATH = re.compile(r"models/([^/:]+)")
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_GENERATION = {  # generationConfig field -> chat completions field
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "maxOutputTokens": "max_tokens",
    "candidateCount": "n",
    "stopSequences": "stop",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
    "seed": "seed",
}
_SNAKE = {"topP": "top_p", "topK": "top_k", "maxOutputTokens": "max_output_tokens", "candidateCount": "candidate_count"}
_SNAKE |= {"stopSequences": "stop_sequences", "presencePenalty": "presence_penalty"}
_SNAKE |= {"frequencyPenalty": "frequency_penalty"}
_MODES = {"AUTO": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto"}


def model_of(path: str) -> str:
    """The model named in a Google route (``/v1beta/models/<m>:generateContent``), or ""."""
    match = _MODEL_IN_PATH.search(path)
    return match.group(1) if match else ""


class Google(Dialect):
    api_type = APIType.GOOGLE

    def to_chat(self, body: Dict[str, Any], *, path: str, served_model: str) -> Dict[str, Any]:
        messages: List[Dict[str, Any]] = []
        system = get(body, "systemInstruction", "system_instruction")
        if system is not None:
            texts = [_text(part) for part in _parts(system, "systemInstruction")]
            if any(texts):
                messages.append({"role": "system", "content": "\n\n".join(t for t in texts if t)})
        pending: List[Dict[str, Any]] = []  # the calls of the last model turn still awaiting a response
        for index, content in enumerate(as_list(body.get("contents"), "contents")):
            content = as_dict(content, f"contents[{index}]")
            role = content.get("role") or "user"
            parts = _parts(content, f"contents[{index}]")
            if role == "model":
                message, pending = _model_turn(index, parts)
                messages.append(message)
            elif role in ("user", "function", "tool"):
                messages.extend(_user_turn(parts, pending))
            else:
                raise DialectError(f"contents[{index}].role must be user or model, not {role!r}")
        if not messages:
            raise DialectError("contents must not be empty")
        chat: Dict[str, Any] = {
            "model": served_model or body.get("model") or model_of(path),
            "messages": finish_messages(messages),
        }
        config = get(body, "generationConfig", "generation_config")
        if isinstance(config, dict):
            _generation(config, chat)
        tools = [
            _tool(declaration)
            for tool in body.get("tools") or []
            if isinstance(tool, dict)
            for declaration in get(tool, "functionDeclarations", "function_declarations") or []
        ]
        if tools:
            chat["tools"] = tools
            _tool_config(get(body, "toolConfig", "tool_config"), chat)
        return chat

    def from_chat(self, chat: Dict[str, Any], *, request: Dict[str, Any], path: str) -> Dict[str, Any]:
        answer = Answer(chat)
        parts: List[Dict[str, Any]] = []
        if answer.reasoning:
            sig = base64.b64encode(signature("sg_oe_", answer.reasoning).encode()).decode()
            parts.append({"text": answer.reasoning, "thought": True, "thoughtSignature": sig})
        if answer.text:
            parts.append({"text": answer.text})
        for url in answer.images:
            inline = split_data_url(url)
            if inline is not None:
                parts.append({"inlineData": {"mimeType": inline[0], "data": inline[1]}})
            else:
                mime = mimetypes.guess_type(url)[0] or "application/octet-stream"
                parts.append({"fileData": {"mimeType": mime, "fileUri": url}})
        for call in answer.tool_calls:
            args = arguments_object(call["arguments"])
            parts.append({"functionCall": {"id": call["id"], "name": call["name"], "args": args}})
        if not parts:
            parts.append({"text": ""})
        thoughts = min(answer.reasoning_tokens, answer.completion_tokens)
        usage: Dict[str, Any] = {
            "promptTokenCount": answer.prompt_tokens,
            "candidatesTokenCount": answer.completion_tokens - thoughts,
            "totalTokenCount": answer.prompt_tokens + answer.completion_tokens,
        }
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        if answer.cached_tokens:
            usage["cachedContentTokenCount"] = answer.cached_tokens
        return {
            "candidates": [
                {
                    "content": {"parts": parts, "role": "model"},
                    "finishReason": _FINISH.get(answer.finish_reason, "STOP"),
                    "index": 0,
                    "safetyRatings": [],
                }
            ],
            "usageMetadata": usage,
            "modelVersion": model_of(path) or request.get("model") or chat.get("model") or "",
            "responseId": answer.id.removeprefix("chatcmpl-"),
        }

    def sse(self, reply: Dict[str, Any]) -> Iterator[bytes]:
        candidate = (reply.get("candidates") or [{}])[0]
        parts = (candidate.get("content") or {}).get("parts") or []
        thoughts = [part for part in parts if part.get("thought") is True]
        rest = [part for part in parts if part.get("thought") is not True]
        meta = {key: reply[key] for key in ("modelVersion", "responseId") if key in reply}
        if thoughts:
            frame = {"candidates": [{"content": {"parts": thoughts, "role": "model"}, "index": 0}], **meta}
            yield sse_frame(frame)
        last = {**candidate, "content": {"parts": rest or [{"text": ""}], "role": "model"}}
        yield sse_frame({"candidates": [last], "usageMetadata": reply.get("usageMetadata"), **meta})

    def sse_keepalive(self) -> bytes:
        """A blank line: google-genai reads any line that is not ``data:`` as JSON, SSE comments included."""
        return b"\n"

    def error_body(self, status: int, message: str, *, code: str) -> Dict[str, Any]:
        state = _STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        detail = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": code, "domain": "openenv.capture"}
        return {"error": {"code": status, "message": message, "status": state, "details": [detail]}}

    def sse_error(self, message: str, *, code: str, status: int = 500) -> bytes:
        return sse_frame(self.error_body(status, message, code=code))


def _parts(content: Any, what: str) -> List[Dict[str, Any]]:
    content = as_dict(content, what)
    return [as_dict(part, f"{what} part") for part in as_list(content.get("parts") or [], f"{what}.parts")]


def _text(part: Dict[str, Any]) -> str:
    text = part.get("text")
    return text if isinstance(text, str) else ""


def _model_turn(index: int, parts: List[Dict[str, Any]]) -> tuple[Dict[str, Any], List[Dict[str, Any]]]:
    texts: List[str] = []
    thoughts: List[str] = []
    calls: List[Dict[str, Any]] = []
    for position, part in enumerate(parts):
        call = get(part, "functionCall", "function_call")
        if isinstance(call, dict):
            name = str(call.get("name", ""))
            # A call without an id gets one that is the same each time this history is sent.
            call_id = call.get("id") or stable_id("call_", index, position, name)
            calls.append(tool_call(str(call_id), name, json_arguments(call.get("args"))))
        elif part.get("thought") is True:
            thoughts.append(_text(part))
        elif "text" in part:
            texts.append(_text(part))
        elif get(part, "inlineData", "inline_data") is not None or get(part, "fileData", "file_data") is not None:
            raise DialectError("media parts in model turns are not supported")
        # executableCode / codeExecutionResult belong to Google's hosted code tool; a bare
        # thoughtSignature part carries nothing the engine can read.
    message: Dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    pending = [{"id": call["id"], "name": call["function"]["name"], "answered": False} for call in calls]
    return message, pending


def _user_turn(parts: List[Dict[str, Any]], pending: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    results: List[Dict[str, Any]] = []
    moved: List[Dict[str, Any]] = []
    content: List[Dict[str, Any]] = []
    for part in parts:
        response = get(part, "functionResponse", "function_response")
        if isinstance(response, dict):
            call_id = _match_call(response, pending)
            body = response.get("response")
            results.append(
                {"role": "tool", "tool_call_id": call_id, "content": dumps(body if body is not None else {})}
            )
            for inner in response.get("parts") or []:
                if isinstance(inner, dict):
                    moved.append(_media(inner))
        elif part.get("thought") is True:
            continue
        elif "text" in part:
            content.append({"type": "text", "text": _text(part)})
        elif get(part, "inlineData", "inline_data") is not None or get(part, "fileData", "file_data") is not None:
            content.append(_media(part))
        else:
            raise DialectError(f"user parts with {sorted(part)} are not supported")
    out = list(results)
    if moved or content:
        out.append({"role": "user", "content": user_content(moved + content)})
    return out


def _match_call(response: Dict[str, Any], pending: List[Dict[str, Any]]) -> str:
    """The id of the call this response answers: its own id, else the earliest unanswered call of that name."""
    name = response.get("name")
    given = response.get("id")
    for call in pending:
        if not call["answered"] and (call["id"] == given if given else call["name"] == name):
            call["answered"] = True
            return str(call["id"])
    if given:
        return str(given)
    raise DialectError(
        f"functionResponse {name!r} answers no functionCall of that name in the model turn before it"
        " (give the response the call's id, or send the model turn that made the call)"
    )


def _media(part: Dict[str, Any]) -> Dict[str, Any]:
    inline = get(part, "inlineData", "inline_data")
    if isinstance(inline, dict):
        mime = str(get(inline, "mimeType", "mime_type") or "")
        if not mime.startswith("image/"):
            raise DialectError(f"inline data of type {mime!r} is not supported (images only)")
        return image_part(data_url(mime, str(inline.get("data", ""))))
    file = get(part, "fileData", "file_data")
    if isinstance(file, dict):
        mime = str(get(file, "mimeType", "mime_type") or "")
        if mime and not mime.startswith("image/"):
            raise DialectError(f"file data of type {mime!r} is not supported (images only)")
        return image_part(str(get(file, "fileUri", "file_uri") or ""))
    raise DialectError("a media part needs inlineData or fileData")


def _generation(config: Dict[str, Any], chat: Dict[str, Any]) -> None:
    for field, target in _GENERATION.items():
        value = get(config, field, _SNAKE.get(field, field))
        if value is not None:
            chat[target] = value
    logprobs = get(config, "responseLogprobs", "response_logprobs")
    if logprobs is True:
        chat["logprobs"] = True
        top = config.get("logprobs")
        if isinstance(top, int):
            chat["top_logprobs"] = top
    mime = get(config, "responseMimeType", "response_mime_type")
    schema = get(config, "responseJsonSchema", "response_json_schema")
    if schema is None:
        openapi = get(config, "responseSchema", "response_schema")
        schema = _json_schema(openapi) if openapi is not None else None
    if isinstance(schema, dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    elif mime == "application/json":
        chat["response_format"] = {"type": "json_object"}
    thinking = get(config, "thinkingConfig", "thinking_config")
    if isinstance(thinking, dict):
        include = get(thinking, "includeThoughts", "include_thoughts")
        if isinstance(include, bool):
            set_thinking(chat, include)


def _tool(declaration: Any) -> Dict[str, Any]:
    declaration = as_dict(declaration, "function declaration")
    schema = get(declaration, "parametersJsonSchema", "parameters_json_schema")
    if schema is None and declaration.get("parameters") is not None:
        schema = _json_schema(declaration["parameters"])
    return function_tool(declaration.get("name"), declaration.get("description"), schema)


def _json_schema(schema: Any) -> Any:
    """Google's OpenAPI subset (``"type": "OBJECT"``, ``nullable``) as JSON Schema."""
    if isinstance(schema, list):
        return [_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: Dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out["type"] = value.lower()
        elif key in ("nullable", "propertyOrdering", "property_ordering"):
            continue
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: _json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf", "any_of"):
            out["anyOf" if key == "any_of" else key] = _json_schema(value)
        else:
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _tool_config(config: Any, chat: Dict[str, Any]) -> None:
    calling: Optional[Dict[str, Any]] = None
    if isinstance(config, dict):
        calling = get(config, "functionCallingConfig", "function_calling_config")
    if not isinstance(calling, dict):
        return
    mode = _MODES.get(str(calling.get("mode", "")).upper())
    names = get(calling, "allowedFunctionNames", "allowed_function_names")
    if mode == "required" and isinstance(names, list) and len(names) == 1:
        chat["tool_choice"] = {"type": "function", "function": {"name": names[0]}}
    elif mode is not None:
        chat["tool_choice"] = mode
