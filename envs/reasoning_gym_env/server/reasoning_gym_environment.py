"""reasoning_gym_env: one question from a reasoning-gym dataset per episode, scored by the dataset.

``reset(dataset_name=..., dataset_config=..., seed=..., size=...)`` builds a dataset with
``reasoning_gym.create_dataset`` and shows its first question; ``dataset_name="composite"`` with
``dataset_specs=[{"name", "weight", "config"}, ...]`` mixes several. A ``reset()`` without any of
those options shows the dataset's next question (wrapping around after ``size``). The first reset
of a session defaults to ``leg_counting``, seed 42, size 1000.

``step(ReasoningGymAction(answer=...))`` scores the answer with the dataset's own
``score_answer``; the reward is that score (1.0 correct, 0.0 wrong, partial credit where the
dataset gives it) and the episode is done.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Optional, Tuple
from uuid import uuid4

import reasoning_gym
from reasoning_gym.composite import DatasetSpec
from reasoning_gym.factory import DATASETS

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

try:
    from ..models import ReasoningGymAction, ReasoningGymObservation, ReasoningGymState
except ImportError:  # served from the package directory as `server.app:app`
    from models import ReasoningGymAction, ReasoningGymObservation, ReasoningGymState  # type: ignore[no-redef]

DEFAULT_DATASET = "leg_counting"
DEFAULT_SEED = 42
DEFAULT_SIZE = 1000
MAX_SIZE = 1_000_000


class DatasetError(ValueError):
    """The requested dataset cannot be built; the message says why and what to pass instead."""


def dataset_names() -> List[str]:
    """Every dataset name reasoning-gym registers (``composite`` included)."""
    return sorted(DATASETS)


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (tuples become lists, anything else exotic a string)."""
    return json.loads(json.dumps(value, default=str))


def build_dataset(
    name: str, config: Dict[str, Any], specs: Optional[List[Dict[str, Any]]], seed: int, size: int
) -> Any:
    """``reasoning_gym.create_dataset`` with every way it can fail turned into a DatasetError."""
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}: choose one of {', '.join(dataset_names())}")
    if not isinstance(config, dict):
        raise DatasetError(f"dataset_config must be an object of {name}'s options, not {type(config).__name__}")
    if not isinstance(size, int) or not 1 <= size <= MAX_SIZE:
        raise DatasetError(f"size must be an integer from 1 to {MAX_SIZE}, not {size!r}")
    if name == "composite":
        if not specs:
            raise DatasetError(
                'the composite dataset needs dataset_specs=[{"name": ..., "weight": ..., "config": {...}}]'
            )
        try:
            parsed = [
                DatasetSpec(name=s["name"], weight=float(s.get("weight", 1.0)), config=dict(s.get("config") or {}))
                for s in specs
            ]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DatasetError(
                f'each dataset spec needs a "name" (and may have "weight" and "config"): {exc}'
            ) from None
        for spec in parsed:
            if spec.name not in DATASETS or spec.name == "composite":
                raise DatasetError(
                    f"unknown dataset {spec.name!r} in dataset_specs: choose one of {', '.join(dataset_names())}"
                )
        config = {**config, "datasets": parsed}
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **config)
    except Exception as exc:  # bad option names (TypeError), bad values (AssertionError, ValueError), ...
        raise DatasetError(
            f"cannot build dataset {name!r} with config {_jsonable(config)}: {type(exc).__name__}: {exc}"
        ) from None


class ReasoningGymEnvironment(Environment[ReasoningGymAction, ReasoningGymObservation, ReasoningGymState]):
    """Single-step reasoning questions; see the module docstring.

    Snapshots save the question shown (the dataset's entry, as generated), the state (dataset,
    options, index, answered) and the arguments the dataset was built with; not the dataset
    object, which reasoning-gym builds from those arguments alike (seeded, each entry drawn from
    ``seed + index``): a restore builds it again, so the next resets show the original's questions.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True
    SNAPSHOT_EXCLUDE = ("_dataset",)

    def __init__(self) -> None:
        super().__init__()
        self._dataset: Any = None
        # build_dataset's arguments for self._dataset (what a restore rebuilds it from)
        self._dataset_args: Optional[Tuple[str, Dict[str, Any], Optional[List[Dict[str, Any]]], int, int]] = None
        self._entry: Optional[Dict[str, Any]] = None
        self._state = ReasoningGymState(episode_id=str(uuid4()))

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        dataset_name: Optional[str] = None,
        dataset_config: Optional[Dict[str, Any]] = None,
        dataset_specs: Optional[List[Dict[str, Any]]] = None,
        size: Optional[int] = None,
        **kwargs: Any,
    ) -> ReasoningGymObservation:
        """A new question: from a new dataset when any dataset option (or ``seed``) is given, else
        the next one of the current dataset. Other keyword arguments are ignored."""
        previous = self._state
        self._entry = None
        self._state = previous.model_copy(
            update={"episode_id": episode_id or str(uuid4()), "step_count": 0, "answered": False}
        )
        rebuild = self._dataset is None or any(
            v is not None for v in (seed, dataset_name, dataset_config, dataset_specs, size)
        )
        if rebuild:
            name = dataset_name or previous.dataset_name or DEFAULT_DATASET
            same = name == previous.dataset_name
            config = dataset_config if dataset_config is not None else (previous.dataset_config if same else {})
            specs = dataset_specs if dataset_specs is not None else (previous.dataset_specs if same else None)
            seed = seed if seed is not None else DEFAULT_SEED
            size = size if size is not None else (previous.size if same and previous.size else DEFAULT_SIZE)
            self._dataset = self._dataset_args = None
            try:
                self._dataset = build_dataset(name, config, specs, seed, size)
                self._dataset_args = copy.deepcopy((name, config, specs, seed, size))
            except DatasetError as exc:
                self._state = ReasoningGymState(episode_id=self._state.episode_id)
                return ReasoningGymObservation(done=True, metadata={"error": str(exc)})
            self._state = self._state.model_copy(
                update={
                    "dataset_name": name,
                    "dataset_config": _jsonable(config),
                    "dataset_specs": _jsonable(specs) if specs is not None else None,
                    "seed": seed,
                    "size": size,
                    "index": 0,
                }
            )
        else:
            self._state.index = ((previous.index or 0) + 1) % len(self._dataset)
        try:
            self._entry = self._dataset[self._state.index]
        except Exception as exc:  # a generator that fails for this index
            return ReasoningGymObservation(
                done=True, metadata={"error": f"the dataset failed to generate a question: {exc}"}
            )
        return ReasoningGymObservation(
            question=str(self._entry["question"]),
            done=False,
            metadata={"dataset_name": self._state.dataset_name, "index": self._state.index},
        )

    def step(
        self, action: ReasoningGymAction, timeout_s: Optional[float] = None, **kwargs: Any
    ) -> ReasoningGymObservation:
        entry = self._entry
        if entry is None or self._state.answered:
            reason = (
                "the question was answered: call reset() for the next one"
                if entry
                else "no question: call reset() first"
            )
            return ReasoningGymObservation(done=True, reward=0.0, metadata={"error": reason})
        self._state.step_count += 1
        self._state.answered = True
        metadata: Dict[str, Any] = {"dataset_name": self._state.dataset_name, "index": self._state.index}
        try:
            score = float(self._dataset.score_answer(answer=action.answer, entry=entry))
        except Exception as exc:  # some scorers raise on answers they cannot parse
            score = 0.0
            metadata["scoring_error"] = f"{type(exc).__name__}: {exc}"
        score = min(max(score, 0.0), 1.0)
        correct = entry.get("answer")
        return ReasoningGymObservation(
            score=score,
            correct_answer=None if correct is None else str(correct),
            dataset_metadata=_jsonable(entry.get("metadata") or {}),
            reward=score,
            done=True,
            metadata=metadata,
        )

    @property
    def state(self) -> ReasoningGymState:
        return self._state

    def restore_state(self, data: Any) -> None:
        super().restore_state(data)
        self._dataset = None if self._dataset_args is None else build_dataset(*self._dataset_args)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="reasoning_gym_env",
            description="Verifiable single-step reasoning questions from the reasoning-gym package",
            version="0.1.0",
        )
