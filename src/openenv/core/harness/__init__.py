"""Agent harnesses: sessions for agents that run their own loop, and the token-capture proxy.

``openenv.core.harness.capture`` is the proxy that records the exact tokens an agent's model
calls saw and sampled; :class:`TrainingTrace` is what a trainer reads back. :class:`HarnessProcess`
runs an agent CLI, in the sandbox with the proxy as its only network.
"""

from __future__ import annotations

from openenv._lazy import lazy_exports

_EXPORTS = {
    "TrainingTrace": ".training",
    "TrainingTurn": ".training",
    "TraceEntry": ".training",
    "validate_training_turn": ".training",
    "HarnessProcess": ".process",
    "HarnessSandbox": ".process",
    "HarnessError": ".errors",
    "HarnessStartupError": ".errors",
    "HarnessNotRunningError": ".errors",
    "HarnessTurnTimeoutError": ".errors",
    "ToolResult": ".rollout",
    "VerifyResult": ".rollout",
    "RolloutEvent": ".rollout",
    "ToolTraceEntry": ".rollout",
    "ModelStepResult": ".rollout",
    "HarnessRolloutResult": ".rollout",
    "HarnessRunLimits": ".rollout",
    "Message": ".rollout",
    "RESERVED_TOOL_NAMES": ".rollout",
    "ModelStep": ".rollout",
    "LoopOwningSession": ".rollout",
    "TrainableSession": ".rollout",
    "ResourceSession": ".rollout",
    "ResourceSessionFactory": ".rollout",
    "StepEnvSessionAdapter": ".rollout",
    "SessionMCPBridge": ".rollout",
    "HarnessAdapter": ".rollout",
    "MCPHarnessAdapter": ".rollout",
    "CLIHarnessAdapter": ".rollout",
    "build_harness_rollout_func": ".rollout",
    "_resolve_env_reward": ".rollout",
    "resolve_tool_conflicts": ".tools",
    "HarnessConfig": ".config",
    "HarnessTransport": ".config",
    "HarnessEvent": ".events",
    "HarnessEventType": ".events",
    "HarnessResponse": ".events",
    "HarnessClientMessage": ".events",
    "HarnessProtocolError": ".events",
    "events_to_metadata": ".events",
    "AgenticHarnessAdapter": ".adapter",
    "HarnessMCPBridge": ".bridge",
    "build_bridge_server": ".bridge",
    "HarnessEnvironment": ".environment",
    "HarnessAction": ".environment",
    "JsonLinesHarnessAdapter": ".agentic_adapters",
    "ClaudeCodeHarnessAdapter": ".agentic_adapters",
    "CapturedAgentSession": ".captured",
    "CapturedAgentSessionFactory": ".captured",
    "AgentCLIRunner": ".cli_runner",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(name for name in _EXPORTS if not name.startswith("_"))
