"""Types the client hands back to trainer code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Generic, Optional, TypeVar

ObsT = TypeVar("ObsT")


@dataclass
class StepResult(Generic[ObsT]):
    """What ``reset`` and ``step`` return: the observation, its reward and whether the episode ended."""

    observation: ObsT
    reward: Optional[float] = None
    done: bool = False
    metadata: Optional[Dict[str, Any]] = None
