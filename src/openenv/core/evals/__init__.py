"""Evaluations (upstream's ``openenv.core.evals``): a harness runs an :class:`EvalConfig` and
returns an :class:`EvalResult`.

* :class:`EvalHarness` — the abstract harness: ``run(...)`` and ``run_from_config(config)``.
* :class:`InspectAIHarness` — runs an Inspect AI evaluation (extra ``openenv[evals]``; Inspect AI
  is imported only when an evaluation runs).
"""

from __future__ import annotations

from .base import EvalHarness
from .inspect_harness import InspectAIHarness
from .types import EvalConfig, EvalResult

__all__ = ["EvalConfig", "EvalHarness", "EvalResult", "InspectAIHarness"]
