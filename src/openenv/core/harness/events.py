"""What a harness reports during a turn, and the messages of the turn protocol (upstream's RFC 005).

A turn is a stream of :class:`HarnessEvent` ending with one of type ``turn_complete`` (whose
``data["response"]`` is the harness's answer and ``data.get("done")`` whether it considers the
episode over). :class:`HarnessResponse` is a drained turn. :class:`HarnessClientMessage` is what a
client sends to start a turn; :class:`HarnessProtocolError` is the answer to a message that is not
one. :func:`parse_client_message` reads a client's frame and, when it is wrong, says what is wrong
in plain words: field names and what each should be, never the input echoed back nor pydantic's
error text (upstream echoes both).
"""

from __future__ import annotations

import json
import time
from enum import Enum
from typing import Any, Dict, List, Literal, Sequence, Union

from pydantic import BaseModel, Field, ValidationError


class HarnessEventType(str, Enum):
    """The kinds of event a harness reports; ``data`` keys by convention are given per kind."""

    LLM_REQUEST = "llm_request"
    LLM_RESPONSE = "llm_response"
    LLM_CHUNK = "llm_chunk"
    TOOL_CALL = "tool_call"  # tool_name, arguments
    TOOL_RESULT = "tool_result"  # tool_name, result, is_error
    TEXT_OUTPUT = "text_output"  # text
    ERROR = "error"  # message, recoverable
    TURN_COMPLETE = "turn_complete"  # response, optional done


class HarnessEvent(BaseModel):
    """One event of a turn; ``timestamp`` is seconds since the epoch, when it was made."""

    type: HarnessEventType
    timestamp: float = Field(default_factory=time.time)
    data: Dict[str, Any] = Field(default_factory=dict)


class HarnessResponse(BaseModel):
    """A whole turn: the harness's answer, the events that led to it, and whether it is done."""

    response: str
    events: List[HarnessEvent] = Field(default_factory=list)
    done: bool = False


class HarnessClientMessage(BaseModel):
    """A client's message that starts a turn: ``{"type": "message", "content": "..."}``."""

    type: Literal["message"]
    content: str


class HarnessProtocolError(BaseModel):
    """The answer to a client frame that is not a :class:`HarnessClientMessage`.

    ``data`` is ``{"message": <what is wrong>, "code": "INVALID_JSON" | "VALIDATION_ERROR"}``;
    the session goes on (the error is recoverable)."""

    type: Literal["protocol_error"] = "protocol_error"
    data: Dict[str, Any] = Field(default_factory=dict)


def events_to_metadata(events: Sequence[HarnessEvent]) -> List[Dict[str, Any]]:
    """The events as JSON-safe dicts (``{"type", "timestamp", "data"}``), for an observation's metadata."""
    return [event.model_dump(mode="json") for event in events]


_EXPECTED = 'a JSON object {"type": "message", "content": "<text>"}'

_PROBLEMS = {
    "missing": "is missing",
    "literal_error": "must be 'message'",
    "string_type": "must be a string",
    "model_type": "must be a JSON object",
    "dict_type": "must be a JSON object",
}


def parse_client_message(frame: Union[str, bytes]) -> Union[HarnessClientMessage, HarnessProtocolError]:
    """Read one client frame: the message, or the protocol error to send back.

    The error's message names the fields at fault and what each should be; it quotes no part of
    the frame and none of the validator's own wording (which carries its input and documentation
    links)."""
    try:
        payload = json.loads(frame)
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError
        reason = f"{exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        message = f"Invalid JSON: {reason or 'the frame is not UTF-8 JSON'}; expected {_EXPECTED}"
        return HarnessProtocolError(data={"message": message, "code": "INVALID_JSON"})
    try:
        return HarnessClientMessage.model_validate(payload)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False, include_input=False, include_context=False):
            where = ".".join(str(part) for part in error.get("loc", ()))
            problem = _PROBLEMS.get(error.get("type", ""), "is not valid")
            problems.append(f"{where} {problem}" if where else f"the message {problem}")
        message = f"Invalid message: {'; '.join(problems)}; expected {_EXPECTED}"
        return HarnessProtocolError(data={"message": message, "code": "VALIDATION_ERROR"})


__all__ = [
    "HarnessClientMessage",
    "HarnessEvent",
    "HarnessEventType",
    "HarnessProtocolError",
    "HarnessResponse",
    "events_to_metadata",
    "parse_client_message",
]
