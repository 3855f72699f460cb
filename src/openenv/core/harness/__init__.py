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
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(name for name in _EXPORTS if not name.startswith("_"))
