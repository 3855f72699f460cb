"""``make_vector_env``: a ``gymnasium.vector.VectorEnv`` over several sessions of one server.

All sessions run on one event loop on a thread of their own; a ``step`` sends every
sub-environment's action at once and waits for all the answers. Sub-environments are reset
Gymnasium's default way (``AutoresetMode.NEXT_STEP``): after one ends, the next ``step`` resets
it, ignoring its action, and returns the reset's observation with reward 0 and neither flag set.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from openenv.core.loop_thread import LoopThread
from openenv.core.sync_client import SyncEnvClient

from .adapter import Decoder, is_url, reset_kwargs

ClientFactory = Callable[[], Any]


def _batched_infos(infos: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Gymnasium's vector info: per key an array over the sub-environments and a ``_key`` mask."""
    batched: Dict[str, Any] = {}
    for key in dict.fromkeys(key for info in infos for key in info):
        present = np.array([key in info for info in infos])
        given = [info[key] for info in infos if key in info]
        if all(isinstance(value, dict) for value in given):
            batched[key] = _batched_infos([info.get(key, {}) for info in infos])
        elif all(isinstance(value, (bool, int, float)) for value in given):
            dtype = np.result_type(*[type(value) for value in given])
            batched[key] = np.array([info.get(key, 0) for info in infos], dtype=dtype)
        else:  # one object per sub-environment, even where a value is a list
            batched[key] = np.empty(len(infos), dtype=object)
            batched[key][:] = [info.get(key) for info in infos]
        batched[f"_{key}"] = present
    return batched


class RemoteVectorEnv(VectorEnv):
    """``num_envs`` sessions stepped together (see :func:`make_vector_env`)."""

    metadata: Dict[str, Any] = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, clients: List[Any], num_envs: int, env_id: Optional[str], make_kwargs: Dict[str, Any]) -> None:
        self._loop = LoopThread("openenv-vector-env-loop")
        self._owned = clients
        self._clients = list(clients)
        self._make_kwargs = make_kwargs
        self.num_envs = num_envs
        try:
            first = self._run(self._start(env_id))
        except BaseException:
            self.close_extras()
            raise
        self._decoder = Decoder(first)
        self.env_id = self._decoder.env_id
        self.single_action_space = self._decoder.action_space
        self.single_observation_space = self._decoder.observation_space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self._autoreset = np.zeros(self.num_envs, dtype=bool)

    def _run(self, coro: Any) -> Any:
        return self._loop.run(coro)

    async def _start(self, env_id: Optional[str]) -> Any:
        """Connect every session (those past the clients given are new sessions of the first
        one's server) and make its environment; the first reset describes the spaces."""
        await asyncio.gather(*(client.connect() for client in self._owned))
        more = self.num_envs - len(self._owned)
        self._clients += await asyncio.gather(*(self._owned[0].new_session() for _ in range(more)))
        kwargs = reset_kwargs(None, env_id, None, self._make_kwargs)
        results = await asyncio.gather(*(client.reset(**kwargs) for client in self._clients))
        return results[0]

    def _batch(self, observations: List[Any]) -> Any:
        out = create_empty_array(self.single_observation_space, self.num_envs)
        return concatenate(self.single_observation_space, observations, out)

    def reset(
        self, *, seed: Union[int, Sequence[Optional[int]], None] = None, options: Optional[Dict[str, Any]] = None
    ) -> Tuple[Any, Dict[str, Any]]:
        """Reset every sub-environment; an int ``seed`` seeds sub-environment ``i`` with ``seed + i``
        (as ``SyncVectorEnv`` does), a list gives each its own."""
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"{len(seeds)} seeds given for {self.num_envs} sub-environments")

        async def reset_all() -> List[Any]:
            return await asyncio.gather(
                *(
                    client.reset(**reset_kwargs(s, self.env_id, options, self._make_kwargs))
                    for client, s in zip(self._clients, seeds, strict=True)
                )
            )

        decoded = [self._decoder.reset(result) for result in self._run(reset_all())]
        self._autoreset[:] = False
        return self._batch([obs for obs, _ in decoded]), _batched_infos([info for _, info in decoded])

    def step(self, actions: Any) -> Tuple[Any, np.ndarray, np.ndarray, np.ndarray, Dict[str, Any]]:
        """Step every sub-environment (resetting those that ended on the previous step)."""
        wire = [self._decoder.action(action) for action in iterate(self.action_space, actions)]
        autoreset = self._autoreset.copy()
        reset = reset_kwargs(None, self.env_id, None, self._make_kwargs)

        async def step_all() -> List[Any]:
            return await asyncio.gather(
                *(
                    client.reset(**reset) if again else client.step(action)
                    for client, action, again in zip(self._clients, wire, autoreset, strict=True)
                )
            )

        observations, infos = [], []
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        for i, result in enumerate(self._run(step_all())):
            if autoreset[i]:
                observation, info = self._decoder.reset(result)
            else:
                observation, rewards[i], terminations[i], truncations[i], info = self._decoder.step(result)
            observations.append(observation)
            infos.append(info)
        self._autoreset = terminations | truncations
        return self._batch(observations), rewards, terminations, truncations, _batched_infos(infos)

    def close_extras(self, **kwargs: Any) -> None:
        """Close every session, and the server the first one started, if any."""

        async def close_all() -> None:  # new_session()'s sessions close with their parent
            await asyncio.gather(*(client.close() for client in self._owned), return_exceptions=True)

        try:
            if not self._loop.stopped:
                self._run(close_all())
        finally:
            self._loop.stop()

    def __enter__(self) -> RemoteVectorEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteVectorEnv({getattr(self, 'env_id', None)}, num_envs={self.num_envs})"


def make_vector_env(
    env: Union[str, ClientFactory], env_id: Optional[str] = None, num_envs: int = 1, **make_kwargs: Any
) -> RemoteVectorEnv:
    """A ``gymnasium.vector.VectorEnv`` over ``num_envs`` sessions of a served Gymnasium environment.

    ``env`` is a server's URL; the name (or directory) of an installed environment package,
    whose server then starts in the sandbox and stops when the vector env closes; or a factory
    called once per session that returns an async client not yet connected. ``env_id`` and
    ``make_kwargs`` choose the environment as for :func:`~openenv.gymnasium.to_gymnasium`.
    Steps run concurrently with Gymnasium's next-step autoreset; ``close()`` closes the
    sessions and any server it started.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    if is_url(env):
        from .client import GymnasiumClient

        clients = [GymnasiumClient(base_url=env) for _ in range(num_envs)]
    elif isinstance(env, str):
        from openenv.auto import AutoEnv

        clients = [AutoEnv.from_env(env)]  # its server starts in the sandbox; the others are its sessions
    elif callable(env):
        clients = [env() for _ in range(num_envs)]
        if any(isinstance(client, SyncEnvClient) for client in clients):
            raise TypeError("the client factory must return async clients (not .sync() ones): they run concurrently")
    else:
        raise TypeError(f"env must be a URL, an environment's name or a client factory, got {env!r}")
    return RemoteVectorEnv(clients, num_envs, env_id, make_kwargs)
