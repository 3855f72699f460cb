"""Delayed rewards: rubrics that score a whole episode once it is done."""

from __future__ import annotations

import collections
import logging
from abc import ABCMeta, abstractmethod
from typing import Any, Deque, Dict, List, Tuple

from .base import Rubric

logger = logging.getLogger(__name__)

DEFAULT_MAX_STEPS = 10_000


class TrajectoryRubric(Rubric, metaclass=ABCMeta):
    """Collects ``(action, observation)`` each step; scores the trajectory when ``observation.done``.

    Until the episode is done the score is ``intermediate_reward``; on the step whose observation
    has ``done`` set it is ``score_trajectory(trajectory)``, also kept in ``final_score``. Memory
    is bounded: at most ``max_steps`` steps are kept (the oldest go first, with one warning per
    episode, and ``dropped_steps`` counts them). The environment calls ``reset()`` at each reset
    (``Environment._reset_rubric`` does); a step after a done step starts a new trajectory even
    without it. Trainers that run the environment in-process read per-step credit from
    :meth:`compute_step_rewards` once the episode is done.
    """

    def __init__(self, intermediate_reward: float = 0.0, max_steps: int = DEFAULT_MAX_STEPS) -> None:
        super().__init__()
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.intermediate_reward = intermediate_reward
        self.max_steps = max_steps
        self._trajectory: Deque[Tuple[Any, Any]] = collections.deque(maxlen=max_steps)
        self.dropped_steps = 0
        self.final_score: Any = None

    @property
    def trajectory(self) -> List[Tuple[Any, Any]]:
        """A copy of the steps kept so far."""
        return list(self._trajectory)

    def forward(self, action: Any, observation: Any) -> Any:
        if self.final_score is not None:  # the last step ended an episode and no reset() came
            self.reset()
        if len(self._trajectory) == self.max_steps:
            if not self.dropped_steps:
                logger.warning(
                    "%s keeps at most %d steps: older ones are being dropped", type(self).__name__, self.max_steps
                )
            self.dropped_steps += 1
        self._trajectory.append((action, observation))
        if not getattr(observation, "done", False):
            return self.intermediate_reward
        self.final_score = self.score_trajectory(self.trajectory)
        return self.final_score

    @abstractmethod
    def score_trajectory(self, trajectory: List[Tuple[Any, Any]]) -> float:
        """The episode's score, from its ``(action, observation)`` steps."""

    @abstractmethod
    def compute_step_rewards(self) -> List[float]:
        """Credit for each kept step (call it once the episode is done)."""

    def reset(self) -> None:
        self._trajectory.clear()
        self.dropped_steps = 0
        self.final_score = None
        super().reset()

    def state_dict(self) -> Dict[str, Any]:
        return {"intermediate_reward": self.intermediate_reward, "max_steps": self.max_steps, **super().state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.intermediate_reward = state.get("intermediate_reward", self.intermediate_reward)
        if "max_steps" in state and state["max_steps"] != self.max_steps:
            self.max_steps = int(state["max_steps"])
            self._trajectory = collections.deque(self._trajectory, maxlen=self.max_steps)
        super().load_state_dict(state)


class ExponentialDiscountingTrajectoryRubric(TrajectoryRubric):
    """Final score discounted back over the steps: step ``t`` of ``T`` gets ``R * gamma**(T-1-t)``.

    Subclasses say how the final score ``R`` is computed (``score_trajectory``); by default it is
    the last observation's own ``reward`` (0.0 when it has none).
    """

    def __init__(self, gamma: float = 0.99, intermediate_reward: float = 0.0, max_steps: int = DEFAULT_MAX_STEPS):
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be within [0, 1], got {gamma}")
        super().__init__(intermediate_reward=intermediate_reward, max_steps=max_steps)
        self.gamma = gamma

    def score_trajectory(self, trajectory: List[Tuple[Any, Any]]) -> float:
        if not trajectory:
            return 0.0
        reward = getattr(trajectory[-1][1], "reward", None)
        return float(reward) if reward is not None else 0.0

    def compute_step_rewards(self) -> List[float]:
        steps = len(self._trajectory)
        if steps == 0:
            return []
        final = self.final_score if self.final_score is not None else self.score_trajectory(self.trajectory)
        return [final * self.gamma ** (steps - 1 - t) for t in range(steps)]

    def state_dict(self) -> Dict[str, Any]:
        return {"gamma": self.gamma, **super().state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        gamma = state.get("gamma", self.gamma)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be within [0, 1], got {gamma}")
        self.gamma = gamma
        super().load_state_dict(state)
