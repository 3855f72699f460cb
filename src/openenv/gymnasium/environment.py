"""``GymnasiumEnvironment``: any registered Gymnasium environment, served as an OpenEnv one.

Each session holds one ``gymnasium.make(env_id, **kwargs)``; the client picks ``env_id`` and
the keywords at ``reset``, among those the server allows. The client is not trusted: an id it
names is looked up in Gymnasium's registry only if the server's allow-list has it (an id with a
``module:`` prefix, which would make Gymnasium import that module, never passes), and it may
pass only the ``gymnasium.make`` keywords the server allows, with plain JSON values.

Snapshots (fork, save, restore) save the session's Gymnasium environment whole, as the objects it
is made of: every wrapper with its counters (``TimeLimit``'s elapsed steps, the order and
checker flags), the inner environment's attributes (CartPole's ``state``, FrozenLake's ``s``,
Blackjack's hands, ...), its ``np_random`` generator with its state, the spaces and the spec;
plus the episode's state. A restored session steps exactly as the saved one would. An
environment whose state is not plain Python and NumPy data (a render window, a physics engine's
native object) is refused, naming the attribute. The server's allow-lists are not saved: a
snapshot restores only where its ``env_id`` and keywords are allowed.
"""

from __future__ import annotations

import json
import os
from typing import Any, Collection, Dict, Optional, Sequence, Tuple
from uuid import uuid4

import gymnasium

from openenv.core.env_server.exceptions import SnapshotUnsupportedError
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.serialization import to_jsonable
from openenv.core.env_server.snapshot_data import UnsavableError, encode
from openenv.core.env_server.types import EnvironmentMetadata

from .models import GymnasiumAction, GymnasiumObservation, GymnasiumState
from .spaces import describe, from_json, to_json

ENV_IDS_VARIABLE = "OPENENV_GYMNASIUM_ENV_IDS"
"""Comma-separated ids a server allows (the first is the default); ``*`` allows every registered id."""
MAKE_KWARGS_VARIABLE = "OPENENV_GYMNASIUM_MAKE_KWARGS"
"""Comma-separated ``gymnasium.make`` keywords a client may pass at reset."""

CLASSIC_CONTROL = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1")
"""Gymnasium's classic-control environments (no dependency beyond Gymnasium)."""

_SCALARS = (str, int, float, bool, type(None))


def _listed(value: Optional[str]) -> Tuple[str, ...]:
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


def spaces_of(env: gymnasium.Env) -> Dict[str, Any]:
    """The JSON descriptions of ``env``'s action and observation spaces."""
    return {"action_space": describe(env.action_space), "observation_space": describe(env.observation_space)}


class GymnasiumEnvironment(Environment[GymnasiumAction, GymnasiumObservation, GymnasiumState]):
    """Serves registered Gymnasium environments, one per session.

    ``reset(seed=None, env_id=None, options=None, **make_kwargs)`` makes the environment (again
    only when ``env_id`` or the keywords change, so that an unseeded reset continues the seeded
    one's random stream, as in Gymnasium) and resets it; ``step(GymnasiumAction(action=...))``
    steps it. The allowed ids come from ``env_ids``, else ``$OPENENV_GYMNASIUM_ENV_IDS``, else
    :attr:`ENV_IDS`; the first one is the default. The allowed ``gymnasium.make`` keywords come
    from ``make_kwargs``, else ``$OPENENV_GYMNASIUM_MAKE_KWARGS``, else :attr:`MAKE_KWARGS`.
    Subclass to change the defaults (the class is what ``create_app`` takes).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True
    SNAPSHOT_EXCLUDE = ("env_ids", "make_kwargs")  # the server's allow-lists: the restoring server's own
    ENV_IDS: Tuple[str, ...] = CLASSIC_CONTROL
    MAKE_KWARGS: Tuple[str, ...] = ("max_episode_steps",)

    def __init__(self, env_ids: Optional[Sequence[str]] = None, make_kwargs: Optional[Collection[str]] = None) -> None:
        super().__init__()
        self.env_ids = tuple(env_ids or _listed(os.environ.get(ENV_IDS_VARIABLE)) or self.ENV_IDS)
        if make_kwargs is None:
            make_kwargs = _listed(os.environ.get(MAKE_KWARGS_VARIABLE)) or self.MAKE_KWARGS
        self.make_kwargs = frozenset(make_kwargs)
        self._env: Optional[gymnasium.Env] = None
        self._made: Optional[Tuple[str, str]] = None  # (env_id, its keywords as JSON): what _env is
        self._state = GymnasiumState()

    @property
    def default_env_id(self) -> Optional[str]:
        return next((env_id for env_id in self.env_ids if env_id != "*"), None)

    # --- the contract -----------------------------------------------------------------------

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        env_id: Optional[str] = None,
        options: Optional[Dict[str, Any]] = None,
        **make_kwargs: Any,
    ) -> GymnasiumObservation:
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"options must be an object, got {options!r}")
        env = self._make(env_id or self.default_env_id, make_kwargs)
        observation, info = env.reset(seed=seed, options=options)
        assert self._made is not None
        self._state = GymnasiumState(
            episode_id=episode_id or str(uuid4()), env_id=self._made[0], make_kwargs=make_kwargs, seed=seed
        )
        return GymnasiumObservation(
            observation=to_json(env.observation_space, observation),
            info=to_jsonable(info),
            env_id=self._made[0],
            reward=0.0,
            **spaces_of(env),
        )

    def step(self, action: GymnasiumAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GymnasiumObservation:
        if self._env is None:
            raise RuntimeError("no environment yet: call reset(env_id=...) before step")
        space = self._env.action_space
        value = from_json(space, action.action, "action")
        if value not in space:
            raise ValueError(f"action {action.action!r} is not in the action space {space}")
        observation, reward, terminated, truncated, info = self._env.step(value)
        self._state.step_count += 1
        self._state.total_reward += float(reward)
        self._state.done = bool(terminated or truncated)
        return GymnasiumObservation(
            observation=to_json(self._env.observation_space, observation),
            reward=float(reward),
            done=self._state.done,
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=to_jsonable(info),
        )

    @property
    def state(self) -> GymnasiumState:
        return self._state

    def close(self) -> None:
        env, self._env, self._made = self._env, None, None
        if env is not None:
            env.close()

    # --- snapshots (see the module docstring) ------------------------------------------------

    def snapshot_state(self) -> Dict[str, Any]:
        if self._env is not None:
            assert self._made is not None
            try:
                encode(self._env, "self._env")
            except UnsavableError as exc:
                raise SnapshotUnsupportedError(
                    f"{self._made[0]} cannot be snapshotted exactly: {exc}. Its state is not plain Python and "
                    "NumPy data (a render window, a native engine), so its sessions are refused"
                ) from None
        return super().snapshot_state()

    def restore_state(self, data: Dict[str, Any]) -> None:
        made = data.get("_made")
        if made is not None:
            self._check(made[0], json.loads(made[1]))  # served here, with these keywords
        previous = self._env
        super().restore_state(data)
        if previous is not None and previous is not self._env:
            previous.close()

    def get_metadata(self) -> EnvironmentMetadata:
        """Lists the allowed ids and keywords; the readme describes each allowed id's spaces."""
        ids = ", ".join(self.env_ids) or "none"
        sections = ["# Gymnasium environments", ""]
        for env_id in self.env_ids:
            if env_id == "*":
                sections += ["Any registered Gymnasium id may be asked for.", ""]
                continue
            try:
                env = gymnasium.make(env_id)
            except Exception as exc:  # a missing dependency, say: the others are still described
                sections += [f"## {env_id}", "", f"unavailable: {exc}", ""]
                continue
            try:
                sections += [f"## {env_id}", "", "```json", json.dumps(spaces_of(env)), "```", ""]
            finally:
                env.close()
        return EnvironmentMetadata(
            name="gymnasium",
            description=(
                f"Gymnasium environments, chosen with reset(env_id=...): {ids} (default {self.default_env_id}); "
                f"gymnasium.make keywords allowed at reset: {', '.join(sorted(self.make_kwargs)) or 'none'}"
            ),
            readme_content="\n".join(sections),
            version=gymnasium.__version__,
        )

    # --- making the environment -------------------------------------------------------------

    def _check(self, env_id: Optional[str], make_kwargs: Dict[str, Any]) -> str:
        if env_id is None:
            raise ValueError("no env_id given and this server has no default: pass reset(env_id=...)")
        if not isinstance(env_id, str) or ":" in env_id or (env_id not in self.env_ids and "*" not in self.env_ids):
            raise ValueError(
                f"env_id {env_id!r} is not served here; allowed: {', '.join(self.env_ids)} "
                f"(the server sets them with {ENV_IDS_VARIABLE})"
            )
        refused = sorted(set(make_kwargs) - self.make_kwargs)
        if refused:
            raise ValueError(
                f"gymnasium.make keyword(s) {', '.join(refused)} not allowed; allowed: "
                f"{', '.join(sorted(self.make_kwargs)) or 'none'} (the server sets them with {MAKE_KWARGS_VARIABLE})"
            )
        for key, value in make_kwargs.items():
            if not isinstance(value, _SCALARS):
                raise ValueError(f"gymnasium.make keyword {key} must be a string, number, bool or null, got {value!r}")
        return env_id

    def _make(self, env_id: Optional[str], make_kwargs: Dict[str, Any]) -> gymnasium.Env:
        made = (self._check(env_id, make_kwargs), json.dumps(make_kwargs, sort_keys=True))
        if self._env is not None and self._made == made:
            return self._env
        try:
            env = gymnasium.make(made[0], **make_kwargs)
        except gymnasium.error.Error as exc:
            raise ValueError(f"gymnasium.make({made[0]!r}) failed: {exc}") from None
        try:
            spaces_of(env)  # every space must travel as JSON before a client gets this env
        except ValueError:
            env.close()
            raise
        self.close()
        self._env, self._made = env, made
        return env
