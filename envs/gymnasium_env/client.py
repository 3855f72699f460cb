"""Client of the Gymnasium environment."""

from __future__ import annotations

from openenv.gymnasium.client import GymnasiumClient


class GymnasiumEnv(GymnasiumClient):
    """Drives one session of the classic-control server over its WebSocket.

    ``reset(seed=..., env_id="CartPole-v1", max_episode_steps=...)`` makes and resets an
    environment; ``step(GymnasiumAction(action=1))`` steps it. For a ``gymnasium.Env``, wrap it:
    ``openenv.gymnasium.to_gymnasium(GymnasiumEnv.from_env("gymnasium_env"), env_id="CartPole-v1")``.
    """
