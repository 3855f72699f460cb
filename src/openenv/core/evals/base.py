"""The contract every evaluation harness fills: :class:`EvalHarness`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict

from .types import EvalConfig, EvalResult

__all__ = ["EvalHarness"]


class EvalHarness(ABC):
    """Runs one evaluation and returns its scores.

    A subclass implements :meth:`run`; :meth:`run_from_config` runs an :class:`EvalConfig` and
    pairs the scores with that very config object in an :class:`EvalResult`. The class cannot
    be instantiated itself (``TypeError``).
    """

    @property
    def name(self) -> str:
        """The harness's name: its class name (what ``EvalConfig.harness_name`` usually holds)."""
        return type(self).__name__

    @abstractmethod
    def run(
        self,
        harness_version: str,
        library_versions: Dict[str, str],
        dataset: str,
        eval_parameters: Dict[str, Any],
    ) -> Dict[str, Any]:
        """Run the evaluation of ``dataset`` with ``eval_parameters``; return scores by name.

        Raises when the evaluation cannot run or does not finish; a partial run is never
        reported as scores.
        """

    def run_from_config(self, config: EvalConfig) -> EvalResult:
        """Run ``config`` (its fields passed to :meth:`run` by keyword) and return the result.

        The result holds ``config`` itself, not a copy.
        """
        scores = self.run(
            harness_version=config.harness_version,
            library_versions=config.library_versions,
            dataset=config.dataset,
            eval_parameters=config.eval_parameters,
        )
        return EvalResult(config=config, scores=scores)
