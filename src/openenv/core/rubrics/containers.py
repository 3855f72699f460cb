"""Rubrics made of rubrics: ``Sequential``, ``Gate``, ``WeightedSum``, ``RubricList``, ``RubricDict``."""

from __future__ import annotations

import asyncio
import inspect
import math
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from .base import Rubric, Score, pending

_AGGREGATES = ("last", "min", "mean", "sum", "product")


class Sequential(Rubric):
    """Children scored in order, stopping at the first that fails.

    The short-circuit rule: a child *fails* when its score is exactly ``0.0`` (the default, as
    upstream OpenEnv), or, with ``stop_below=t``, when its score is below ``t`` (so ``-1`` stops
    the chain, and with ``t=0.5`` so does ``0.3``). The failing child's own score is returned and
    the children after it are not called. When no child fails the result is ``aggregate`` of all
    the scores: ``"last"`` (the default, as upstream), ``"min"``, ``"mean"``, ``"sum"`` or
    ``"product"``. With no children the score is ``1.0``.

    Children are called one after another, async ones awaited in turn. A call returns a coroutine
    only when a child does; otherwise a :class:`~.base.Score`, a float that can also be awaited,
    so ``await sequential(...)`` (how code written for upstream, whose ``Sequential`` returns a
    coroutine inside a running loop, calls it) and plain use both work. Children are named
    ``rubric_0``, ``rubric_1``, ...; ``len`` and indexing work.
    """

    def __init__(self, *rubrics: Rubric, stop_below: Optional[float] = None, aggregate: str = "last") -> None:
        super().__init__()
        if aggregate not in _AGGREGATES:
            raise ValueError(f"aggregate must be one of {', '.join(_AGGREGATES)}, got {aggregate!r}")
        self.stop_below = stop_below
        self.aggregate = aggregate
        self._order: List[str] = []
        for i, rubric in enumerate(rubrics):
            _check_rubric(rubric, f"Sequential child {i}")
            setattr(self, f"rubric_{i}", rubric)
            self._order.append(f"rubric_{i}")

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, index: int) -> Rubric:
        return self._children[self._order[index]]

    def __iter__(self) -> Iterator[Rubric]:
        return (self._children[name] for name in self._order)

    def _fails(self, score: float) -> bool:
        return score < self.stop_below if self.stop_below is not None else score == 0.0

    def _combine(self, scores: List[float]) -> float:
        if not scores:
            return 1.0
        if self.aggregate == "last":
            return scores[-1]
        if self.aggregate == "min":
            return min(scores)
        if self.aggregate == "mean":
            return sum(scores) / len(scores)
        if self.aggregate == "sum":
            return sum(scores)
        return math.prod(scores)

    def __call__(self, action: Any, observation: Any) -> Any:
        score = super().__call__(action, observation)
        return score if pending(score) else Score(score)

    def forward(self, action: Any, observation: Any) -> Any:
        children = list(self)
        scores: List[float] = []
        for i, child in enumerate(children):
            score = child(action, observation)
            if pending(score):
                return self._finish_async(action, observation, score, children[i + 1 :], scores)
            if self._fails(score):
                return score
            scores.append(score)
        return self._combine(scores)

    async def _finish_async(
        self, action: Any, observation: Any, started: Any, rest: List[Rubric], scores: List[float]
    ) -> float:
        score = await started
        if self._fails(score):
            return score
        scores.append(score)
        for child in rest:
            score = child(action, observation)
            if pending(score):
                score = await score
            if self._fails(score):
                return score
            scores.append(score)
        return self._combine(scores)

    def state_dict(self) -> Dict[str, Any]:
        return {"stop_below": self.stop_below, "aggregate": self.aggregate, **super().state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.stop_below = state.get("stop_below", self.stop_below)
        self.aggregate = state.get("aggregate", self.aggregate)
        super().load_state_dict(state)


class Gate(Rubric):
    """The child's score when it reaches ``threshold``, else 0.0 (an all-or-nothing requirement)."""

    def __init__(self, rubric: Rubric, threshold: float = 1.0) -> None:
        super().__init__()
        _check_rubric(rubric, "Gate's rubric")
        self.rubric = rubric
        self.threshold = threshold

    def forward(self, action: Any, observation: Any) -> Any:
        score = self.rubric(action, observation)
        if pending(score):
            return self._gate_async(score)
        return score if score >= self.threshold else 0.0

    async def _gate_async(self, started: Any) -> float:
        score = await started
        return score if score >= self.threshold else 0.0

    def state_dict(self) -> Dict[str, Any]:
        return {"threshold": self.threshold, **super().state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.threshold = state.get("threshold", self.threshold)
        super().load_state_dict(state)


class WeightedSum(Rubric):
    """``sum(weight * child score)``; async children run concurrently.

    By default (``normalized=True``) the weights must sum to 1 within 1e-6, so the result is a
    weighted average, as upstream requires; other weights raise ``ValueError`` (they are never
    silently rescaled). Pass ``normalized=False`` to allow any finite weights, negative ones
    included (penalty terms). Children are named ``rubric_0``, ``rubric_1``, ...
    """

    def __init__(self, rubrics: Sequence[Rubric], weights: Sequence[float], *, normalized: bool = True) -> None:
        super().__init__()
        rubrics, weights = list(rubrics), [float(w) for w in weights]
        _check_weights(len(rubrics), weights, normalized)
        self._weights = weights
        self.normalized = normalized
        self._order: List[str] = []
        for i, rubric in enumerate(rubrics):
            _check_rubric(rubric, f"WeightedSum child {i}")
            setattr(self, f"rubric_{i}", rubric)
            self._order.append(f"rubric_{i}")

    @property
    def weights(self) -> List[float]:
        """A copy of the weights."""
        return list(self._weights)

    def forward(self, action: Any, observation: Any) -> Any:
        scores: List[Any] = []
        try:
            for name in self._order:
                scores.append(self._children[name](action, observation))
        except BaseException:
            for started in scores:  # a later child failed: do not leave coroutines un-awaited
                if inspect.iscoroutine(started):
                    started.close()
            raise
        if any(pending(s) for s in scores):
            return self._sum_async(scores)
        return sum(w * s for w, s in zip(self._weights, scores, strict=True))

    async def _sum_async(self, scores: List[Any]) -> float:
        async def value(score: Any) -> float:
            return await score if pending(score) else score

        done = await asyncio.gather(*(value(s) for s in scores))
        return sum(w * s for w, s in zip(self._weights, done, strict=True))

    def state_dict(self) -> Dict[str, Any]:
        return {"weights": self.weights, "normalized": self.normalized, **super().state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        weights = [float(w) for w in state.get("weights", self._weights)]
        normalized = bool(state.get("normalized", self.normalized))
        _check_weights(len(self._order), weights, normalized)
        self._weights, self.normalized = weights, normalized
        super().load_state_dict(state)


class RubricList(Rubric):
    """An ordered holder of rubrics (not a rubric you call: combine them yourself)."""

    def __init__(self, rubrics: Optional[Iterable[Rubric]] = None) -> None:
        super().__init__()
        self._items: List[Rubric] = []
        self.extend(rubrics or [])

    def append(self, rubric: Rubric) -> None:
        _check_rubric(rubric, "RubricList item")
        setattr(self, str(len(self._items)), rubric)
        self._items.append(rubric)

    def extend(self, rubrics: Iterable[Rubric]) -> None:
        for rubric in rubrics:
            self.append(rubric)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> Rubric:
        return self._items[index]

    def __iter__(self) -> Iterator[Rubric]:
        return iter(list(self._items))

    def forward(self, action: Any, observation: Any) -> Any:
        raise NotImplementedError("RubricList only holds rubrics; call its items (or use Sequential/WeightedSum)")


class RubricDict(Rubric):
    """Rubrics by name (not a rubric you call: combine them yourself)."""

    def __init__(self, rubrics: Optional[Mapping[str, Rubric]] = None) -> None:
        super().__init__()
        self.update(rubrics or {})

    def __getitem__(self, key: str) -> Rubric:
        return self._children[key]

    def __setitem__(self, key: str, rubric: Rubric) -> None:
        _check_rubric(rubric, f"RubricDict[{key!r}]")
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("_"):
            raise ValueError(
                f"RubricDict keys must be identifiers not starting with '_' (they become dotted names), got {key!r}"
            )
        if key not in self._children and (hasattr(type(self), key) or key in self.__dict__):
            raise ValueError(f"RubricDict key {key!r} would hide the attribute {type(self).__name__}.{key}")
        setattr(self, key, rubric)

    def __contains__(self, key: object) -> bool:
        return key in self._children

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._children))

    def keys(self) -> List[str]:
        return list(self._children)

    def values(self) -> List[Rubric]:
        return list(self._children.values())

    def items(self) -> List[Tuple[str, Rubric]]:
        return list(self._children.items())

    def update(self, rubrics: Mapping[str, Rubric]) -> None:
        for key, rubric in rubrics.items():
            self[key] = rubric

    def forward(self, action: Any, observation: Any) -> Any:
        raise NotImplementedError("RubricDict only holds rubrics; call its items (or use Sequential/WeightedSum)")


def _check_weights(count: int, weights: List[float], normalized: bool) -> None:
    if count != len(weights):
        raise ValueError(
            f"WeightedSum's rubrics and weights must match in number: {count} rubrics but {len(weights)} weights"
        )
    if any(not math.isfinite(w) for w in weights):
        raise ValueError(f"WeightedSum weights must be finite numbers, got {weights}")
    if normalized and count and abs(sum(weights) - 1.0) > 1e-6:
        raise ValueError(
            f"WeightedSum weights must sum to 1.0 (they sum to {sum(weights):g}): fix the weights, or pass "
            "normalized=False to allow any weights (penalty terms with negative weights included)"
        )


def _check_rubric(value: Any, what: str) -> None:
    if not isinstance(value, Rubric):
        raise TypeError(f"{what} must be a Rubric, got {type(value).__name__}")
