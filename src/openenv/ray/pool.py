"""``RayEnvPool``: replicas of one environment server spread over a Ray cluster.

::

    from openenv.ray import RayEnvPool
    from echo_env import EchoEnv

    with RayEnvPool("envs/echo_env", replicas=4, placement="SPREAD") as pool:
        env = pool.client(EchoEnv).sync()        # the least-loaded replica, token included
        ...
        result = pool.rollout(policy, episodes=64, group_size=8, concurrency=32, max_steps=10)

Each replica is a Ray actor (:mod:`.replica`) holding one bundle of a placement group, so Ray
places the replicas (``PACK``, ``SPREAD``, ``STRICT_SPREAD``, ``STRICT_PACK``) and brings them
back: an actor whose process or node dies is restarted by Ray as soon as its bundle has a node
again (``max_restarts=-1``); meanwhile the pool serves from the others. A replica whose actor
lives but whose server stops answering ``/health`` is killed, and Ray restarts it the same way.
Sessions are WebSockets pinned to the replica that holds them: those of a replica that goes are
lost (``SessionLostError``); new ones go to the replicas that answer.

Roles (docs/roles.md): every replica takes the pool's orchestrator token (:attr:`RayEnvPool.token`,
what its clients send), grader token and observer token. An agent's credential is minted by the
replica holding its session (``client.agent_token()``) and works there alone, at that client's
``base_url``: hand the agent both.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import httpx

from openenv.core.env_server.edges.auth import ENV_VAR as TOKEN_ENV_VAR
from openenv.core.generic_client import GenericEnvClient
from openenv.core.rollout import Policy, RolloutResult, rollout

from .replica import ReplicaServer, resolve_package

logger = logging.getLogger("openenv.ray")

PLACEMENTS = ("PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK")
NAMESPACE = "openenv"
"""The Ray namespace of every replica actor (named ``openenv-<pool>-<index>``)."""
GRADER_TOKEN_VAR = "OPENENV_GRADER_TOKEN"
OBSERVER_TOKEN_VAR = "OPENENV_OBSERVER_TOKEN"
_HEALTH_TIMEOUT_S = 5.0
_FAILURES_BEFORE_RESTART = 5  # checks in a row (about 5 s or more): a loaded node is slow, not dead


@dataclass(frozen=True)
class Replica:
    """One replica, as the last health check saw it.

    ``sessions`` and ``max_sessions`` are what its server's ``GET /openenv/capacity`` answered;
    ``healthy`` is False while its actor or server does not answer (it gets no new client then).
    """

    index: int
    node_id: Optional[str]
    base_url: Optional[str]
    sessions: Optional[int]
    max_sessions: Optional[int]
    healthy: bool
    restarts: int = 0


class NoHealthyReplicaError(RuntimeError):
    """No replica of the pool answered within the wait."""


class RayEnvPool:
    """``replicas`` servers of the environment ``env`` (a package path or an installed env's name)
    on a Ray cluster, each requiring the access token the pool generated.

    ``sessions_per_replica`` sets each server's ``OPENENV_MAX_SESSIONS`` (default: the package's
    own). ``resources_per_replica`` is one placement-group bundle (default ``{"CPU": 1}``; keys
    ``CPU``, ``GPU``, ``memory`` and custom resources). ``sandbox=False`` serves without our
    sandbox, in the actor process. ``env_vars`` reach every server. ``host`` overrides the address
    each replica binds (default: its node's IP as Ray knows it).

    Uses the Ray runtime already there (``ray.init`` done, or ``RAY_ADDRESS``) and starts a local
    one only when there is none (shut down again by :meth:`close`). Waits at most
    ``start_timeout_s`` for the placement and the servers, then raises with what is missing.
    """

    def __init__(
        self,
        env: str,
        *,
        replicas: int,
        sessions_per_replica: Optional[int] = None,
        placement: str = "SPREAD",
        resources_per_replica: Optional[Dict[str, float]] = None,
        sandbox: bool = True,
        env_vars: Optional[Dict[str, str]] = None,
        host: Optional[str] = None,
        start_timeout_s: float = 60.0,
        health_interval_s: float = 1.0,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
        if sessions_per_replica is not None and sessions_per_replica < 1:
            raise ValueError(f"sessions_per_replica must be at least 1, got {sessions_per_replica}")
        try:
            import ray
        except ImportError as exc:
            raise ImportError("RayEnvPool needs Ray: pip install 'openenv[ray]'") from exc

        self._ray = ray
        self.name = f"openenv-{uuid.uuid4().hex[:8]}"
        self.token = secrets.token_urlsafe(32)
        """The bearer token every replica requires (``Authorization: Bearer <token>``): the
        orchestrator's (docs/roles.md)."""
        self.grader_token = secrets.token_urlsafe(32)
        """The grader's token on every replica (``OPENENV_GRADER_TOKEN``): read a session's state,
        call the grader-only tools, grade a copy of the session."""
        self.observer_token = secrets.token_urlsafe(32)
        """The observer's token on every replica (``OPENENV_OBSERVER_TOKEN``): health, capacity,
        metadata and schemas."""
        self.placement = placement
        self.health_interval_s = health_interval_s
        self._resources = dict(resources_per_replica or {"CPU": 1})
        self._lock = threading.Lock()  # the records and hand-out counts
        self._checking = threading.Lock()  # one health check at a time
        self._stopping = threading.Event()
        self._health_thread: Optional[threading.Thread] = None
        self._actors: List[Any] = []
        self._pending: List[Any] = []  # each replica's info() call in flight (one at a time)
        self._records: List[Replica] = []
        self._handed: List[int] = []  # clients handed out since the last health check, per replica
        self._failures: List[int] = []
        self._pg: Any = None
        self._started_ray = False
        self._closed = False
        # one snapshot key for every replica: a session snapshotted on one restores on any other
        server_env = {
            "OPENENV_SNAPSHOT_KEY": secrets.token_hex(32),
            **(env_vars or {}),
            TOKEN_ENV_VAR: self.token,
            GRADER_TOKEN_VAR: self.grader_token,
            OBSERVER_TOKEN_VAR: self.observer_token,
        }
        if sessions_per_replica is not None:
            server_env["OPENENV_MAX_SESSIONS"] = str(sessions_per_replica)
        try:
            self._connect_ray()
            self._place(replicas, start_timeout_s)
            self._start_replicas(replicas, _package_arg(env), sandbox, server_env, host, start_timeout_s)
        except BaseException:
            self.close()
            raise
        self._health_thread = threading.Thread(target=self._watch, name=f"{self.name}-health", daemon=True)
        self._health_thread.start()

    # --- starting ---------------------------------------------------------------------------------

    def _connect_ray(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        if os.environ.get("RAY_ADDRESS"):
            ray.init()
        else:  # no Ray to join: a local one of our own ("local": never someone else's on this machine)
            ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
        self._started_ray = True

    def _place(self, replicas: int, timeout_s: float) -> None:
        from ray.util.placement_group import placement_group

        self._pg = placement_group([dict(self._resources)] * replicas, strategy=self.placement, name=self.name)
        ready, _ = self._ray.wait([self._pg.ready()], timeout=timeout_s)
        if ready:
            return
        alive = [n for n in self._ray.nodes() if n.get("Alive")]
        if self.placement == "STRICT_SPREAD" and len(alive) < replicas:
            why = f"STRICT_SPREAD needs {replicas} nodes (one per replica) but the cluster has {len(alive)}"
        else:
            why = (
                f"the cluster cannot hold {replicas} bundles of {self._resources} with {self.placement} "
                f"({len(alive)} nodes, free: {self._ray.available_resources()})"
            )
        raise RuntimeError(
            f"the pool's replicas could not be placed within {timeout_s:g} s: {why}; add nodes, "
            "lower replicas or resources_per_replica, or choose another placement"
        )

    def _start_replicas(
        self,
        replicas: int,
        env: str,
        sandbox: bool,
        env_vars: Dict[str, str],
        host: Optional[str],
        timeout_s: float,
    ) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        resources = dict(self._resources)
        options: Dict[str, Any] = {
            "num_cpus": resources.pop("CPU", 0),
            "num_gpus": resources.pop("GPU", 0),
            "max_restarts": -1,  # Ray brings a replica back once its bundle has a node again
            "max_task_retries": 0,
            "namespace": NAMESPACE,
        }
        if "memory" in resources:
            options["memory"] = resources.pop("memory")
        if resources:
            options["resources"] = resources
        actor_class = self._ray.remote(ReplicaServer)
        for index in range(replicas):
            strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=index)
            actor = actor_class.options(name=f"{self.name}-{index}", scheduling_strategy=strategy, **options).remote(
                env, sandbox=sandbox, env_vars=env_vars, host=host, start_timeout_s=timeout_s
            )
            self._actors.append(actor)
        infos = self._ray.get([actor.info.remote() for actor in self._actors], timeout=timeout_s)
        self._records = [
            Replica(i, info["node_id"], info["base_url"], None, None, True) for i, info in enumerate(infos)
        ]
        self._pending = [None] * replicas
        self._handed = [0] * replicas
        self._failures = [0] * replicas
        self.check_health()

    # --- health -----------------------------------------------------------------------------------

    @property
    def replicas(self) -> List[Replica]:
        """One record per replica, read from each one's actor and ``/health`` now."""
        return self.check_health()

    def check_health(self) -> List[Replica]:
        """Ask every replica's actor where it serves and its server how many sessions it holds;
        kill the actor of a server that failed several checks in a row (Ray restarts it)."""
        with self._checking:
            records = self._check()
        with self._lock:
            self._records = records
            self._handed = [0] * len(records)
        return list(records)

    def _check(self) -> List[Replica]:
        ray = self._ray
        for index, actor in enumerate(self._actors):
            if self._pending[index] is None:
                self._pending[index] = actor.info.remote()
        done, _ = ray.wait(list(self._pending), num_returns=len(self._pending), timeout=0.5)
        finished = set(done)
        records: List[Replica] = []
        with httpx.Client(timeout=_HEALTH_TIMEOUT_S, trust_env=False, headers=self.headers) as http:
            for index, old in enumerate(self._records):
                node_id, base_url, restarts = old.node_id, old.base_url, old.restarts
                answered = alive = False
                if self._pending[index] in finished:
                    ref, self._pending[index] = self._pending[index], None
                    try:
                        info = ray.get(ref)
                    except Exception:  # the actor died: Ray restarts it once its bundle has a node
                        pass
                    else:
                        answered = alive = True
                        if info["base_url"] != base_url:
                            restarts += 1
                            logger.warning("replica %d of %s is back, on node %s", index, self.name, info["node_id"])
                        node_id, base_url = info["node_id"], info["base_url"]
                else:
                    alive = True  # no answer yet: its server's /health tells
                health = _health(http, base_url) if alive else None
                self._failures[index] = 0 if health else self._failures[index] + 1
                if answered and self._failures[index] >= _FAILURES_BEFORE_RESTART:
                    logger.warning("replica %d of %s does not answer /health: restarting it", index, self.name)
                    ray.kill(self._actors[index], no_restart=False)
                    self._failures[index] = 0
                records.append(
                    Replica(
                        index,
                        node_id,
                        base_url,
                        health.get("active_sessions") if health else None,
                        health.get("max_sessions") if health else None,
                        health is not None,
                        restarts,
                    )
                )
        return records

    def _watch(self) -> None:
        while not self._stopping.wait(self.health_interval_s):
            try:
                self.check_health()
            except Exception:  # Ray shutting down under us, say: try again next time
                if not self._stopping.is_set():
                    logger.exception("health check of %s failed", self.name)

    def _mark_down(self, base_url: str) -> None:
        with self._lock:
            self._records = [
                Replica(r.index, r.node_id, r.base_url, r.sessions, r.max_sessions, False, r.restarts)
                if r.base_url == base_url
                else r
                for r in self._records
            ]

    # --- clients ----------------------------------------------------------------------------------

    def _pick(self) -> Optional[str]:
        """The base URL of the least-loaded healthy replica (counting clients handed out since the
        last health check), or None."""
        with self._lock:
            healthy = [r for r in self._records if r.healthy and r.base_url]
            if not healthy:
                return None
            best = min(healthy, key=lambda r: ((r.sessions or 0) + self._handed[r.index], r.index))
            self._handed[best.index] += 1
            return best.base_url

    @property
    def headers(self) -> Dict[str, str]:
        """The header every request to a replica carries."""
        return {"Authorization": f"Bearer {self.token}"}

    def client(self, ClientClass: type = GenericEnvClient, *, wait_s: float = 30.0, **kwargs: Any) -> Any:
        """A new, unconnected ``ClientClass`` on the least-loaded healthy replica, with the token
        (``.sync()`` works as on any client). Waits up to ``wait_s`` for a replica to be healthy.
        Its session's agent credential (``client.agent_token()``) works at its ``base_url``."""
        self._check_open()
        deadline = time.monotonic() + wait_s
        while (url := self._pick()) is None:
            if time.monotonic() > deadline:
                raise NoHealthyReplicaError(self._no_replica(wait_s))
            time.sleep(0.1)
        return self._make(ClientClass, url, kwargs)

    def _make(self, ClientClass: type, url: str, kwargs: Dict[str, Any]) -> Any:
        options = dict(kwargs)
        options["headers"] = {**(options.get("headers") or {}), **self.headers}
        return ClientClass(base_url=url, **options)

    async def connected_client(
        self, ClientClass: type = GenericEnvClient, *, wait_s: float = 30.0, **kwargs: Any
    ) -> Any:
        """An async client already connected to a healthy replica: a replica that refuses the
        connection is marked down and the next one is tried, until ``wait_s`` has passed."""
        self._check_open()
        deadline = time.monotonic() + wait_s
        while True:
            url = self._pick()
            if url is not None:
                client = self._make(ClientClass, url, kwargs)
                try:
                    await client.connect()
                    return client
                except ConnectionError:
                    self._mark_down(url)
                    await client.close()
            if time.monotonic() > deadline:
                raise NoHealthyReplicaError(self._no_replica(wait_s))
            await asyncio.sleep(0.1)

    async def fork(self, client: Any, n: int = 1, *, wait_s: float = 30.0) -> List[Any]:
        """``n`` new clients (of ``client``'s class) whose sessions start from ``client``'s state
        now, each on the least-loaded healthy replica: unlike ``client.fork(n)``, which keeps them
        on its own server, these spread over the pool (every replica shares the pool's snapshot
        key). Closing them is the caller's; if one cannot be made, those made are closed."""
        snapshot = await client.snapshot()
        kwargs = {key: value for key, value in client._clone_kwargs().items() if key not in ("base_url", "headers")}
        forks: List[Any] = []
        try:
            for _ in range(n):
                forks.append(await self.connected_client(type(client), wait_s=wait_s, **kwargs))
            await asyncio.gather(*(fork.restore(snapshot) for fork in forks))
        except BaseException:
            await asyncio.gather(*(fork.close() for fork in forks), return_exceptions=True)
            raise
        return forks

    def _no_replica(self, wait_s: float) -> str:
        states = ", ".join(f"{r.index}: {'up' if r.healthy else 'down'} at {r.base_url}" for r in self._records)
        return (
            f"no replica of {self.name} answered within {wait_s:g} s ({states}); Ray restarts a lost "
            "replica once its placement-group bundle has a node again"
        )

    def urls(self) -> List[str]:
        """The base URLs of the healthy replicas (hand them, with :attr:`headers`, to workers)."""
        with self._lock:
            return [r.base_url for r in self._records if r.healthy and r.base_url]

    def rollout(
        self,
        policy: Policy,
        episodes: Union[int, List[Dict[str, Any]]],
        *,
        client_cls: type = GenericEnvClient,
        **options: Any,
    ) -> RolloutResult:
        """:func:`openenv.core.rollout.rollout` over the replicas: each of its sessions is a
        client of the least-loaded healthy replica when it opens (and again after its connection
        was lost). Same arguments (``group_size``, ``concurrency``, ``max_steps``, ``jsonl_path``,
        ...), same result and JSONL records; the episodes of a replica that goes are recorded as
        failed (``SessionLostError``) and the rest play on the others."""
        self._check_open()
        return rollout(lambda: self.connected_client(client_cls), policy, episodes, **options)

    # --- closing ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name} is closed")

    def close(self) -> None:
        """Stop every replica's server, kill its actor, remove the placement group, and shut down
        the Ray runtime if the pool started it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        if self._health_thread is not None:
            self._health_thread.join(10)
        ray = self._ray
        if self._actors:
            stops = [actor.stop.remote() for actor in self._actors]
            ray.wait(stops, num_returns=len(stops), timeout=30)
            for actor in self._actors:
                ray.kill(actor, no_restart=True)
            _wait_gone([f"{self.name}-{i}" for i in range(len(self._actors))], ray, timeout_s=30)
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
        if self._started_ray:
            ray.shutdown()

    def __enter__(self) -> RayEnvPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RayEnvPool({self.name}, replicas={len(self._actors)}, placement={self.placement!r})"


def _package_arg(env: str) -> str:
    """``env`` as the replicas are given it: an absolute package path where it exists here (the
    same path must exist on every node), else the installed env's name (resolved on each node)."""
    try:
        return resolve_package(env)
    except Exception:
        return env


def _health(http: httpx.Client, base_url: Optional[str]) -> Optional[Dict[str, Any]]:
    if not base_url:
        return None
    try:
        response = http.get(base_url + "/openenv/capacity")
        body = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return body if response.status_code == 200 and isinstance(body, dict) else None


def _wait_gone(names: List[str], ray: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.05)
