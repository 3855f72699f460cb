"""MCP over JSON-RPC: ``POST``/``DELETE /mcp``, ``WS /mcp``, and ``{"type": "mcp"}`` frames on ``/ws``.

The three transports share one parse (:func:`parse_request`), one dispatcher
(:meth:`MCPDispatcher.dispatch`) and one error renderer (:func:`rpc_error`, by the table of
:mod:`.exceptions`); the two sockets share one answer to a message (:meth:`MCPDispatcher.answer`).

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

import contextlib
import logging
from typing import Any, Callable, Dict, Optional, Type, Union

import pydantic
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket

from . import error_details as shown_errors
from . import resume
from .exceptions import EXECUTION, OpenEnvError, SessionNotFoundError, kind_of
from .mcp_types import (
    CallToolAction,
    JsonRpcErrorCode,
    JsonRpcRequest,
    JsonRpcResponse,
    ListToolsAction,
    ListToolsObservation,
    ToolErrorType,
    request_id_of,
)
from .serialization import dumps_json, parse_json
from .sessions import Session, SessionKind, SessionManager
from .types import Action, Observation

logger = logging.getLogger("openenv.server")

LATEST_PROTOCOL_VERSION = "2025-11-25"
SUPPORTED_PROTOCOL_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", LATEST_PROTOCOL_VERSION})
"""MCP revisions whose tools subset (initialize, ping, tools/list, tools/call) this server speaks:
``initialize`` answers the requested one when it is among them, else the latest."""

_NO_RESPONSE = object()  # what a notification gets
_BINARY_FRAME = JsonRpcResponse.error_response(
    JsonRpcErrorCode.PARSE_ERROR, "Parse error: binary frames are not supported"
)
_FAILED_TOOL = {"isError": True, "is_error": True, "structured_content": None, "data": None, "meta": None}


class _RpcError(Exception):
    """A JSON-RPC error to answer with; ``args`` are its code, message and (optionally) data."""


def rpc_error(exc: BaseException, request_id: Any = None, what: str = "MCP request failed") -> JsonRpcResponse:
    """The JSON-RPC error answering ``exc``, by the table of :mod:`.exceptions`: an OpenEnv error
    with its code, message and, where it has details (a timeout's ``timeout_s``, capacity's
    counts), ``data`` holding them and its ``/ws`` code; anything else as an internal error,
    worded by :func:`.error_details.describe`."""
    if isinstance(exc, _RpcError):
        return JsonRpcResponse.error_response(*exc.args, request_id=request_id)
    kind = kind_of(exc)
    if isinstance(exc, OpenEnvError) and kind is not EXECUTION:
        details = exc.details()
        data = {"code": kind.ws_code, **details} if details else None  # upstream sends no data
        return JsonRpcResponse.error_response(kind.rpc_code, exc.text, data, request_id)
    return JsonRpcResponse.error_response(kind.rpc_code, shown_errors.describe(exc, logger, what), None, request_id)


def parse_request(message: Any, max_chars: int) -> Union[JsonRpcRequest, JsonRpcResponse]:
    """The JSON-RPC request in ``message`` (a frame's text, a body's bytes, or JSON already
    parsed), or the error response saying why there is none."""
    if isinstance(message, (str, bytes)):
        if len(message) > max_chars:
            return JsonRpcResponse.error_response(
                JsonRpcErrorCode.INVALID_REQUEST, f"Message exceeds the server's limit of {max_chars} bytes"
            )
        try:
            message = parse_json(message)
        except ValueError as exc:
            return JsonRpcResponse.error_response(JsonRpcErrorCode.PARSE_ERROR, f"Parse error: {exc}")
    if isinstance(message, list):
        return JsonRpcResponse.error_response(
            JsonRpcErrorCode.INVALID_REQUEST, "Invalid request: batches are not supported"
        )
    try:
        return JsonRpcRequest.model_validate(message)
    except pydantic.ValidationError as exc:
        return JsonRpcResponse.error_response(
            JsonRpcErrorCode.INVALID_REQUEST, f"Invalid request: {exc}", None, request_id_of(message)
        )


def _rpc_reply(response: JsonRpcResponse, status: int = 200, headers: Optional[Dict[str, str]] = None) -> Response:
    return Response(
        dumps_json(response.model_dump()), status_code=status, media_type="application/json", headers=headers
    )


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
        max_message_chars: int,
    ) -> None:
        self.manager = manager
        self.max_message_chars = max_message_chars
        self.action_cls = action_cls
        self.server_name = server_name

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
        except Exception as exc:
            return rpc_error(exc, request.id, f"MCP request {request.method} failed")
        if result is _NO_RESPONSE:
            return None
        return JsonRpcResponse.success(result, request.id)

    async def answer(self, message: Any, session: Session) -> Optional[JsonRpcResponse]:
        """The response to one JSON-RPC message (a frame's text, or the ``data`` of a ``/ws``
        frame) that came through the socket owning ``session``; None for a notification."""
        request = parse_request(message, self.max_message_chars)
        if isinstance(request, JsonRpcResponse):
            return request
        return await self.dispatch(request, session=session, socket_owned=True)

    # --- the transports -------------------------------------------------------------------

    async def serve_http(self, request: Request) -> Response:
        """``POST /mcp``: one request; an MCP client's session travels in ``Mcp-Session-Id``
        (made by ``initialize``), an OpenEnv client's in ``params.session_id`` (or none)."""
        rpc = parse_request(await request.body(), self.max_message_chars)
        if isinstance(rpc, JsonRpcResponse):
            return _rpc_reply(rpc)
        header_session = request.headers.get("mcp-session-id")
        protocol = request.headers.get("mcp-protocol-version")
        if protocol is not None and protocol not in SUPPORTED_PROTOCOL_VERSIONS:
            supported = ", ".join(sorted(SUPPORTED_PROTOCOL_VERSIONS))
            message = f"Unsupported MCP-Protocol-Version {protocol!r}; supported: {supported}"
            return _rpc_reply(
                JsonRpcResponse.error_response(JsonRpcErrorCode.INVALID_REQUEST, message, None, rpc.id), 400
            )
        session: Optional[Session] = None
        headers: Dict[str, str] = {}
        create_key = request.headers.get(resume.CREATE_KEY_HEADER)
        try:
            if create_key and rpc.method == "openenv/session/create" and not header_session:
                # sent again after its answer was lost: the same session, not a second one
                session = await self.manager.create_once(create_key)
                return _rpc_reply(JsonRpcResponse.success({"session_id": session.id}, rpc.id))
            if header_session:
                session = self.manager.get(header_session)
            elif rpc.method == "initialize":
                session = await self.manager.create(SessionKind.DETACHED)
                headers["mcp-session-id"] = session.id
        except SessionNotFoundError:
            # (a socket's own session is not found by id either: the same answer, see SessionManager.get)
            message = (
                f"Unknown MCP session: {header_session}; it was closed or never made here: send initialize "
                "without Mcp-Session-Id to start a new one"
            )
            return _rpc_reply(
                JsonRpcResponse.error_response(JsonRpcErrorCode.INVALID_PARAMS, message, None, rpc.id), 404
            )
        except Exception as exc:  # capacity, a failing factory, shutdown, ...: a JSON-RPC error
            return _rpc_reply(rpc_error(exc, rpc.id, "could not open an MCP session"))
        mcp_dialect = protocol is not None or header_session is not None
        response = await self.dispatch(rpc, session=session, mcp_dialect=mcp_dialect)
        if response is None:
            return Response(status_code=202)
        return _rpc_reply(response, headers=headers)

    async def refuse_http_get(self) -> Response:
        """``GET /mcp``: this server streams nothing to MCP clients."""
        return Response(status_code=405, headers={"allow": "POST, DELETE"})

    async def close_http(self, request: Request) -> Response:
        """``DELETE /mcp``: close the MCP session named in ``Mcp-Session-Id``."""
        session_id = request.headers.get("mcp-session-id")
        if not session_id:
            return Response(status_code=400)
        try:
            await self.manager.request_close(session_id)
        except OpenEnvError as exc:
            return Response(status_code=kind_of(exc).http_status)
        return Response(status_code=204)

    async def serve_socket(self, websocket: WebSocket) -> None:
        """``WS /mcp``: one session for the socket's life, one JSON-RPC request per text frame."""
        await websocket.accept()
        try:
            session = await self.manager.create(SessionKind.SOCKET)
        except Exception as exc:
            error = rpc_error(exc, None, "could not open an MCP session")
            with contextlib.suppress(Exception):  # the client may be gone already
                await websocket.send_text(dumps_json(error.model_dump()))
                await websocket.close(kind_of(exc).close_code)
            return
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                answer = _BINARY_FRAME if text is None else await self.answer(text, session)
                if answer is not None:
                    await websocket.send_text(dumps_json(answer.model_dump()))
        except Exception:
            pass
        finally:
            await self.manager.detach(session)

    # --- methods ----------------------------------------------------------------------------

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
            return {"session_id": (await self.manager.create(SessionKind.DETACHED)).id}
        if method == "openenv/session/close":
            session_id = params.get("session_id")
            if not session_id:
                raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "Invalid params - 'session_id' is required")
            if socket_owned and session is not None and session_id == session.id:
                raise _RpcError(
                    JsonRpcErrorCode.INVALID_REQUEST,
                    "Cannot close the session of this connection; close the connection instead",
                )
            return await self.manager.request_close(str(session_id))
        if method == "initialize":
            requested = params.get("protocolVersion")
            version = requested if requested in SUPPORTED_PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION
            return {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": self.server_name, "version": "1.0.0"},
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
            session = self.manager.get(str(params["session_id"]))
        if session is not None:
            return await operation(session)
        async with self.manager.temporary() as temporary:
            return await operation(temporary)

    async def _step_mcp_action(self, session: Session, action: Action) -> Observation:
        """The answer of an environment that is no MCPEnvironment but takes MCP actions."""
        if self.action_cls not in (CallToolAction, ListToolsAction):
            raise _RpcError(JsonRpcErrorCode.INTERNAL_ERROR, "Environment does not support MCP")
        return await self.manager.step(session, action)

    async def _list_tools(self, session: Session) -> Dict[str, Any]:
        assert session.traits is not None
        if session.traits.mcp:
            tools = await self.manager.call(session, "tools/list", None, lambda env: env.fastmcp_tools())
            return {"tools": [_tool_listing(t) for t in tools]}
        observation = await self._step_mcp_action(session, ListToolsAction())
        if not isinstance(observation, ListToolsObservation):
            raise _RpcError(
                JsonRpcErrorCode.INTERNAL_ERROR, "Environment answered tools/list without a ListToolsObservation"
            )
        return {"tools": [{**tool.model_dump(), "inputSchema": tool.input_schema} for tool in observation.tools]}

    async def _call_tool(self, session: Session, params: Dict[str, Any], mcp_dialect: bool) -> Dict[str, Any]:
        name = params.get("name")
        if name is None or name == "":
            raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "Missing 'name' in params")
        if not isinstance(name, str):
            raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "'name' must be a string")
        arguments = {} if params.get("arguments") is None else params["arguments"]
        if not isinstance(arguments, dict):
            raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "'arguments' must be an object")
        assert session.traits is not None
        if not session.traits.mcp:
            observation = await self._step_mcp_action(session, CallToolAction(tool_name=name, arguments=arguments))
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
                return {"content": [{"type": "text", "text": error.message}], **_FAILED_TOOL}
            code = JsonRpcErrorCode.INVALID_PARAMS if mcp_dialect else JsonRpcErrorCode.INTERNAL_ERROR
            raise _RpcError(code, error.message, {"error_type": error.error_type.value}) from None
        return {**payload, "structuredContent": payload["structured_content"], "isError": payload["is_error"]}


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
    out = {**dump, "content": [{"type": "text", "text": text}], "isError": error is not None}
    if isinstance(result, dict):
        out["structuredContent"] = result
    return out
