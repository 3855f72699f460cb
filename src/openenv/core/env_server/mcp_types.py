"""MCP actions and observations, and the JSON-RPC 2.0 models spoken on ``/mcp``."""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import Any, Dict, List, Literal, Optional, Union

import pydantic_core
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_serializer,
    field_validator,
)

from .types import Action, BaseMessage, Observation

RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})
"""Tool names an MCP environment may not use: they are the orchestration verbs."""


class JsonRpcErrorCode(IntEnum):
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    SERVER_ERROR = -32000


_DEFAULT_ERROR_MESSAGES = {
    JsonRpcErrorCode.PARSE_ERROR: "Parse error",
    JsonRpcErrorCode.INVALID_REQUEST: "Invalid Request",
    JsonRpcErrorCode.METHOD_NOT_FOUND: "Method not found",
    JsonRpcErrorCode.INVALID_PARAMS: "Invalid params",
    JsonRpcErrorCode.INTERNAL_ERROR: "Internal error",
    JsonRpcErrorCode.SERVER_ERROR: "Server error",
}


class McpMethod(str, Enum):
    TOOLS_LIST = "tools/list"
    TOOLS_CALL = "tools/call"


class JsonRpcError(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: int
    message: str
    data: Any = None

    @classmethod
    def from_code(cls, code: int, message: Optional[str] = None, data: Any = None) -> JsonRpcError:
        if message is None:
            message = _DEFAULT_ERROR_MESSAGES.get(code, "Error")
        return cls(code=int(code), message=message, data=data)


class JsonRpcRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jsonrpc: Literal["2.0"]
    method: str
    params: Dict[str, Any] = Field(default_factory=dict)
    id: Union[str, int, None] = None

    @field_validator("id", mode="before")
    @classmethod
    def _echoable_id(cls, value: Any) -> Any:
        # A response carries the request's id unchanged: true must not come back as 1, nor 1.0 as 1.
        if isinstance(value, (bool, float)):
            raise ValueError("id must be a string, an integer or null")
        return value


def request_id_of(raw: Any) -> Union[str, int, None]:
    """The id of a raw (possibly invalid) JSON-RPC request, when it is one a response can carry."""
    request_id = raw.get("id") if isinstance(raw, dict) else None
    return request_id if isinstance(request_id, (str, int)) and not isinstance(request_id, bool) else None


class JsonRpcResponse(BaseModel):
    """A JSON-RPC response; its dump holds ``jsonrpc``, ``id`` and exactly one of ``error``/``result``."""

    model_config = ConfigDict(extra="forbid")

    jsonrpc: Literal["2.0"] = "2.0"
    result: Any = None
    error: Optional[JsonRpcError] = None
    id: Union[str, int, None] = None

    def model_dump(self, **kwargs: Any) -> Dict[str, Any]:  # type: ignore[override]
        out: Dict[str, Any] = {"jsonrpc": "2.0", "id": self.id}
        if self.error is not None:
            out["error"] = self.error.model_dump(**kwargs)
        else:
            out["result"] = self.result
        return out

    def model_dump_json(self, **kwargs: Any) -> str:  # type: ignore[override]
        # as serialization.dumps_json writes it (NaN as null), without importing that module
        return pydantic_core.to_json(self.model_dump(), inf_nan_mode="null", fallback=str).decode()

    @classmethod
    def success(cls, result: Any, request_id: Union[str, int, None] = None) -> JsonRpcResponse:
        return cls(result=result, id=request_id)

    @classmethod
    def error_response(
        cls,
        code: int,
        message: Optional[str] = None,
        data: Any = None,
        request_id: Union[str, int, None] = None,
    ) -> JsonRpcResponse:
        return cls(error=JsonRpcError.from_code(code, message, data), id=request_id)


class Tool(BaseModel):
    """A tool as an OpenEnv observation lists it (note: snake_case ``input_schema``)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    input_schema: Dict[str, Any]


class ToolErrorType(str, Enum):
    EXECUTION_ERROR = "execution_error"
    INVALID_ARGS = "invalid_args"
    TRANSPORT_ERROR = "transport_error"
    TOOL_NOT_FOUND = "tool_not_found"
    TIMEOUT = "timeout"


class ToolError(BaseModel):
    """Why a tool call failed in the framework (the tool's own results live in ``result``)."""

    model_config = ConfigDict(extra="forbid")

    error_type: ToolErrorType
    message: str


class ToolCallFailed(Exception):
    """A tool call failed; ``error`` says how (see :class:`ToolErrorType`)."""

    def __init__(self, error: ToolError) -> None:
        self.error = error
        super().__init__(error.message)


class ListToolsAction(Action):
    type: Literal["list_tools"] = "list_tools"


class CallToolAction(Action):
    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    arguments: Dict[str, Any] = Field(default_factory=dict)


class ListToolsObservation(Observation):
    tools: List[Tool]


class CallToolObservation(Observation):
    """The outcome of a ``CallToolAction``: ``result`` is what the tool call returned (``None``
    when it failed: ``error`` says how).

    In the environment's own process (``env.step(CallToolAction(...))``) an
    :class:`~.mcp_environment.MCPEnvironment` gives, as OpenEnv 0.10 does, FastMCP's
    ``CallToolResult``: the tool's value is ``result.data``. On the wire ``result`` is the whole
    result object in OpenEnv 0.10's shape (``content``, ``structured_content``, ``meta``, ``data``,
    ``is_error``), and OpenEnv's clients give the value itself (see :func:`tool_result_value`).
    Set ``result`` to another value and that value is sent instead.
    """

    tool_name: str
    result: Any = None
    error: Optional[ToolError] = None
    # the whole tool result (as sent) and the object made of it into ``result``
    _tool_result: Optional[Dict[str, Any]] = PrivateAttr(default=None)
    _tool_value: Any = PrivateAttr(default=None)

    @classmethod
    def of_tool_result(
        cls, tool_name: str, tool_result: Dict[str, Any], value: Any = None, **fields: Any
    ) -> CallToolObservation:
        """The observation of a call that returned ``tool_result`` (the wire shape above), which
        is what it sends while ``result`` is still ``value`` (default: the tool's value, see
        :func:`tool_result_value`)."""
        if value is None:
            value = tool_result_value(tool_result)
        observation = cls(tool_name=tool_name, result=value, **fields)
        # Written to the private attributes' own dict (pydantic's documented
        # ``__pydantic_private__``): per call, a third of the cost of attribute assignment.
        private = observation.__pydantic_private__
        private["_tool_result"], private["_tool_value"] = tool_result, observation.result
        return observation

    @field_serializer("result", mode="plain")
    def _result_on_the_wire(self, value: Any) -> Any:
        # Read from the private attributes' dict, and the value handed back to be serialized as
        # ``Any`` is: 1.4 us a tools/call observation, against 6.3 us through pydantic's private
        # attribute lookup and a wrap handler (a fifth of an echo MCP step's server CPU above
        # the raw floor's, bench_ws.py)
        private = self.__pydantic_private__ or {}
        full = private.get("_tool_result")
        # (the identity check: code that replaced ``result`` meant its own value to be sent)
        if full is not None and value is private.get("_tool_value"):
            return full
        return value


def tool_result_value(result: Any) -> Any:
    """The value a tool returned, from a ``tools/call`` result in OpenEnv's shape or MCP's.

    ``data`` when the result carries it, else the structured content (unwrapped when FastMCP
    wrapped a plain value as ``{"result": ...}``), else the text content; anything that is not a
    tool-result object is returned as it is.
    """
    if not isinstance(result, dict) or "content" not in result or not ({"is_error", "isError", "data"} & result.keys()):
        return result
    structured = result.get("structured_content", result.get("structuredContent"))
    if result.get("data") is not None or ("data" in result and structured is not None):
        return result["data"]  # (a tool that returned None: data is None, structured content is not)
    if structured is not None:
        meta = result.get("meta", result.get("_meta"))
        wrapped = (
            isinstance(meta, dict) and isinstance(meta.get("fastmcp"), dict) and meta["fastmcp"].get("wrap_result")
        )
        return structured.get("result") if wrapped and isinstance(structured, dict) else structured
    texts = [
        item.get("text")
        for item in result.get("content") or ()
        if isinstance(item, dict) and item.get("type") == "text"
    ]
    if len(texts) == 1:
        return texts[0]
    return "\n".join(t for t in texts if t) if texts else None


class WSMCPMessage(BaseMessage):
    """``{"type": "mcp", "data": <JSON-RPC request>}`` sent on ``/ws``."""

    type: Literal["mcp"] = "mcp"
    data: Dict[str, Any]


class WSMCPResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["mcp"] = "mcp"
    data: Dict[str, Any]
