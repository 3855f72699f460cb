"""Server side of OpenEnv: the environment contract, wire models and the HTTP/WebSocket server.

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
