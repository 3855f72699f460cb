"""Rubrics (RFC 004): reward functions built from named, inspectable parts.

A :class:`Rubric` scores ``(action, observation)``; containers combine rubrics
(:class:`Sequential`, :class:`Gate`, :class:`WeightedSum`) or just hold them
(:class:`RubricList`, :class:`RubricDict`); :class:`TrajectoryRubric` scores a whole episode
(delayed rewards) and :class:`LLMJudge` asks a language model. An environment sets
``self.rubric`` and calls ``self._apply_rubric(action, observation)`` in ``step``.
"""

from __future__ import annotations

from .base import HookHandle, Rubric
from .containers import Gate, RubricDict, RubricList, Sequential, WeightedSum
from .llm_judge import LLMJudge
from .trajectory import ExponentialDiscountingTrajectoryRubric, TrajectoryRubric

__all__ = [
    "ExponentialDiscountingTrajectoryRubric",
    "Gate",
    "HookHandle",
    "LLMJudge",
    "Rubric",
    "RubricDict",
    "RubricList",
    "Sequential",
    "TrajectoryRubric",
    "WeightedSum",
]
