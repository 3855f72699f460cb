"""OpenEnv core: the environment contract, the server and the clients.

Every name is imported on first use, so ``import openenv.core`` costs next to nothing.
"""

from __future__ import annotations

from .._lazy import lazy_exports
from .env_server import __all__ as _server_names

_EXPORTS = {name: ".env_server" for name in _server_names}
_EXPORTS.update(
    {
        "EnvClient": ".env_client",
        "SyncEnvClient": ".sync_client",
        "GenericEnvClient": ".generic_client",
        "GenericAction": ".generic_client",
        "MCPClientBase": ".mcp_client",
        "MCPToolClient": ".mcp_client",
        "GenericMCPObservation": ".mcp_client",
        "StepResult": ".client_types",
        "Snapshot": ".client_types",
        "SnapshotRefusedError": ".client_errors",
        "ServerError": ".client_errors",
        "AuthenticationError": ".client_errors",
        "SessionLostError": ".client_errors",
        "ServerStoppedError": ".client_errors",
        "ToolCallError": ".client_errors",
        "LLMClient": ".llm_client",
        "LLMResponse": ".llm_client",
        "LLMError": ".llm_client",
        "OpenAIClient": ".llm_client",
        "AnthropicClient": ".llm_client",
        "ToolCall": ".llm_client",
        "create_llm_client": ".llm_client",
        "check_env": ".checks",
        "check_package": ".checks",
        "check_url": ".checks",
        "CheckReport": ".checks",
        "EnvCheckError": ".checks",
        "EnvCheckWarning": ".checks",
    }
)

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
