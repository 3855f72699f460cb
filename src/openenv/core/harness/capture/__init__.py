"""The token-capture proxy between agent harnesses and an inference engine.

An agent is pointed at :class:`CaptureServer` with a base URL and a key (the rollout's session
id); the proxy asks the engine for its own token ids and logprobs, journals every answered turn
and links turns into a :class:`RolloutGraph` by exact token prefix. A trainer reads the rollout
back as a :class:`~openenv.core.harness.training.TrainingTrace` (``to_training_trace``) or as
upstream's trace entries. See docs/harness.md.
"""

from __future__ import annotations

from openenv._lazy import lazy_exports

_EXPORTS = {
    "CaptureServer": ".runner",
    "CaptureLimits": ".settings",
    "create_app": ".server",
    "to_training_trace": ".export",
    "to_trace_entries": ".export",
    "to_turn_records": ".export",
    "export_session": ".export",
    "measure_retokenization_skew": ".export",
    "APIType": ".dialects",
    "detect": ".dialects",
    "RolloutGraph": ".graph",
    "TurnNode": ".graph",
    "InferenceClient": ".inference",
    "UpstreamError": ".inference",
    "UpstreamHTTPError": ".inference",
    "UpstreamTimeoutError": ".inference",
    "UpstreamTransportError": ".inference",
    "UpstreamRequestError": ".inference",
    "ProviderConversionError": ".inference",
    "LLMReport": ".inference",
    "validate_llm": ".inference",
    "require_llm": ".inference",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
