"""A small typed (non-MCP) environment for the interop check, written only against the public
API that OpenEnv 0.10 and this implementation share.

Serve with ``python -m uvicorn counter_app:app --port P`` from this directory, under either core.

The counter starts at ``start`` (a custom reset option, default 0); each ``CounterAction(delta)``
adds ``delta``, earns ``float(delta)`` as reward, and the episode is done once the value reaches
``TARGET``. The state carries ``value`` as an extra field. ``reset`` names no ``**kwargs``, so
the server has to drop reset options it does not name.
"""

from __future__ import annotations

from typing import Any, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

TARGET = 10


class CounterAction(Action):
    delta: int


class CounterObservation(Observation):
    value: int = 0
    label: str = ""


class CounterState(State):
    value: int = 0


class CounterEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = CounterState(episode_id=None, step_count=0, value=0)

    # No **kwargs on purpose: the server must drop reset options the signature does not name.
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, start: int = 0) -> CounterObservation:
        self._state = CounterState(episode_id=episode_id, step_count=0, value=int(start))
        return CounterObservation(
            value=self._state.value, label="reset", reward=0.0, done=False, metadata={"seed": seed}
        )

    def step(self, action: CounterAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        self._state.step_count += 1
        self._state.value += action.delta
        return CounterObservation(
            value=self._state.value,
            label="step",
            reward=float(action.delta),
            done=self._state.value >= TARGET,
            metadata={"step": self._state.step_count},
        )

    @property
    def state(self) -> CounterState:
        return self._state


app = create_app(
    CounterEnvironment,
    CounterAction,
    CounterObservation,
    env_name="counter",
    max_concurrent_envs=4,
    state_cls=CounterState,
)
