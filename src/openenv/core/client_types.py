"""Types of the clients: what they hand back to trainer code (:class:`StepResult`) and how one is
driven (:class:`Usage`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, Generic, Optional, TypeVar

ObsT = TypeVar("ObsT")


@dataclass
class StepResult(Generic[ObsT]):
    """What ``reset`` and ``step`` return: the observation, its reward and whether the episode ended."""

    observation: ObsT
    reward: Optional[float] = None
    done: bool = False
    metadata: Optional[Dict[str, Any]] = None


class Usage(str, Enum):
    """How a client is driven: decided by its first use (or ``async with`` / ``.sync()``), then
    fixed; ``EnvClient._claim`` is the one move, from UNDECIDED."""

    UNDECIDED = "undecided"
    ASYNC = "async"
    SYNC = "sync"


__all__ = ["StepResult", "Usage"]
