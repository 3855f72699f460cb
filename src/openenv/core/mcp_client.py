"""Clients of MCP environments: tools are listed and called by name.

``MCPToolClient`` keeps OpenEnv 0.10's production handshake: it creates the session over HTTP
(``POST /mcp`` ``openenv/session/create``) and attaches its WebSocket to it
(``/ws?session_id=...``), so reset/step/state and tool calls act on one environment instance.
Tool listings and calls travel as ``{"type": "mcp"}`` frames on that WebSocket: they reach the
tools directly, as upstream's HTTP ``tools/list`` / ``tools/call`` do, and are no steps of the
episode (no reward, not counted). With ``use_production_mode = False`` (upstream's switch, set
on the client before it connects) the client opens a plain ``/ws`` session instead and sends
``list_tools()`` and ``call_tool()`` through ``step`` (``ListToolsAction`` / ``CallToolAction``):
each is then a step, rewarded and counted as the environment says.

As upstream's, MCP clients speak only ``production`` mode: asking one for ``simulation`` is a
``ValueError`` (a ``GenericEnvClient``, or any ``EnvClient``, drives an environment in simulation
mode).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from typing import Any, Dict, List, Optional, Set

from pydantic import ConfigDict

from .client_errors import (
    CapacityReachedError,
    SessionError,
    ToolCallError,
    connect_failure,
    permanent_connect_failure,
)
from .client_types import StepResult
from .env_client import EnvClient
from .env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
    tool_result_value,
)
from .env_server.resume import CREATE_KEY_HEADER
from .env_server.types import Observation, State
from .utils import Endpoint, check_unix_socket

_CLOSE_RPC_TIMEOUT_S = 5.0


"""Seconds a session-close request may take (the server answers at once; a hung one is let go)."""

logger = logging.getLogger("openenv.client")


class GenericMCPObservation(Observation):
    """An observation of an MCP environment that is neither a tool listing nor a tool result."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, arbitrary_types_allowed=True)


def _parse_tool(entry: Dict[str, Any]) -> Tool:
    return Tool(
        name=entry["name"],
        description=entry.get("description") or "",
        input_schema=entry.get("input_schema") or entry.get("inputSchema") or {},
    )


class MCPClientBase(EnvClient[Any, Observation, State]):
    """Base of MCP environment clients (see the module docstring).

    The arguments are :class:`~openenv.core.env_client.EnvClient`'s, except ``mode``: MCP clients
    speak only ``"production"`` (the default, whatever ``OPENENV_CLIENT_MODE`` says; the value is
    not case-sensitive); ``"simulation"`` or any other value is a ``ValueError`` that points to
    ``GenericEnvClient``.

    ``use_production_mode`` (a plain attribute, ``True`` as in OpenEnv 0.10) says how tools are
    reached: ``True``, directly, on the session created over HTTP; ``False``, through ``step``
    on a session of the client's own WebSocket. Change it before the client connects.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        websocket_ping_interval_s: Optional[float] = 20.0,
        websocket_ping_timeout_s: Optional[float] = 20.0,
        provider: Any = None,
        mode: Optional[str] = None,
        max_message_size_mb: float = 100.0,
        headers: Optional[Dict[str, str]] = None,
        reconnect_timeout_s: float = 30.0,
    ) -> None:
        if mode is not None and str(mode).lower() != "production":
            raise ValueError(
                f"{type(self).__name__} only supports 'production' mode, got {mode!r}: leave mode unset, "
                "or use GenericEnvClient (or another EnvClient) for simulation mode"
            )
        super().__init__(
            base_url=base_url,
            connect_timeout_s=connect_timeout_s,
            message_timeout_s=message_timeout_s,
            max_message_size_mb=max_message_size_mb,
            websocket_ping_interval_s=websocket_ping_interval_s,
            websocket_ping_timeout_s=websocket_ping_timeout_s,
            provider=provider,
            mode=mode or "production",
            headers=headers,
            reconnect_timeout_s=reconnect_timeout_s,
        )
        self._tools_cache: Optional[List[Tool]] = None
        self.use_production_mode: bool = self._mode == "production"
        """Reach tools directly on an HTTP-created session (True), or through ``step`` (False)."""
        self._production_session_id: Optional[str] = None
        self._closing: Set[asyncio.Task] = set()  # background closes of lost sessions
        self._http: Any = None
        self._rpc_ids = itertools.count(1)

    @property
    def session_id(self) -> Optional[str]:
        """The server session this client drives, once connected."""
        return self._production_session_id

    # --- session handshake --------------------------------------------------------------------

    def _http_client(self, endpoint: Endpoint) -> Any:
        if self._http is None:
            import httpx

            if endpoint.uds:
                check_unix_socket(endpoint.uds)
            transport = httpx.AsyncHTTPTransport(uds=endpoint.uds) if endpoint.uds else None
            self._http = httpx.AsyncClient(
                base_url=endpoint.http_url,
                headers=self._headers or None,
                timeout=httpx.Timeout(self._message_timeout_s, connect=self._connect_timeout_s),
                transport=transport,
                trust_env=not endpoint.is_loopback,
            )
        return self._http

    async def _http_rpc(
        self,
        endpoint: Endpoint,
        method: str,
        params: Dict[str, Any],
        timeout_s: Optional[float] = None,
        retry_for_s: float = 0.0,
        headers: Optional[Dict[str, str]] = None,
    ) -> Dict[str, Any]:
        """One JSON-RPC call over HTTP; a call that does no harm run twice (a close, a create with
        a create key) may be tried again, with backoff, for ``retry_for_s`` while its connection
        fails after connecting."""
        import httpx

        payload = {"jsonrpc": "2.0", "method": method, "params": params, "id": next(self._rpc_ids)}
        options: Dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        if headers:
            options["headers"] = headers
        deadline = time.monotonic() + retry_for_s
        delay = 0.02
        while True:
            try:
                response = await self._http_client(endpoint).post("/mcp", json=payload, **options)
                break
            except httpx.TransportError as exc:
                # (no server, no such host, a TLS mismatch: another try would fail the same way)
                if permanent_connect_failure(exc) or time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)
        response.raise_for_status()
        return response.json()

    async def _before_connect(self, endpoint: Endpoint) -> None:
        if self._production_session_id is not None or not self.use_production_mode:
            return  # (without production mode the WebSocket makes a session of its own)
        try:
            # With a key of its own, a create whose answer was lost is sent again: our server answers
            # the session the first one made (an upstream server ignores the header).
            key = {CREATE_KEY_HEADER: secrets.token_urlsafe(24)} if self._reconnect_timeout_s else None
            body = await self._http_rpc(
                endpoint, "openenv/session/create", {}, retry_for_s=self._reconnect_timeout_s, headers=key
            )
        except Exception as exc:
            raise connect_failure(
                exc, f"{endpoint.http_url}/mcp", endpoint.uds, "Could not create an MCP session"
            ) from exc
        error = body.get("error")
        if error:
            data = dict(error["data"]) if isinstance(error.get("data"), dict) else {}
            code = data.pop("code", None)  # the server's /ws code for the error (older servers: none)
            capacity = code == CapacityReachedError.code or (code is None and "max_sessions" in data)
            cls = CapacityReachedError if capacity else SessionError
            raise cls(f"Failed to create MCP session: {error.get('message')}", cls.code, data)
        self._production_session_id = body["result"]["session_id"]

    def _ws_path(self) -> str:
        if self._production_session_id:
            return f"/ws?session_id={self._production_session_id}"
        return "/ws"

    def _lose_session(self) -> None:
        session_id, endpoint = self._production_session_id, self._endpoint
        super()._lose_session()
        self._forget_production_session()
        if session_id is not None and endpoint is not None:
            # Ask the server to close it (once its socket is gone), so that it does not hold a slot
            # until its idle limit passes; best effort, in the background.
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            task = loop.create_task(self._close_production_session(endpoint, session_id))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_production_session(self, endpoint: Endpoint, session_id: str) -> None:
        try:
            await self._http_rpc(
                endpoint,
                "openenv/session/close",
                {"session_id": session_id},
                timeout_s=_CLOSE_RPC_TIMEOUT_S,
                retry_for_s=_CLOSE_RPC_TIMEOUT_S if self._reconnect_timeout_s else 0.0,
            )
        except Exception:
            logger.debug("closing MCP session %s failed", session_id, exc_info=True)

    def _forget_production_session(self) -> None:
        """Drop the HTTP-created session id."""
        self._production_session_id = None
        self._tools_cache = None

    async def _release(self) -> None:
        session_id, endpoint = self._production_session_id, self._endpoint
        await self._close_socket()
        if session_id is not None and endpoint is not None:
            await self._close_production_session(endpoint, session_id)
        self._forget_production_session()
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=_CLOSE_RPC_TIMEOUT_S)
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()
        await super()._release()

    # --- tools ----------------------------------------------------------------------------------

    async def _rpc(self, method: str, params: Dict[str, Any]) -> Dict[str, Any]:
        """One JSON-RPC request on the session's WebSocket; returns the JSON-RPC response."""
        frame = {
            "type": "mcp",
            "data": {"jsonrpc": "2.0", "method": method, "params": params, "id": next(self._rpc_ids)},
        }
        response = await self._request(frame)
        return response.get("data") or {}

    async def _list_tools_async(self, use_cache: bool = True) -> List[Tool]:
        if use_cache and self._tools_cache is not None:
            return list(self._tools_cache)
        if not self.use_production_mode:
            step = await self._step_async(ListToolsAction())
            if not isinstance(step.observation, ListToolsObservation):
                raise RuntimeError(f"Listing tools failed: the server answered a {type(step.observation).__name__}")
            error = step.observation.metadata.get("error")
            if error and not step.observation.tools:
                raise RuntimeError(f"Listing tools failed: {error}")
            self._tools_cache = list(step.observation.tools)
            return list(self._tools_cache)
        response = await self._rpc("tools/list", {})
        if response.get("error"):
            raise RuntimeError(f"Listing tools failed: {response['error'].get('message')}")
        tools = [_parse_tool(t) for t in (response.get("result") or {}).get("tools", [])]
        self._tools_cache = tools
        return list(tools)

    def list_tools(self, use_cache: bool = True) -> Any:
        """The environment's tools (cached after the first call unless ``use_cache=False``)."""
        return self._dispatch(self._list_tools_async, use_cache)

    async def _get_tool_async(self, name: str) -> Optional[Tool]:
        for tool in await self._list_tools_async():
            if tool.name == name:
                return tool
        return None

    def get_tool(self, name: str) -> Any:
        return self._dispatch(self._get_tool_async, name)

    async def _has_tool_async(self, name: str) -> bool:
        return await self._get_tool_async(name) is not None

    def has_tool(self, name: str) -> Any:
        return self._dispatch(self._has_tool_async, name)

    # --- step payloads and parsing ----------------------------------------------------------------

    def _step_payload(self, action: Any) -> Dict[str, Any]:
        if isinstance(action, ListToolsAction):
            return {"type": "list_tools"}
        if isinstance(action, CallToolAction):
            return {"type": "call_tool", "tool_name": action.tool_name, "arguments": action.arguments}
        model_dump = getattr(action, "model_dump", None)
        if callable(model_dump):
            return model_dump()
        if isinstance(action, dict):
            return dict(action)
        return {"action": str(action)}

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[Observation]:
        data = dict(payload.get("observation") or {})
        common = {
            "done": payload.get("done", data.pop("done", False)),
            "reward": payload.get("reward", data.pop("reward", None)),
        }
        metadata = data.pop("metadata", None) or {}
        observation: Observation
        if "tools" in data:
            observation = ListToolsObservation(
                tools=[_parse_tool(t) for t in data["tools"]], metadata=metadata, **common
            )
        elif "tool_name" in data:
            error = data.get("error")
            observation = CallToolObservation(
                tool_name=data["tool_name"],
                result=tool_result_value(data.get("result")),
                error=ToolError(**error) if isinstance(error, dict) else None,
                metadata=metadata,
                **common,
            )
        else:
            observation = GenericMCPObservation(metadata=metadata, **data, **common)
        return StepResult(
            observation=observation,
            reward=common["reward"],
            done=bool(common["done"]),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: Dict[str, Any]) -> State:
        return State(**payload)


class MCPToolClient(MCPClientBase):
    """An MCP environment client with ``call_tool(name, **arguments)``."""

    async def _call_tool_async(self, name: str, /, **arguments: Any) -> Any:
        if not self.use_production_mode:
            step = await self._step_async(CallToolAction(tool_name=name, arguments=arguments))
            observation = step.observation
            if not isinstance(observation, CallToolObservation):
                return observation
            if observation.error is not None:
                error = observation.error
                raise ToolCallError(name, f"{error.message} (type: {error.error_type.value})", data=error.model_dump())
            return observation.result
        response = await self._rpc("tools/call", {"name": name, "arguments": arguments})
        error = response.get("error")
        if error:
            raise ToolCallError(name, str(error.get("message")), error.get("code"), error.get("data"))
        result = response.get("result")
        if isinstance(result, dict) and (result.get("isError") or result.get("is_error")):
            texts = {"content": result.get("content") or [], "is_error": True}  # the error's words only
            raise ToolCallError(name, str(tool_result_value(texts)))
        return tool_result_value(result)

    def call_tool(self, name: str, /, **arguments: Any) -> Any:
        """Call a tool and return its value; a failing tool raises :class:`ToolCallError`. With
        ``use_production_mode = False`` the call is a step of the episode (see the module docstring)."""
        return self._dispatch(self._call_tool_async, name, **arguments)
