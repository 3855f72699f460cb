"""Ready-made transforms."""

from __future__ import annotations

from typing import Iterable

from .interfaces import Transform
from .types import Observation


class CompositeTransform(Transform):
    """Applies several transforms in order."""

    def __init__(self, transforms: Iterable[Transform]) -> None:
        self.transforms = list(transforms)

    def __call__(self, observation: Observation) -> Observation:
        for transform in self.transforms:
            observation = transform(observation)
        return observation


class NullTransform(Transform):
    """Returns the observation unchanged."""

    def __call__(self, observation: Observation) -> Observation:
        return observation
