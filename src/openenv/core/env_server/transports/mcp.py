"""MCP's JSON-RPC: ``POST``/``DELETE /mcp``, ``WS /mcp`` frames and ``{"type": "mcp"}`` frames on ``/ws``.

A codec around the one dispatch (:mod:`..dispatch`): one parse (:func:`parse_request`), one
mapping of methods to calls (:class:`MCPProtocol`) and one error renderer (:func:`rpc_error`, by
the table of :mod:`..exceptions`). The sockets (``WS /mcp`` and ``/ws``) are served by
:mod:`.ws`, which hands each JSON-RPC message here (:meth:`MCPProtocol.answer`).

Methods: ``tools/list`` and ``tools/call``; OpenEnv's ``openenv/session/create``,
``openenv/session/close``, ``openenv/session/snapshot|restore|grade|agent_token|trajectory|diff``
and ``openenv/metrics``; and the MCP lifecycle (``initialize``, ``ping``, ``notifications/*``)
so that standard MCP clients can use an environment's tools.

Two dialects share one mapping. OpenEnv 0.10 clients get OpenEnv's answers (a failing tool is a
JSON-RPC ``-32603`` error). Standard MCP clients — recognised by the ``MCP-Protocol-Version``
header they send after ``initialize`` — get a failing tool as a result with ``isError: true``, as
the MCP specification asks. A ``tools/call`` result carries both key styles: ``content``,
``structuredContent``, ``isError`` (MCP) and ``structured_content``, ``is_error``, ``data``,
``meta`` (OpenEnv 0.10).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Tuple, Union

import pydantic
from starlette.requests import Request
from starlette.responses import Response

from .. import error_details, resume
from ..dispatch import Call, Dispatcher, Op
from ..exceptions import EXECUTION, OpenEnvError, SessionNotFoundError, kind_of
from ..mcp_types import (
    JsonRpcErrorCode,
    JsonRpcRequest,
    JsonRpcResponse,
    ToolCallFailed,
    ToolErrorType,
    request_id_of,
)
from ..roles import OPEN, Principal, Role, principal_of
from ..serialization import dumps_json, parse_json, to_jsonable
from ..sessions import Session
from ..snapshots import snapshot_bytes, snapshot_text

logger = logging.getLogger("openenv.server")

LATEST_PROTOCOL_VERSION = "2025-11-25"
SUPPORTED_PROTOCOL_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", LATEST_PROTOCOL_VERSION})
"""MCP revisions whose tools subset (initialize, ping, tools/list, tools/call) this server speaks:
``initialize`` answers the requested one when it is among them, else the latest."""

_NO_RESPONSE = object()  # what a notification gets
BINARY_FRAME = JsonRpcResponse.error_response(
    JsonRpcErrorCode.PARSE_ERROR, "Parse error: binary frames are not supported"
)
_FAILED_TOOL = {"isError": True, "is_error": True, "structured_content": None, "data": None, "meta": None}


class _RpcError(Exception):
    """A JSON-RPC error to answer with; ``args`` are its code, message and (optionally) data."""


def rpc_error(exc: BaseException, request_id: Any = None, what: str = "MCP request failed") -> JsonRpcResponse:
    """The JSON-RPC error answering ``exc``, by the table of :mod:`..exceptions`: an OpenEnv error
    with its code, message and, where it has details (a timeout's ``timeout_s``, capacity's
    counts), ``data`` holding them and its ``/ws`` code; anything else as an internal error,
    worded by :func:`..error_details.describe`."""
    if isinstance(exc, _RpcError):
        return JsonRpcResponse.error_response(*exc.args, request_id=request_id)
    kind = kind_of(exc)
    if isinstance(exc, OpenEnvError) and kind is not EXECUTION:
        details = exc.details()
        data = {"code": kind.ws_code, **details} if details else None  # upstream sends no data
        return JsonRpcResponse.error_response(kind.rpc_code, exc.text, data, request_id)
    return JsonRpcResponse.error_response(kind.rpc_code, error_details.describe(exc, logger, what), None, request_id)


def parse_request(message: Any) -> Union[JsonRpcRequest, JsonRpcResponse]:
    """The JSON-RPC request in ``message`` (a frame's text, a body's bytes, or JSON already
    parsed), or the error response saying why there is none. Its size was bounded where it came
    in (the body limits, the socket's frame limit)."""
    if isinstance(message, (str, bytes)):
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


class MCPProtocol:
    """MCP's JSON-RPC around the :class:`~..dispatch.Dispatcher`: requests in, responses out."""

    def __init__(self, dispatcher: Dispatcher, server_name: str) -> None:
        self.dispatcher = dispatcher
        self.server_name = server_name

    async def respond(
        self,
        request: JsonRpcRequest,
        *,
        own: Optional[Session] = None,
        session_id: Optional[str] = None,
        mcp_dialect: bool = False,
        seq: Any = None,
        principal: Principal = OPEN,
    ) -> Optional[JsonRpcResponse]:
        """The response to ``request`` (None for notifications). ``own``: the session of the
        connection it came through; ``session_id``: the session an MCP client's
        ``Mcp-Session-Id`` names (else ``params.session_id`` may name one); ``seq``: the call's
        number, where the connection numbers its calls (a tools call is then answered once)."""
        try:
            result = await self._method(request, own, session_id, mcp_dialect, seq, principal)
        except Exception as exc:
            return rpc_error(exc, request.id, f"MCP request {request.method} failed")
        if result is _NO_RESPONSE:
            return None
        return JsonRpcResponse.success(result, request.id)

    async def answer(
        self, message: Any, session: Session, seq: Any = None, principal: Principal = OPEN
    ) -> Optional[JsonRpcResponse]:
        """The response to one JSON-RPC message (a frame's text, or the ``data`` of a ``/ws``
        frame) that came through the socket owning ``session``; None for a notification."""
        request = parse_request(message)
        if isinstance(request, JsonRpcResponse):
            return request
        return await self.respond(request, own=session, seq=seq, principal=principal)

    # --- POST /mcp --------------------------------------------------------------------------

    async def serve_http(self, request: Request) -> Response:
        """``POST /mcp``: one request; an MCP client's session travels in ``Mcp-Session-Id``
        (made by ``initialize``), an OpenEnv client's in ``params.session_id`` (or none)."""
        rpc = parse_request(await request.body())
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
        headers: Dict[str, str] = {}
        create_key = request.headers.get(resume.CREATE_KEY_HEADER)
        principal = principal_of(request.scope)
        try:
            if principal.role is Role.AGENT:
                # a credential whose session ended is refused whatever it asks (initialize and ping
                # included: an agent learns at once that its episode is over)
                self.dispatcher.agent_session(principal)
            if principal.role is Role.AGENT and not header_session:
                # an agent's MCP session is the one its credential was minted for (another one its
                # params name is the dispatch's to refuse, not to be swapped for its own quietly)
                header_session = str(rpc.params.get("session_id") or principal.session_id)
                if rpc.method == "initialize":
                    headers["mcp-session-id"] = principal.session_id  # type: ignore[assignment]
            elif create_key and rpc.method == "openenv/session/create" and not header_session:
                # sent again after its answer was lost: the same session, not a second one
                session = await self.dispatcher.run(Call(Op.CREATE, create_key, principal=principal))
                return _rpc_reply(JsonRpcResponse.success({"session_id": session.id}, rpc.id))
            elif header_session:
                if principal.role not in (Role.AGENT, Role.GRADER):  # (theirs: decided in the dispatch)
                    self.dispatcher.session_named(header_session)  # an unknown one is answered 404 here
            elif rpc.method == "initialize" and principal.role is Role.ORCHESTRATOR:
                header_session = (await self.dispatcher.run(Call(Op.CREATE, principal=principal))).id
                headers["mcp-session-id"] = header_session
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
        response = await self.respond(rpc, session_id=header_session, mcp_dialect=mcp_dialect, principal=principal)
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
            await self.dispatcher.run(Call(Op.CLOSE, session_id, principal=principal_of(request.scope)))
        except OpenEnvError as exc:
            return Response(status_code=kind_of(exc).http_status)
        return Response(status_code=204)

    # --- methods ----------------------------------------------------------------------------

    async def _method(
        self,
        request: JsonRpcRequest,
        own: Optional[Session],
        session_id: Optional[str],
        mcp_dialect: bool,
        seq: Any,
        principal: Principal,
    ) -> Any:
        method, params = request.method, request.params
        if method == "tools/call":
            call = Call(
                Op.CALL_TOOL,
                _tool_call(params),
                session_id or params.get("session_id") or None,
                seq,
                principal=principal,
            )
            try:
                result = await self.dispatcher.run(call, own)
            except ToolCallFailed as failure:
                error = failure.error
                if mcp_dialect and error.error_type is not ToolErrorType.TOOL_NOT_FOUND:
                    return {"content": [{"type": "text", "text": error.message}], **_FAILED_TOOL}
                code = JsonRpcErrorCode.INVALID_PARAMS if mcp_dialect else JsonRpcErrorCode.INTERNAL_ERROR
                raise _RpcError(code, error.message, {"error_type": error.error_type.value}) from None
            if result.observation and mcp_dialect:
                return _as_mcp_result(result.value)
            return result.value
        if method == "tools/list":
            call = Call(Op.LIST_TOOLS, None, session_id or params.get("session_id") or None, seq, principal=principal)
            return {"tools": await self.dispatcher.run(call, own)}
        if method == "openenv/session/snapshot":
            call = Call(Op.SNAPSHOT, None, session_id or params.get("session_id") or None, seq, principal=principal)
            blob = await self.dispatcher.run(call, own)
            return {"snapshot": snapshot_text(blob), "bytes": len(blob)}
        if method == "openenv/session/restore":
            blob = snapshot_bytes(params.get("snapshot"))
            call = Call(Op.RESTORE, blob, session_id or params.get("session_id") or None, seq, principal=principal)
            return {"state": to_jsonable(await self.dispatcher.run(call, own))}
        if method == "openenv/session/grade":
            call = Call(Op.GRADE, None, session_id or params.get("session_id") or None, seq, principal=principal)
            return {"grade": await self.dispatcher.run(call, own)}
        if method == "openenv/session/trajectory":
            call = Call(Op.TRAJECTORY, None, session_id or params.get("session_id") or None, seq, principal=principal)
            return await self.dispatcher.run(call, own)
        if method == "openenv/session/diff":
            call = Call(Op.DIFF, None, session_id or params.get("session_id") or None, seq, principal=principal)
            return await self.dispatcher.run(call, own)
        if method == "openenv/metrics":
            return await self.dispatcher.run(Call(Op.METRICS, principal=principal), own)
        if method == "openenv/session/agent_token":
            call = Call(Op.MINT_AGENT, None, session_id or params.get("session_id") or None, seq, principal=principal)
            return await self.dispatcher.run(call, own)
        if method == "openenv/session/create":
            return {"session_id": (await self.dispatcher.run(Call(Op.CREATE, principal=principal), own)).id}
        if method == "openenv/session/close":
            target = params.get("session_id")
            if not target:
                raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "Invalid params - 'session_id' is required")
            return await self.dispatcher.run(Call(Op.CLOSE, str(target), principal=principal), own)
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


def _tool_call(params: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """``tools/call``'s tool name and arguments, checked."""
    name = params.get("name")
    if name is None or name == "":
        raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "Missing 'name' in params")
    if not isinstance(name, str):
        raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "'name' must be a string")
    arguments = {} if params.get("arguments") is None else params["arguments"]
    if not isinstance(arguments, dict):
        raise _RpcError(JsonRpcErrorCode.INVALID_PARAMS, "'arguments' must be an object")
    return name, arguments


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
