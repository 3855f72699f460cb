"""JSON-RPC dispatch for ``/mcp`` (HTTP and WebSocket) and ``{"type": "mcp"}`` frames on ``/ws``.

Methods: ``tools/list`` and ``tools/call``; OpenEnv's ``openenv/session/create`` and
``openenv/session/close``; and the MCP lifecycle (``initialize``, ``ping``, ``notifications/*``)
so that standard MCP clients can use an environment's tools.

Two dialects share one dispatcher. OpenEnv 0.10 clients get OpenEnv's answers (a failing tool is a
JSON-RPC ``-32603`` error). Standard MCP clients — recognised by the ``MCP-Protocol-Version``
header they send after ``initialize`` — get a failing tool as a result with ``isError: true``, as
the MCP specification asks. A ``tools/call`` result carries both key styles: ``content``,
``structuredContent``, ``isError`` (MCP) and ``structured_content``, ``is_error``, ``data``,
``meta`` (OpenEnv 0.10).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional, Type

from . import error_details as shown_errors
from .exceptions import (
    EnvironmentFactoryError,
    SessionCapacityError,
    SessionCreationError,
    SessionNotFoundError,
    StepTimeoutError,
)
from .mcp_types import (
    CallToolAction,
    JsonRpcErrorCode,
    JsonRpcRequest,
    JsonRpcResponse,
    ListToolsAction,
    ListToolsObservation,
    ToolErrorType,
)
from .serialization import dumps_json
from .sessions import Session, SessionClosedError, SessionKind, SessionManager
from .types import Action

logger = logging.getLogger("openenv.server")

LATEST_PROTOCOL_VERSION = "2025-11-25"
SUPPORTED_PROTOCOL_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", LATEST_PROTOCOL_VERSION})
"""MCP revisions whose tools subset (initialize, ping, tools/list, tools/call) this server speaks:
``initialize`` answers the requested one when it is among them, else the latest."""


class _RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        super().__init__(message)


def _tool_listing(tool: Any) -> Dict[str, Any]:
    """A tools/list entry: the MCP ``Tool`` with its wire names (``inputSchema``, ``_meta``) and
    its empty fields as null, plus ``meta``, so that it carries every key upstream sends
    (name, title, description, inputSchema, outputSchema, icons, annotations, meta, execution)."""
    entry = tool.to_mcp_tool().model_dump(mode="json", by_alias=True)
    entry.setdefault("meta", entry.get("_meta"))
    for key in ("title", "description", "outputSchema", "icons", "annotations", "execution"):
        entry.setdefault(key, None)
    return entry


class MCPDispatcher:
    """Answers one JSON-RPC request against a :class:`SessionManager`'s sessions."""

    def __init__(
        self,
        manager: SessionManager,
        action_cls: Type[Action],
        server_name: str,
        server_version: str = "1.0.0",
    ) -> None:
        self.manager = manager
        self.action_cls = action_cls
        self.server_name = server_name
        self.server_version = server_version

    async def create_session(self) -> Session:
        """A detached session (``openenv/session/create`` and MCP ``initialize``)."""
        return await self.manager.create(SessionKind.DETACHED)

    async def dispatch(
        self,
        request: JsonRpcRequest,
        *,
        session: Optional[Session] = None,
        socket_owned: bool = False,
        mcp_dialect: bool = False,
    ) -> Optional[JsonRpcResponse]:
        """The response to ``request`` (None for notifications).

        ``session`` is the session the request arrived on (a socket's, or an MCP HTTP session);
        ``socket_owned`` says it belongs to the connection the request came through.
        """
        try:
            result = await self._dispatch(request, session, socket_owned, mcp_dialect)
        except _RpcError as err:
            return JsonRpcResponse.error_response(err.code, err.message, err.data, request.id)
        except StepTimeoutError as exc:
            return JsonRpcResponse.error_response(
                JsonRpcErrorCode.INTERNAL_ERROR, exc.message, {"code": "TIMEOUT"}, request.id
            )
        except SessionClosedError as exc:  # closed while this request waited for it: as if unknown
            return JsonRpcResponse.error_response(JsonRpcErrorCode.INVALID_PARAMS, exc.message, None, request.id)
        except Exception as exc:
            message = shown_errors.describe(exc, logger, f"MCP request {request.method} failed")
            return JsonRpcResponse.error_response(JsonRpcErrorCode.INTERNAL_ERROR, message, None, request.id)
        if result is _NO_RESPONSE:
            return None
        return JsonRpcResponse.success(result, request.id)

    async def _dispatch(
        self, request: JsonRpcRequest, session: Optional[Session], socket_owned: bool, mcp_dialect: bool
    ) -> Any:
        method, params = request.method, request.params
        if method == "tools/call":
            return await self._on_target(session, params, lambda s: self._call_tool(s, params, mcp_dialect))
        if method == "tools/list":
            return await self._on_target(session, params, self._list_tools)
        if method == "openenv/session/create":
            if session is not None and socket_owned:
                return {"session_id": session.id}
            try:
                created = await self.create_session()
            except SessionCapacityError as exc:
                raise _RpcError(
                    JsonRpcErrorCode.SERVER_ERROR,
                    exc.message,
                    {"active_sessions": exc.active_sessions, "max_sessions": exc.max_sessions},
                ) from None
            except EnvironmentFactoryError as exc:
                raise _RpcError(
                    JsonRpcErrorCode.SERVER_ERROR, exc.message, {"factory_name": exc.factory_name}
                ) from None
            return {"session_id": created.id}
        if method == "openenv/session/close":
            session_id = params.get("session_id")
            if not session_id:
                raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "Invalid params - 'session_id' is required")
            if socket_owned and session is not None and session_id == session.id:
                raise _RpcError(
                    JsonRpcErrorCode.INVALID_REQUEST,
                    "Cannot close the session of this connection; close the connection instead",
                )
            try:
                return await self.manager.request_close(str(session_id))
            except SessionCreationError as exc:
                raise _RpcError(JsonRpcErrorCode.INVALID_REQUEST, exc.message) from None
            except SessionNotFoundError:
                raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, f"Unknown session_id: {session_id}") from None
        if method == "initialize":
            requested = params.get("protocolVersion")
            version = requested if requested in SUPPORTED_PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION
            return {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": self.server_name, "version": self.server_version},
            }
        if method == "ping":
            return {}
        if method.startswith("notifications/"):
            # A notification has no id and gets no response; sent with an id, it is a request.
            return _NO_RESPONSE if request.id is None else {}
        raise _RpcError(JsonRpcErrorCode.METHOD_NOT_FOUND, f"Method not found: {method}")

    async def _on_target(
        self, session: Optional[Session], params: Dict[str, Any], operation: Callable[[Session], Any]
    ) -> Any:
        """Run ``operation`` on the request's session, the one named in params, or a throw-away one."""
        if session is None and params.get("session_id"):
            session_id = str(params["session_id"])
            try:
                session = self.manager.get(session_id)
            except SessionNotFoundError:
                raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, f"Unknown session_id: {session_id}") from None
            except SessionCreationError as exc:
                raise _RpcError(JsonRpcErrorCode.INVALID_REQUEST, exc.message) from None
        if session is not None:
            return await operation(session)
        async with self.manager.temporary() as temporary:
            return await operation(temporary)

    def _uses_mcp_actions(self) -> bool:
        return self.action_cls in (CallToolAction, ListToolsAction)

    async def _list_tools(self, session: Session) -> Dict[str, Any]:
        assert session.traits is not None
        if session.traits.mcp:
            tools = await self.manager.call(session, "tools/list", None, lambda env: env.fastmcp_tools())
            return {"tools": [_tool_listing(t) for t in tools]}
        if not self._uses_mcp_actions():
            raise _RpcError(JsonRpcErrorCode.INTERNAL_ERROR, "Environment does not support MCP")
        observation = await self.manager.step(session, ListToolsAction())
        if not isinstance(observation, ListToolsObservation):
            raise _RpcError(
                JsonRpcErrorCode.INTERNAL_ERROR, "Environment answered tools/list without a ListToolsObservation"
            )
        tools = []
        for tool in observation.tools:
            entry = tool.model_dump()
            entry["inputSchema"] = entry["input_schema"]
            tools.append(entry)
        return {"tools": tools}

    async def _call_tool(self, session: Session, params: Dict[str, Any], mcp_dialect: bool) -> Dict[str, Any]:
        name = params.get("name")
        if name is None or name == "":
            raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "Missing 'name' in params")
        if not isinstance(name, str):
            raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "'name' must be a string")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        elif not isinstance(arguments, dict):
            raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "'arguments' must be an object")
        assert session.traits is not None
        if not session.traits.mcp:
            if not self._uses_mcp_actions():
                raise _RpcError(JsonRpcErrorCode.INTERNAL_ERROR, "Environment does not support MCP")
            observation = await self.manager.step(session, CallToolAction(tool_name=name, arguments=arguments))
            dump = observation.model_dump(mode="json")
            return _as_mcp_result(dump) if mcp_dialect else dump

        from .mcp_environment import ToolCallFailed

        try:
            payload = await self.manager.call(
                session, "tools/call", None, lambda env: env.call_tool_payload(name, arguments), step=True
            )
        except ToolCallFailed as failure:
            session.touch(step=True)  # a failed call is a step too
            error = failure.error
            if mcp_dialect and error.error_type is not ToolErrorType.TOOL_NOT_FOUND:
                text = [{"type": "text", "text": error.message}]
                return {
                    "content": text,
                    "isError": True,
                    "is_error": True,
                    "structured_content": None,
                    "data": None,
                    "meta": None,
                }
            code = JsonRpcErrorCode.INVALID_PARAMS if mcp_dialect else JsonRpcErrorCode.INTERNAL_ERROR
            raise _RpcError(code, error.message, {"error_type": error.error_type.value}) from None
        payload = dict(payload)
        payload["structuredContent"] = payload["structured_content"]
        payload["isError"] = payload["is_error"]
        return payload


def _as_mcp_result(dump: Dict[str, Any]) -> Dict[str, Any]:
    """An environment's own CallToolObservation, dumped, with the keys an MCP CallToolResult
    needs (``content``, ``isError``, ``structuredContent`` for an object result) added."""
    error = dump.get("error")
    result = dump.get("result")
    if isinstance(error, dict):
        text = str(error.get("message") or error)
    elif error is not None:
        text = str(error)
    else:
        text = result if isinstance(result, str) else dumps_json(result)
    out = dict(dump)
    out["content"] = [{"type": "text", "text": text}]
    out["isError"] = error is not None
    if isinstance(result, dict):
        out["structuredContent"] = result
    return out


class _NoResponse:
    pass


_NO_RESPONSE = _NoResponse()
