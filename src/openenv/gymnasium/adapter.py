"""``to_gymnasium``: an OpenEnv client as a ``gymnasium.Env``.

The spaces come from the server (its reset observation describes them); values cross in the
JSON form of :mod:`openenv.gymnasium.spaces` and come back typed as the spaces' own samples, so
a served environment replays exactly what a local ``gymnasium.make`` gives for the same seed and
actions.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import gymnasium
from gymnasium.envs.registration import EnvSpec

from openenv.core.client_types import StepResult
from openenv.core.sync_client import SyncEnvClient

from .models import GymnasiumAction
from .spaces import from_description, from_json, to_json

_URL_SCHEMES = ("http://", "https://", "ws://", "wss://", "unix://")


def is_url(value: Any) -> bool:
    """Whether ``value`` is a server address (rather than an environment's name)."""
    return isinstance(value, str) and value.startswith(_URL_SCHEMES)


def _field(observation: Any, name: str) -> Any:
    """A field of a typed observation, or of the plain dict a ``GenericEnvClient`` returns."""
    return observation.get(name) if isinstance(observation, dict) else getattr(observation, name)


def reset_kwargs(
    seed: Optional[int], env_id: Optional[str], options: Any, make_kwargs: Dict[str, Any]
) -> Dict[str, Any]:
    """The keywords of the client's ``reset`` for one Gymnasium reset."""
    kwargs: Dict[str, Any] = dict(make_kwargs)
    for key, value in (("seed", seed), ("env_id", env_id), ("options", options)):
        if value is not None:
            kwargs[key] = value
    return kwargs


class Decoder:
    """Turns the server's results into Gymnasium's values, given the spaces a reset described."""

    def __init__(self, first_reset: StepResult[Any]) -> None:
        observation = first_reset.observation
        if _field(observation, "action_space") is None or _field(observation, "observation_space") is None:
            raise ValueError("the server's reset observation describes no spaces: is it a GymnasiumEnvironment?")
        self.env_id: str = _field(observation, "env_id")
        self.action_space = from_description(_field(observation, "action_space"))
        self.observation_space = from_description(_field(observation, "observation_space"))

    def action(self, action: Any) -> GymnasiumAction:
        if action not in self.action_space:
            raise ValueError(f"action {action!r} is not in the action space {self.action_space}")
        return GymnasiumAction(action=to_json(self.action_space, action))

    def reset(self, result: StepResult[Any]) -> Tuple[Any, Dict[str, Any]]:
        observation = result.observation
        return from_json(self.observation_space, _field(observation, "observation")), dict(_field(observation, "info"))

    def step(self, result: StepResult[Any]) -> Tuple[Any, float, bool, bool, Dict[str, Any]]:
        observation = result.observation
        return (
            from_json(self.observation_space, _field(observation, "observation")),
            float(result.reward or 0.0),
            bool(_field(observation, "terminated")),
            bool(_field(observation, "truncated")),
            dict(_field(observation, "info")),
        )


class RemoteEnv(gymnasium.Env):
    """A ``gymnasium.Env`` whose steps run in an OpenEnv server's session (see :func:`to_gymnasium`)."""

    metadata: Dict[str, Any] = {"render_modes": []}

    def __init__(self, client: SyncEnvClient[Any, Any, Any], env_id: Optional[str] = None, **make_kwargs: Any) -> None:
        self._client = client
        self._make_kwargs = make_kwargs
        self._closed = False
        try:
            self._decoder = Decoder(client.reset(**reset_kwargs(None, env_id, None, make_kwargs)))
        except BaseException:
            self.close()
            raise
        self.env_id = self._decoder.env_id
        self.action_space = self._decoder.action_space
        self.observation_space = self._decoder.observation_space
        # gymnasium.make(env.spec) (and check_env) makes another env: a new session of the same server.
        self.spec = EnvSpec(self.env_id, entry_point=self._another_session)

    def _another_session(self, **make_kwargs: Any) -> RemoteEnv:
        return RemoteEnv(self._client.new_session(), self.env_id, **{**self._make_kwargs, **make_kwargs})

    def reset(
        self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None
    ) -> Tuple[Any, Dict[str, Any]]:
        super().reset(seed=seed)
        kwargs = reset_kwargs(seed, self.env_id, options, self._make_kwargs)
        return self._decoder.reset(self._client.reset(**kwargs))

    def step(self, action: Any) -> Tuple[Any, float, bool, bool, Dict[str, Any]]:
        return self._decoder.step(self._client.step(self._decoder.action(action)))

    def close(self) -> None:
        """Close the session (and the server its client started, if any); safe to call twice."""
        if not self._closed:
            self._closed = True
            self._client.close()

    def __repr__(self) -> str:
        return f"<RemoteEnv {getattr(self, 'env_id', None)} via {self._client!r}>"


def to_gymnasium(client: Any, env_id: Optional[str] = None, **make_kwargs: Any) -> RemoteEnv:
    """A ``gymnasium.Env`` over one session of a served Gymnasium environment.

    ``client`` is a ``.sync()`` client, an async one not yet used (its ``.sync()`` view is taken)
    or a server's URL. ``env_id`` (default: the server's) and ``make_kwargs`` choose the
    environment, as ``reset(env_id=..., **make_kwargs)`` does. The spaces are the server's;
    ``reset(seed=...)`` and ``step`` return Gymnasium's values (``step`` the 5-tuple); ``close``
    closes the client. ``gymnasium.make(env.spec)`` makes another such env, on a new session of
    the same server. An action outside the action space raises ``ValueError`` before it is
    sent; the server's errors arrive as the client's exceptions.
    """
    if is_url(client):
        from .client import GymnasiumClient

        client = GymnasiumClient(base_url=client)
    if not isinstance(client, SyncEnvClient):
        client = client.sync()
    return RemoteEnv(client, env_id, **make_kwargs)
