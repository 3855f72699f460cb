"""The training contract a captured rollout is exported under (upstream's module name).

One place to import what a trainer relies on: :class:`TrainingTrace` / :class:`TrainingTurn`
(strict, validated), :class:`TraceEntry` (the dict form), :func:`validate_training_turn` (the
rules), the schema version, and the field names a trace entry carries.
"""

from __future__ import annotations

from typing import FrozenSet

from openenv.core.harness.training import TraceEntry, TrainingTrace, TrainingTurn, validate_training_turn

__all__ = [
    "SCHEMA_VERSION",
    "TRACE_ENTRY_FIELDS",
    "TraceEntry",
    "TrainingTrace",
    "TrainingTurn",
    "validate_training_turn",
]

SCHEMA_VERSION = 1
TRACE_ENTRY_FIELDS: FrozenSet[str] = frozenset(TraceEntry.__annotations__)
