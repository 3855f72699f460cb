"""What an evaluation was asked to do, and what it found: :class:`EvalConfig`, :class:`EvalResult`.

Both are strict records (unknown fields are refused, assignments are validated), so a config
written by one run can be read back, compared and re-run, here or on upstream OpenEnv 0.10.
"""

from __future__ import annotations

from typing import Any, Dict

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EvalConfig", "EvalResult"]


class EvalConfig(BaseModel):
    """One evaluation, fully described: which harness at which version, on which dataset, how.

    Every field is required. ``library_versions`` and ``harness_version`` are recorded so that
    a result can be traced to the software that produced it; harnesses are not asked to
    enforce them. ``eval_parameters`` is the harness's own vocabulary (for
    :class:`~openenv.core.evals.InspectAIHarness`: ``model``, ``task``, ``task_args``, ...).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    harness_name: str = Field(description="The harness that runs the evaluation, e.g. 'InspectAIHarness'.")
    harness_version: str = Field(description="The harness's version, e.g. the inspect-ai release.")
    library_versions: Dict[str, str] = Field(description="Other libraries that matter, by name.")
    dataset: str = Field(description="What is evaluated on: a task name, a file, a dataset id.")
    eval_parameters: Dict[str, Any] = Field(description="Everything else the harness needs.")


class EvalResult(BaseModel):
    """The scores one run of an :class:`EvalConfig` produced, beside that config."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    config: EvalConfig
    scores: Dict[str, Any]
