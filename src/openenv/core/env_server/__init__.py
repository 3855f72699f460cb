"""Server side of OpenEnv: the environment contract, wire models and the HTTP/WebSocket server.

The modules and packages here, from the top down (each imports only what lies below it: the
layers of pyproject.toml). The module paths upstream OpenEnv has are API and stay where they are;
the rest is grouped by what it is.

* the app: :mod:`.http_server` (``create_app``, the HTTP routes), the playground :mod:`.web`,
  :mod:`.web_interface` and :mod:`.gradio_ui`; :mod:`.serving` runs it under uvicorn
  (``python -m openenv.core.env_server``, :mod:`.__main__`);
* :mod:`.transports` — the WebSocket routes and MCP's JSON-RPC, codecs around the dispatch;
* :mod:`.edges` — the ASGI middlewares in front of the routes, and the bearer token;
* :mod:`.dispatch` — the one dispatch every call goes through;
* :mod:`.sessions` — the sessions: one environment instance each, and the rules around them;
* :mod:`.mcp_environment` — environments whose actions are MCP tool calls;
* :mod:`._compat` — all that relies on other libraries' internals (or upstream's private names);
* what those share: the worker pool (:mod:`.workers`), resumable sessions (:mod:`.resume`, whose
  wire names the clients use too), the server's limits (:mod:`.limits`), WebSocket frames
  (:mod:`.ws_frames`), :mod:`.serialization`, :mod:`.settings` and :mod:`.error_details`;
* the contract and the models: :mod:`.interfaces`, :mod:`.types`, :mod:`.mcp_types`,
  :mod:`.exceptions`, :mod:`.base_transforms` and :mod:`.route_config`.

Names are imported on first use, so ``import openenv.core.env_server`` is cheap.
"""

from __future__ import annotations

from ..._lazy import lazy_exports

_TYPES = [
    "Action",
    "Observation",
    "State",
    "ResetRequest",
    "ResetResponse",
    "StepRequest",
    "StepResponse",
    "BaseMessage",
    "CodeExecResult",
    "EnvironmentMetadata",
    "SchemaResponse",
    "HealthResponse",
    "HealthStatus",
    "ServerMode",
    "WSErrorCode",
    "ListTasksRequest",
    "NumTasksRequest",
    "GetTaskRequest",
    "GetTaskRangeRequest",
    "ConcurrencyConfig",
    "ServerCapacityStatus",
    "SessionInfo",
    "WSResetMessage",
    "WSStepMessage",
    "WSStateMessage",
    "WSCloseMessage",
    "WSIncomingMessage",
    "WSObservationResponse",
    "WSStateResponse",
    "WSErrorResponse",
    "WSOutgoingMessage",
    "Scalar",
]
_MCP_TYPES = [
    "Tool",
    "ToolError",
    "ToolErrorType",
    "ListToolsAction",
    "CallToolAction",
    "ListToolsObservation",
    "CallToolObservation",
    "WSMCPMessage",
    "WSMCPResponse",
    "RESERVED_TOOL_NAMES",
    "JsonRpcErrorCode",
    "JsonRpcError",
    "JsonRpcRequest",
    "JsonRpcResponse",
    "McpMethod",
]
_EXPORTS = {name: ".types" for name in _TYPES}
_EXPORTS.update({name: ".mcp_types" for name in _MCP_TYPES})
_EXPORTS.update(
    {
        "Environment": ".interfaces",
        "EnvironmentHost": ".interfaces",
        "Transform": ".interfaces",
        "TaskProvider": ".interfaces",
        "Message": ".interfaces",
        "ModelTokenizer": ".interfaces",
        "CompositeTransform": ".base_transforms",
        "NullTransform": ".base_transforms",
        "OpenEnvError": ".exceptions",
        "ConcurrencyConfigurationError": ".exceptions",
        "SessionCapacityError": ".exceptions",
        "SessionNotFoundError": ".exceptions",
        "SessionCreationError": ".exceptions",
        "EnvironmentFactoryError": ".exceptions",
        "StepTimeoutError": ".exceptions",
        "WorkersStuckError": ".exceptions",
        "EnvironmentCallError": ".exceptions",
        "EnvironmentResultError": ".exceptions",
        "SnapshotUnsupportedError": ".exceptions",
        "deserialize_action": ".serialization",
        "deserialize_action_with_preprocessing": ".serialization",
        "serialize_observation": ".serialization",
        "HTTPEnvServer": ".http_server",
        "create_app": ".http_server",
        "create_fastapi_app": ".http_server",
        "SessionManager": ".sessions",
        "GetEndpointConfig": ".route_config",
        "MCPEnvironment": ".mcp_environment",
        "create_web_interface_app": ".http_server",
        "WebInterfaceManager": ".web_interface",
    }
)

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
