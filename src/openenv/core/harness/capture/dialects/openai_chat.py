"""OpenAI chat completions: the engine's own language, so nearly a passthrough.

In: system and developer messages merge into one leading system message; ``max_completion_tokens``
also fills an absent ``max_tokens``; stream flags go (the engine call never streams).
Out: the engine's completion with the agent's model name and without what only a trainer should
see (prompt and sampled token ids, logprobs the agent did not ask for).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from ._base import Answer, APIType, Dialect, DialectError, as_list, finish_messages, sse_frame

# Engine extensions (vLLM, SGLang) that carry token ids or prompt scores: the trainer's, not the agent's.
_ENGINE_FIELDS = ("prompt_token_ids", "prompt_logprobs", "kv_transfer_params")
_ENGINE_CHOICE_FIELDS = ("token_ids", "prompt_token_ids", "prompt_logprobs")

_ERROR_TYPES = ("invalid_request_error", "authentication_error", "permission_error", "not_found_error")
_ERROR_TYPES += ("rate_limit_error", "server_error", "api_error")
_STATUS_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def openai_error_type(status: int, code: str) -> str:
    """The ``type`` of an OpenAI-style error: set by a status that has its own type, else by ``code``
    when it names a type, else ``server_error`` (5xx) or ``invalid_request_error``."""
    if status in _STATUS_TYPES:
        return _STATUS_TYPES[status]
    if code in _ERROR_TYPES:
        return code
    return "server_error" if status >= 500 else "invalid_request_error"


class OpenAIChat(Dialect):
    api_type = APIType.OPENAI_CHAT

    def to_chat(self, body: Dict[str, Any], *, path: str, served_model: str) -> Dict[str, Any]:
        messages = as_list(body.get("messages"), "messages")
        if not messages:
            raise DialectError("messages must not be empty")
        chat = {key: value for key, value in body.items() if key not in ("stream", "stream_options")}
        # Each message is copied: the pipeline edits the engine request and the agent's body stays as sent.
        chat["messages"] = finish_messages([dict(m) if isinstance(m, dict) else m for m in messages])
        if chat.get("max_tokens") is None and chat.get("max_completion_tokens") is not None:
            chat["max_tokens"] = chat["max_completion_tokens"]
        if served_model:
            chat["model"] = served_model
        return chat

    def from_chat(self, chat: Dict[str, Any], *, request: Dict[str, Any], path: str) -> Dict[str, Any]:
        reply = {key: value for key, value in chat.items() if key not in _ENGINE_FIELDS}
        if isinstance(request.get("model"), str):
            reply["model"] = request["model"]
        wants_logprobs = request.get("logprobs") is True
        choices = []
        for choice in chat.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            kept = {key: value for key, value in choice.items() if key not in _ENGINE_CHOICE_FIELDS}
            kept["logprobs"] = _agent_logprobs(choice.get("logprobs")) if wants_logprobs else None
            choices.append(kept)
        reply["choices"] = choices
        return reply

    def sse(self, reply: Dict[str, Any], *, request: Optional[Dict[str, Any]] = None) -> Iterator[bytes]:
        """One ``chat.completion.chunk`` holding the whole answer, then ``[DONE]``.

        Usage rides in a last chunk with no choices when the agent asked for it
        (``stream_options.include_usage``); without ``request`` it rides on the one chunk.
        """
        answer = Answer(reply)
        chunk: Dict[str, Any] = {
            "id": answer.id,
            "object": "chat.completion.chunk",
            "created": answer.created,
            "model": reply.get("model") or "",
        }
        if reply.get("system_fingerprint") is not None:
            chunk["system_fingerprint"] = reply["system_fingerprint"]
        choices = []
        for index, choice in enumerate(reply.get("choices") or []):
            message = choice.get("message") or {}
            delta: Dict[str, Any] = {"role": "assistant"}
            if message.get("content") is not None:
                delta["content"] = message["content"]
            for key in ("reasoning_content", "reasoning", "refusal"):
                if message.get(key) is not None:
                    delta[key] = message[key]
            calls = message.get("tool_calls") or []
            if calls:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
            choices.append(
                {
                    "index": choice.get("index", index),
                    "delta": delta,
                    "logprobs": choice.get("logprobs"),
                    "finish_reason": choice.get("finish_reason") or "stop",
                }
            )
        chunk["choices"] = choices
        usage = reply.get("usage")
        options = (request or {}).get("stream_options")
        separate_usage = isinstance(options, dict) and options.get("include_usage") is True
        if usage is not None and request is None:
            chunk["usage"] = usage
        yield sse_frame(chunk)
        if usage is not None and separate_usage:
            yield sse_frame({**{k: v for k, v in chunk.items() if k != "choices"}, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    def error_body(self, status: int, message: str, *, code: str) -> Dict[str, Any]:
        return {"error": {"message": message, "type": openai_error_type(status, code), "param": None, "code": code}}

    def sse_error(self, message: str, *, code: str, status: int = 500) -> bytes:
        return sse_frame(self.error_body(status, message, code=code))


def _agent_logprobs(logprobs: Any) -> Any:
    """The OpenAI fields of each logprob entry (the token ids the proxy added stay with the trainer)."""
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return logprobs if logprobs is None else None
    keys = ("token", "logprob", "bytes")
    content = []
    for entry in logprobs["content"]:
        if not isinstance(entry, dict):
            continue
        kept = {key: entry.get(key) for key in keys}
        kept["top_logprobs"] = [
            {key: top.get(key) for key in keys} for top in entry.get("top_logprobs") or [] if isinstance(top, dict)
        ]
        content.append(kept)
    return {"content": content, "refusal": logprobs.get("refusal")}
