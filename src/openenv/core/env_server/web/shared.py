"""OpenEnv 0.10's ``WebInterfaceManager``: one environment shared by a Gradio UI's visitors.

A ``gradio_builder`` (see :mod:`.custom`) gets one of these and calls ``await
web_manager.reset_environment()``, ``await web_manager.step_environment({...})``,
``web_manager.get_state()`` and often ``web_manager.env`` itself, while it builds its UI: so the
environment is built when the manager is, at app creation, and lives as long as the app. Every
visitor of that UI plays the same episode (upstream's model; this project's own playground gives
each visitor a session instead, see :mod:`.`). Calls are taken one at a time: sync ones on a
worker thread of the manager's own (never on the event loop), ``reset_async``/``step_async`` on
the loop, as the server's sessions call them (:class:`~..sessions.EnvTraits`).

This environment is not one of the server's sessions: it is not counted against
``max_concurrent_envs`` and has no step timeout. It is only made where a Gradio UI is mounted (or
a package builds a manager itself).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any, Callable, Dict, List, Optional, Type

from pydantic import BaseModel, Field

from ..serialization import deserialize_action_with_preprocessing, serialize_observation, to_jsonable
from ..sessions import env_traits
from ..types import Action, EnvironmentMetadata, Observation
from ..workers import WorkerPool
from .describe import load_environment_metadata

logger = logging.getLogger("openenv.server")


class ActionLog(BaseModel):
    """One step of the shared episode, as the UI's episode log shows it."""

    timestamp: str
    action: Dict[str, Any]
    observation: Dict[str, Any]
    reward: Optional[float] = None
    done: bool = False
    step_count: int = 0


class EpisodeState(BaseModel):
    """The shared episode so far (the latest :attr:`WebInterfaceManager.MAX_ACTION_LOGS` steps)."""

    episode_id: Optional[str] = None
    step_count: int = 0
    current_observation: Optional[Dict[str, Any]] = None
    action_logs: List[ActionLog] = Field(default_factory=list)
    is_reset: bool = True


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def _reward(value: Any) -> Optional[float]:
    return None if value is None else float(value)


class WebInterfaceManager:
    """One environment, its episode and the UI sockets watching it (OpenEnv 0.10's API).

    ``env``: an environment instance, or a factory (a class, a function) called once, now.
    ``metadata`` defaults to :func:`~.describe.load_environment_metadata` of the instance. Calls are
    serialised: a step waits for the reset before it.
    """

    MAX_ACTION_LOGS = 1000

    def __init__(
        self,
        env: Any,
        action_cls: Type[Action],
        observation_cls: Type[Observation],
        metadata: Optional[EnvironmentMetadata] = None,
    ) -> None:
        from ..interfaces import Environment

        self.env = env if isinstance(env, Environment) or not callable(env) else env()
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.metadata = metadata if metadata is not None else load_environment_metadata(self.env)
        self.episode_state = EpisodeState()
        self.connected_clients: List[Any] = []
        self._traits = env_traits(type(self.env))
        # one thread: the environment sees one caller, whichever visitor clicked
        self._pool = WorkerPool(1, name="openenv-web-shared", max_stuck=0)
        self._lock: Optional[asyncio.Lock] = None
        self._closed = False

    # --- calls on the environment -------------------------------------------------------------

    async def _run_sync_in_thread_pool(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(*args, **kwargs)`` on the manager's worker thread (where the environment's sync
        calls run; builders use it for calls of their own on ``env``)."""
        if self._closed:
            raise RuntimeError("this WebInterfaceManager is closed (its app was shut down): build the app again")
        if kwargs:
            return await self._pool.run(lambda: func(*args, **kwargs))
        return await self._pool.run(func, *args)

    def _serialised(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def reset_environment(self, reset_kwargs: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Start a new episode; ``reset_kwargs`` are passed on where ``reset`` takes them (others
        are dropped, as the server's ``/reset`` does). Returns the serialised observation
        (``{"observation", "reward", "done"}``) and tells the UI sockets."""
        traits = self._traits
        kwargs = traits.filter(dict(reset_kwargs or {}), traits.reset_kwargs)
        async with self._serialised():
            if traits.async_reset:
                observation = await self.env.reset_async(**kwargs)
            else:
                observation = await self._run_sync_in_thread_pool(self.env.reset, **kwargs)
            state = await self._read_state()
            payload = to_jsonable(serialize_observation(observation))
            self.episode_state = EpisodeState(
                episode_id=getattr(state, "episode_id", None),
                step_count=0,
                current_observation=payload["observation"],
                is_reset=True,
            )
        await self._send_state_update()
        return payload

    async def step_environment(self, action_data: Dict[str, Any]) -> Dict[str, Any]:
        """Validate ``action_data`` into the action class (form input coerced, as upstream's web
        interface does: JSON ``arguments`` of a tool call, ``tokens``), step, log it. Returns the
        serialised observation and tells the UI sockets. An invalid action raises
        ``pydantic.ValidationError``; the environment's own errors propagate."""
        action = deserialize_action_with_preprocessing(action_data, self.action_cls)
        traits = self._traits
        async with self._serialised():
            if traits.steps_on_loop(action):
                observation = await self.env.step_async(action)
            else:
                observation = await self._run_sync_in_thread_pool(self.env.step, action)
            payload = to_jsonable(serialize_observation(observation))
            episode = self.episode_state
            episode.step_count += 1
            episode.current_observation = payload["observation"]
            episode.is_reset = False
            logged = action.model_dump(mode="json", exclude={"metadata"})
            episode.action_logs.append(
                ActionLog(
                    timestamp=_now(),
                    action=logged,
                    observation=payload["observation"],
                    reward=_reward(payload["reward"]),
                    done=bool(payload["done"]),
                    step_count=episode.step_count,
                )
            )
            del episode.action_logs[: -self.MAX_ACTION_LOGS]
        await self._send_state_update()
        return payload

    async def _read_state(self) -> Any:
        if self._traits.on_loop:
            return self.env.state
        return await self._run_sync_in_thread_pool(lambda: self.env.state)

    def get_state(self) -> Dict[str, Any]:
        """The environment's ``state`` as a dict (read on the caller's thread, as upstream does)."""
        state = self.env.state
        return to_jsonable(state.model_dump() if hasattr(state, "model_dump") else state)

    # --- UI sockets ---------------------------------------------------------------------------

    async def connect_websocket(self, websocket: Any) -> None:
        """Accept ``websocket`` and send it the episode (``{"type": "state_update",
        "episode_state"}``), as after every reset and step from now on."""
        await websocket.accept()
        self.connected_clients.append(websocket)
        await self._send_state_update()

    async def disconnect_websocket(self, websocket: Any) -> None:
        """Stop telling ``websocket`` about the episode."""
        if websocket in self.connected_clients:
            self.connected_clients.remove(websocket)

    async def _send_state_update(self) -> None:
        if not self.connected_clients:
            return
        message = {"type": "state_update", "episode_state": self.episode_state.model_dump(mode="json")}
        for websocket in list(self.connected_clients):
            try:
                await websocket.send_json(message)
            except Exception:  # a socket that went away: forget it, tell the others
                await self.disconnect_websocket(websocket)

    # --- lifetime -----------------------------------------------------------------------------

    def _discard(self) -> None:
        """Close the environment here and now (no UI was made of it: its builder failed)."""
        self._closed = True
        self._pool.shutdown()
        try:
            close = getattr(self.env, "close", None)
            if close is not None:
                close()
        except Exception:  # the builder's failure is the one to report
            logger.exception("%s.close() failed", type(self.env).__name__)

    async def close(self) -> None:
        """Close the environment (on the worker thread) and stop the thread; the manager is done."""
        close = getattr(self.env, "close", None)
        try:
            if close is not None:
                await self._run_sync_in_thread_pool(close)
        except Exception:
            logger.exception("%s.close() failed", type(self.env).__name__)
        finally:
            self._closed = True
            self._pool.shutdown()


__all__ = ["ActionLog", "EpisodeState", "WebInterfaceManager"]
