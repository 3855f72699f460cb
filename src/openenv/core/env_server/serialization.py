"""Turning actions and observations into wire payloads and back, and exceptions into ``/ws`` error frames.

The observation payload is ``{"observation": {...}, "reward": r, "done": d}`` where the nested
observation keeps its ``metadata`` and a non-empty ``metadata`` is also copied to the top level
(OpenEnv 0.10). JSON is produced by pydantic-core, once per message.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, Type, Union

import pydantic_core

from . import error_details
from .exceptions import EXECUTION, VALIDATION, OpenEnvError, kind_of
from .mcp_types import CallToolAction, ListToolsAction
from .types import Action, Observation, WSErrorCode

logger = logging.getLogger("openenv.server")

_REWARD_DONE = {"reward", "done"}

MAX_JSON_DEPTH = 100
"""Deepest nesting of objects and arrays accepted in a message."""

WS_ENVELOPE_KEYS = frozenset({"type", "data"})
"""The keys a ``/ws`` message with data may have: ``{"type": ..., "data": {...}}``."""

_MCP_ACTION_CLASSES = {"list_tools": ListToolsAction, "call_tool": CallToolAction}
_MCP_INTERCEPTING = (Action, ListToolsAction, CallToolAction)


def _json_fallback(value: Any) -> Any:
    to_list = getattr(value, "tolist", None)  # numpy arrays and scalars, torch tensors
    if callable(to_list):
        return to_list()
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_depth(value: Any) -> int:
    """Nesting depth of decoded JSON (a scalar is 0, ``[]`` is 1)."""
    depth, level = 0, [(value, 1)]
    while level:
        item, d = level.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        depth = max(depth, d)
        level.extend((child, d + 1) for child in item if isinstance(child, (dict, list)))
    return depth


def parse_json(text: Union[str, bytes], max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode JSON with a bound on nesting; raises ValueError with a readable reason."""
    value = pydantic_core.from_json(text)  # its own recursion limit (about 200) raises ValueError too
    # Depth can only exceed the number of brackets; counting them is cheap, walking is not.
    brackets = (b"{", b"[") if isinstance(text, (bytes, bytearray)) else ("{", "[")
    if text.count(brackets[0]) + text.count(brackets[1]) > max_depth and json_depth(value) > max_depth:
        raise ValueError(f"nesting deeper than {max_depth} levels")
    return value


def to_json_bytes(value: Any) -> bytes:
    """Compact JSON of any value: pydantic models, dataclasses, numpy arrays included. NaN and
    infinities become ``null``, as pydantic's own ``model_dump_json`` writes them: JSON has no
    such numbers, and strict parsers (JavaScript's, say) refuse them."""
    return pydantic_core.to_json(value, fallback=_json_fallback, inf_nan_mode="null")


def dumps_json(value: Any) -> str:
    return to_json_bytes(value).decode()


def to_jsonable(value: Any) -> Any:
    """The JSON data model of ``value`` (dicts, lists, strings, numbers, bools, None); NaN and
    infinities become None, as in :func:`to_json_bytes`."""
    return pydantic_core.to_jsonable_python(value, fallback=_json_fallback, inf_nan_mode="null")


def serialize_observation(observation: Observation) -> Dict[str, Any]:
    """The observation payload as a dict (see the module docstring)."""
    payload: Dict[str, Any] = {
        "observation": observation.model_dump(exclude=_REWARD_DONE),
        "reward": observation.reward,
        "done": observation.done,
    }
    if observation.metadata:
        payload["metadata"] = observation.metadata
    return payload


def _reward_json(reward: Any) -> str:
    if reward is None:
        return "null"
    if isinstance(reward, bool):
        return "true" if reward else "false"
    if isinstance(reward, int):
        return int.__repr__(reward)
    text = float.__repr__(float(reward))
    return "null" if text in ("nan", "inf", "-inf") else text


def observation_payload_json(observation: Observation) -> str:
    """JSON of :func:`serialize_observation`'s payload, built without an intermediate dict."""
    body = observation.__pydantic_serializer__.to_json(
        observation, exclude=_REWARD_DONE, fallback=_json_fallback
    ).decode()
    reward_json = _reward_json(observation.reward)
    done = "true" if observation.done else "false"
    if observation.metadata:
        meta = dumps_json(observation.metadata)
        return f'{{"observation":{body},"reward":{reward_json},"done":{done},"metadata":{meta}}}'
    return f'{{"observation":{body},"reward":{reward_json},"done":{done}}}'


def observation_message_json(observation: Observation) -> str:
    """The ``/ws`` message carrying ``observation``: ``{"type": "observation", "data": payload}``."""
    return '{"type":"observation","data":' + observation_payload_json(observation) + "}"


def error_frame(code: WSErrorCode, message: str, **extra: Any) -> str:
    return dumps_json({"type": "error", "data": {"message": message, "code": code.value, **extra}})


def error_frame_of(exc: BaseException, what: str, fallback: WSErrorCode = WSErrorCode.EXECUTION_ERROR) -> str:
    """The ``/ws`` error frame answering ``exc``, by the table of :mod:`.exceptions`: an invalid
    message's pydantic errors, an OpenEnv error's code, message and details; anything else as
    ``fallback`` (an execution error), worded by :func:`.error_details.describe` (which logs it as
    ``what``) and naming the exception. The one renderer of error frames: the ``/ws`` handler's
    and those the transport writes itself (:mod:`._compat.uvicorn`)."""
    kind = kind_of(exc)
    if kind is VALIDATION:
        errors = json.loads(exc.json())  # type: ignore[attr-defined]
        return error_frame(WSErrorCode.VALIDATION_ERROR, "Invalid message", errors=errors)
    if isinstance(exc, OpenEnvError) and kind is not EXECUTION:
        return error_frame(WSErrorCode(kind.ws_code), exc.text, **exc.details())
    message = error_details.describe(exc, logger, what)
    return error_frame(fallback, message, exception=error_details.exception_name(exc))


def deserialize_action(data: Dict[str, Any], action_cls: Type[Action]) -> Action:
    """Validate ``data`` into ``action_cls``.

    MCP payloads (``{"type": "list_tools"}`` or ``{"type": "call_tool", ...}``) become
    :class:`ListToolsAction` / :class:`CallToolAction` when the server's action class is
    ``Action`` or one of those two. Raises ``pydantic.ValidationError``.
    """
    if action_cls in _MCP_INTERCEPTING:
        kind = data.get("type")
        mcp_cls = _MCP_ACTION_CLASSES.get(kind) if isinstance(kind, str) else None
        if mcp_cls is not None:
            return mcp_cls.model_validate(data)
    return action_cls.model_validate(data)


def deserialize_action_with_preprocessing(data: Dict[str, Any], action_cls: Type[Action]) -> Action:
    """Like :func:`deserialize_action`, after coercing form input from the web interface.

    A ``call_tool`` ``arguments`` string is parsed as JSON; ``tokens`` given as a list or JSON
    string becomes a torch tensor when torch is installed; a numeric ``action_id`` string becomes
    an int.
    """
    data = dict(data)
    if data.get("type") == "call_tool" and isinstance(data.get("arguments"), str):
        try:
            data["arguments"] = json.loads(data["arguments"])
        except json.JSONDecodeError:
            pass
    elif data.get("type") not in _MCP_ACTION_CLASSES:
        if "tokens" in data:
            tokens = data["tokens"]
            if isinstance(tokens, str):
                try:
                    tokens = json.loads(tokens)
                except json.JSONDecodeError:
                    tokens = []
            try:
                import torch

                data["tokens"] = torch.tensor(tokens, dtype=torch.long)
            except ImportError:
                data["tokens"] = tokens
        if isinstance(data.get("action_id"), str):
            try:
                data["action_id"] = int(data["action_id"])
            except ValueError:
                pass
    return deserialize_action(data, action_cls)
