"""Play many episodes of any environment over several concurrent sessions.

::

    from openenv.core.rollout import rollout

    result = rollout(
        "unix:///tmp/.../env.sock",                 # or a client, or a factory of clients
        policy,                                     # policy(observation, episode) -> action (sync or async)
        [{"seed": s} for s in range(16)],           # reset kwargs, one group per entry
        group_size=8,                               # G episodes from each entry (GRPO groups)
        concurrency=16,                             # sessions open at once
        max_steps=10,
        jsonl_path="rollouts.jsonl",
        progress=True,
    )
    print(result.summary)
    advantages = result.advantages()                # returns normalised within each group

Each session is one client (one WebSocket, one environment instance on the server); a session
plays its episodes one after the other, and ``concurrency`` sessions play at once. An episode that
raises (the server refuses an action, the policy fails, the connection drops) is recorded with its
``error`` and the rollout goes on, unless ``on_error="raise"``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import math
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Awaitable, Callable, Dict, Hashable, List, Optional, Sequence, Union

from .client_errors import CapacityReachedError, SessionLostError
from .env_client import EnvClient, Usage
from .generic_client import GenericEnvClient
from .sync_client import SyncEnvClient

Policy = Callable[[Any, "Episode"], Any]
"""``policy(observation, episode) -> action``, or a coroutine function of the same signature.
``episode`` is the :class:`Episode` being played: ``episode.step`` is the index of the action
asked for, ``episode.observations``/``actions``/``rewards`` the history so far."""

EnvSource = Union[str, EnvClient, SyncEnvClient, Callable[[], Any]]

_ON_ERROR = ("record", "raise")
_CONNECTION_LOST = (SessionLostError, ConnectionError, TimeoutError)


@dataclass
class Episode:
    """One episode: what was seen, done and earned, and how long it took.

    ``observations`` holds the observation after ``reset`` and after every step, so it is one
    longer than ``rewards``; ``actions`` is as long as ``rewards``, or one longer when the
    episode failed on a step (the action that failed is kept). ``done`` is the
    environment's verdict; ``truncated`` means ``max_steps`` ran out first. ``error`` is set when
    the episode failed (its partial history is kept). ``group`` is the index of its reset kwargs:
    episodes of one group started from the same reset kwargs.
    """

    index: int
    group: int
    reset_kwargs: Dict[str, Any]
    session: int = -1
    observations: List[Any] = field(default_factory=list)
    actions: List[Any] = field(default_factory=list)
    rewards: List[float] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    error: Optional[str] = None
    started_at: float = 0.0
    duration_s: float = 0.0
    reset_s: float = 0.0
    step_s: List[float] = field(default_factory=list)
    policy_s: List[float] = field(default_factory=list)
    branched_at: Optional[int] = None
    """With ``branch_at``: the step at which its group's episodes were forked from one another
    (the first ``branched_at`` actions, rewards and observations are those of the group)."""

    @property
    def step(self) -> int:
        """The number of actions taken so far (the index of the next one)."""
        return len(self.actions)

    @property
    def total_return(self) -> float:
        return float(sum(self.rewards))

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> Dict[str, Any]:
        """A JSON-ready dict (observations and actions as plain data)."""
        return {
            "index": self.index,
            "group": self.group,
            "session": self.session,
            "reset_kwargs": _plain(self.reset_kwargs),
            "observations": [_plain(o) for o in self.observations],
            "actions": [_plain(a) for a in self.actions],
            "rewards": _plain(self.rewards),
            "return": self.total_return,
            "done": self.done,
            "truncated": self.truncated,
            "error": self.error,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "reset_s": self.reset_s,
            "step_s": self.step_s,
            "policy_s": self.policy_s,
            "branched_at": self.branched_at,
        }


@dataclass
class RolloutSummary:
    """Figures over the episodes of a rollout. Returns are over the episodes that did not fail;
    ``success_rate`` is None unless a ``success`` predicate was given."""

    episodes: int
    completed: int
    errors: int
    truncated: int
    steps: int
    mean_return: float
    std_return: float
    min_return: float
    max_return: float
    success_rate: Optional[float]
    wall_s: float
    episodes_per_s: float
    steps_per_s: float

    def to_json(self) -> Dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in vars(self).items()}

    def __str__(self) -> str:
        success = "" if self.success_rate is None else f", success {self.success_rate:.1%}"
        return (
            f"{self.episodes} episodes ({self.errors} failed, {self.truncated} truncated), {self.steps} steps: "
            f"return {self.mean_return:.3f} ± {self.std_return:.3f}{success}; "
            f"{self.episodes_per_s:.1f} episodes/s, {self.steps_per_s:.1f} steps/s in {self.wall_s:.2f} s"
        )


@dataclass
class RolloutResult:
    """The episodes of a rollout, in the order they were asked for, and their summary."""

    episodes: List[Episode]
    summary: RolloutSummary

    def advantages(self, eps: float = 1e-6) -> List[float]:
        """Each episode's return normalised within its group (see :func:`group_advantages`); a
        failed episode gets 0 and does not count in its group's mean and spread."""
        ok = [e for e in self.episodes if e.ok]
        values = group_advantages([e.total_return for e in ok], [e.group for e in ok], eps=eps)
        by_index = {e.index: a for e, a in zip(ok, values, strict=True)}
        return [by_index.get(e.index, 0.0) for e in self.episodes]


def group_advantages(
    returns: Sequence[float], groups: Sequence[Hashable], eps: float = 1e-6, scale: bool = True
) -> List[float]:
    """GRPO advantages: ``(r - mean of its group) / (std of its group + eps)``.

    ``groups[i]`` names the group of ``returns[i]`` (rollouts from the same start). A group whose
    returns are all equal gives 0 to each (nothing to learn from it). ``scale=False`` only
    centres (Dr. GRPO's variant). The standard deviation is the population one.
    """
    if len(returns) != len(groups):
        raise ValueError(f"{len(returns)} returns but {len(groups)} group labels")
    members: Dict[Hashable, List[float]] = {}
    for value, group in zip(returns, groups, strict=True):
        members.setdefault(group, []).append(float(value))
    moments = {g: (statistics.fmean(v), statistics.pstdev(v)) for g, v in members.items()}
    out = []
    for value, group in zip(returns, groups, strict=True):
        mean, std = moments[group]
        centred = float(value) - mean
        out.append(centred / (std + eps) if scale else centred)
    return out


def rollout(
    env: EnvSource,
    policy: Policy,
    episodes: Union[int, Sequence[Dict[str, Any]]],
    **options: Any,
) -> RolloutResult:
    """Blocking form of :func:`rollout_async` (same arguments). From inside a running event loop
    (a notebook) it runs the rollout on a thread of its own."""
    coro = rollout_async(env, policy, episodes, **options)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: Dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = asyncio.run(coro)
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, name="openenv-rollout")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


async def rollout_async(
    env: EnvSource,
    policy: Policy,
    episodes: Union[int, Sequence[Dict[str, Any]]],
    *,
    group_size: int = 1,
    concurrency: int = 8,
    max_steps: Optional[int] = None,
    client_cls: type = GenericEnvClient,
    success: Optional[Callable[[Episode], bool]] = None,
    on_error: str = "record",
    jsonl_path: Optional[Union[str, Path]] = None,
    progress: bool = False,
    policy_in_thread: bool = False,
    capacity_timeout_s: float = 60.0,
    branch_at: Optional[int] = None,
) -> RolloutResult:
    """Play episodes of ``env`` with ``policy`` over ``concurrency`` sessions at once.

    ``env`` is where the sessions come from: a server URL (``http://...`` or ``unix://...``; each
    session is a ``client_cls``, :class:`GenericEnvClient` by default, which speaks dicts); a
    client (connected, so its server runs; each session is a new client of the same class on the
    same server); or a factory returning a fresh, unconnected client (or an awaitable of one).
    The rollout opens its sessions and closes them at the end.

    ``episodes`` is a count (each episode resets with no arguments) or a list of reset kwargs,
    e.g. ``[{"seed": 0}, {"seed": 1}]``; each entry is played ``group_size`` times, and those
    episodes form one group. An episode ends when the environment says ``done`` or after
    ``max_steps`` actions. ``policy(observation, episode)`` returns the next action; a sync
    policy runs on the event loop (``policy_in_thread=True`` runs it in a worker thread so that
    slow ones overlap), an async one is awaited (and can batch the requests of concurrent
    sessions, see :class:`BatchedPolicy`).

    ``success(episode) -> bool`` defines the success rate of the summary. ``on_error="record"``
    keeps a failed episode with its error and goes on; ``"raise"`` stops at the first failure.
    ``jsonl_path`` gets one JSON line per episode as it finishes; ``progress`` shows a bar on
    stderr.

    ``concurrency`` may exceed what the server holds: a session the server refuses as full
    (``CapacityReachedError``, before its episode began) waits for a session of this rollout to
    let go of its slot, or retries every second or so, and the episode is played then. Only when
    none of this rollout's sessions holds a slot for ``capacity_timeout_s`` (the server is full
    of others' sessions) is the episode recorded as failed.

    ``branch_at=k`` branches each group at step ``k`` (GRPO groups that share a prefix): one
    episode is reset and played for ``k`` actions, then its session is forked
    (``EnvClient.fork``) into the group's ``group_size - 1`` others, and all ``group_size``
    continue from that same state with the policy to their ends. The environment must support
    snapshots (``SUPPORTS_SNAPSHOT``). Each episode's history starts with the shared prefix
    (``Episode.branched_at`` says where it forked), so :meth:`RolloutResult.advantages`
    compares continuations of one state within each group. A group uses ``group_size``
    sessions at once, and ``concurrency // group_size`` groups play at once (at least one). A
    group whose episode ends before step ``k`` has nothing to branch: its other episodes are
    recorded as failed, saying so.
    """
    if on_error not in _ON_ERROR:
        raise ValueError(f"on_error must be 'record' or 'raise', got {on_error!r}")
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if max_steps is not None and max_steps < 0:
        raise ValueError(f"max_steps must be >= 0, got {max_steps}")
    if not capacity_timeout_s >= 0:
        raise ValueError(f"capacity_timeout_s must be >= 0, got {capacity_timeout_s}")
    if branch_at is not None and (isinstance(branch_at, bool) or not isinstance(branch_at, int) or branch_at < 0):
        raise ValueError(f"branch_at must be a whole number of steps >= 0, got {branch_at!r}")
    starts = [{} for _ in range(episodes)] if isinstance(episodes, int) else [dict(k) for k in episodes]
    plan = [
        Episode(index=g * group_size + i, group=g, reset_kwargs=kwargs)
        for g, kwargs in enumerate(starts)
        for i in range(group_size)
    ]
    factory = _session_factory(env, client_cls)
    call_policy = _policy_caller(policy, policy_in_thread)
    pending = collections.deque(plan)
    capacity = _Capacity()
    sink = _Sink(jsonl_path, len(plan), progress)
    began = time.perf_counter()
    if branch_at is not None:
        try:
            await _branched(plan, group_size, branch_at, factory, call_policy, max_steps, concurrency, on_error, sink)
        finally:
            sink.close()
        return RolloutResult(plan, summarize(plan, time.perf_counter() - began, success))

    async def session(number: int) -> None:
        client = None
        holds = False  # the client holds one of the server's slots (its first reset was answered)
        refused_since: Optional[float] = None  # when the server first refused this session as full
        try:
            while pending:
                episode = pending.popleft()
                episode.session = number
                try:
                    if client is None:
                        client = await _open(factory)
                    await _play(client, episode, call_policy, max_steps)
                except CapacityReachedError as exc:
                    if client is not None:
                        await _close(client)
                        client = None
                    if holds:  # its connection was replaced (and refused): the slot went with it
                        holds = False
                        capacity.let_go()
                    now = time.perf_counter()
                    refused_since = refused_since or now
                    waited = now - refused_since
                    if episode.observations or not (capacity.held or waited < capacity_timeout_s):
                        episode.error = (
                            _capacity_error(waited) if not episode.observations else f"{type(exc).__name__}: {exc}"
                        )
                        sink.write(episode)
                        if on_error == "raise":
                            raise
                        continue
                    episode.started_at = episode.duration_s = episode.reset_s = 0.0
                    pending.appendleft(episode)  # played once a slot is free
                    await capacity.changed(timeout_s=1.0)
                    continue
                except Exception as exc:
                    episode.error = f"{type(exc).__name__}: {exc}"
                    sink.write(episode)
                    if on_error == "raise":
                        raise
                    if client is not None and isinstance(exc, _CONNECTION_LOST):
                        # Its session is gone: the next episode opens a fresh client (a factory
                        # may hand one of another server, e.g. a pool's replica that answers).
                        await _close(client)
                        client = None
                        if holds:
                            holds = False
                            capacity.let_go()
                else:
                    sink.write(episode)
                if not holds and client is not None:
                    holds, refused_since = True, None
                    capacity.held += 1
        finally:
            if client is not None:
                await _close(client)
            if holds:
                capacity.let_go()

    workers = [asyncio.ensure_future(session(n)) for n in range(min(concurrency, len(plan)))]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    finally:
        sink.close()
    wall = time.perf_counter() - began
    return RolloutResult(plan, summarize(plan, wall, success))


def summarize(
    episodes: Sequence[Episode], wall_s: float, success: Optional[Callable[[Episode], bool]] = None
) -> RolloutSummary:
    """The :class:`RolloutSummary` of ``episodes`` played in ``wall_s`` seconds."""
    ok = [e for e in episodes if e.ok]
    returns = [e.total_return for e in ok]
    steps = sum(len(e.rewards) for e in episodes)
    nan = float("nan")
    return RolloutSummary(
        episodes=len(episodes),
        completed=len(ok),
        errors=len(episodes) - len(ok),
        truncated=sum(e.truncated for e in ok),
        steps=steps,
        mean_return=statistics.fmean(returns) if returns else nan,
        std_return=statistics.pstdev(returns) if returns else nan,
        min_return=min(returns) if returns else nan,
        max_return=max(returns) if returns else nan,
        success_rate=(sum(bool(success(e)) for e in ok) / len(ok) if ok else nan) if success else None,
        wall_s=wall_s,
        episodes_per_s=len(episodes) / wall_s if wall_s > 0 else nan,
        steps_per_s=steps / wall_s if wall_s > 0 else nan,
    )


class BatchedPolicy:
    """An async policy that answers the concurrent requests of many sessions with one call.

    ``fn(observations, episodes) -> actions`` receives the requests gathered so far (up to
    ``max_batch``; it waits ``max_wait_s`` for more once the first arrives) and returns one action
    per request. It runs on the event loop, or in a worker thread with ``in_thread=True``. Use it
    for a model whose forward pass costs about the same for 1 input as for 16 (an LLM, a
    transformer on CPU).
    """

    def __init__(
        self,
        fn: Callable[[List[Any], List[Episode]], Sequence[Any]],
        max_batch: int = 64,
        max_wait_s: float = 0.002,
        in_thread: bool = False,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.fn = fn
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.in_thread = in_thread
        self.batch_sizes: List[int] = []
        self._pending: List[tuple] = []
        self._flusher: Optional[asyncio.Task] = None

    async def __call__(self, observation: Any, episode: Episode) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((observation, episode, future))
        if len(self._pending) >= self.max_batch:
            await self._flush()
        elif self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_later())
        return await future

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.max_wait_s)
        await self._flush()

    async def _flush(self) -> None:
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
        if not batch:
            return
        observations = [item[0] for item in batch]
        episodes = [item[1] for item in batch]
        self.batch_sizes.append(len(batch))
        try:
            if self.in_thread:
                actions = await asyncio.to_thread(self.fn, observations, episodes)
            else:
                actions = self.fn(observations, episodes)
            actions = list(actions)
            if len(actions) != len(batch):
                raise ValueError(f"the batched policy returned {len(actions)} actions for {len(batch)} requests")
        except Exception as exc:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, _, future), action in zip(batch, actions, strict=True):
            if not future.done():
                future.set_result(action)
        if self._pending and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.ensure_future(self._flush_later())


# --- internals ------------------------------------------------------------------------------------


class _Capacity:
    """How many of a rollout's sessions hold a server slot, and a wake-up when one lets go."""

    def __init__(self) -> None:
        self.held = 0
        self._event = asyncio.Event()

    def let_go(self) -> None:
        self.held -= 1
        self._event.set()
        self._event = asyncio.Event()  # later waiters wait for the next one

    async def changed(self, timeout_s: float) -> None:
        """Until a session lets go of its slot, or ``timeout_s`` (a slot others freed is found by retrying)."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass


def _capacity_error(waited_s: float) -> str:
    return (
        f"CapacityReachedError: the server stayed full for {waited_s:.0f} s while no session of this rollout "
        "held a slot (raise its max_concurrent_envs, or capacity_timeout_s to wait longer)"
    )


async def _play(
    client: Any,
    episode: Episode,
    call_policy: Callable[..., Awaitable[Any]],
    max_steps: Any,
    stop_at: Optional[int] = None,
) -> None:
    """Reset, then step until done, ``max_steps`` (truncated) or ``stop_at`` actions (a branch point)."""
    episode.started_at = time.time()
    began = time.perf_counter()
    try:
        result = await client.reset(**episode.reset_kwargs)
        episode.reset_s = time.perf_counter() - began
        episode.observations.append(result.observation)
        episode.done = bool(result.done)
        await _steps(client, episode, call_policy, max_steps, stop_at)
    finally:
        episode.duration_s = time.perf_counter() - began


async def _steps(
    client: Any,
    episode: Episode,
    call_policy: Callable[..., Awaitable[Any]],
    max_steps: Any,
    stop_at: Optional[int] = None,
) -> None:
    """Step ``episode`` on from its last observation (see :func:`_play`)."""
    while not episode.done:
        if max_steps is not None and episode.step >= max_steps:
            episode.truncated = True
            break
        if stop_at is not None and episode.step >= stop_at:
            break
        tick = time.perf_counter()
        action = await call_policy(episode.observations[-1], episode)
        tock = time.perf_counter()
        episode.policy_s.append(tock - tick)
        episode.actions.append(action)
        result = await client.step(action)
        episode.step_s.append(time.perf_counter() - tock)
        episode.rewards.append(float(result.reward or 0.0))
        episode.observations.append(result.observation)
        episode.done = bool(result.done)


async def _branched(
    plan: List[Episode],
    group_size: int,
    branch_at: int,
    factory: Callable[[], Any],
    call_policy: Callable[..., Awaitable[Any]],
    max_steps: Any,
    concurrency: int,
    on_error: str,
    sink: _Sink,
) -> None:
    """Each group: one episode played to ``branch_at`` actions, forked into the group's other
    episodes, then every one of them played on to its end (see :func:`rollout_async`)."""
    groups_at_once = asyncio.Semaphore(max(1, concurrency // group_size))

    async def group(members: List[Episode]) -> None:
        trunk, branches = members[0], members[1:]
        async with groups_at_once:
            client = None
            try:
                client = await _open(factory)
                await _play(client, trunk, call_policy, max_steps, stop_at=branch_at)
                if trunk.done or trunk.truncated:
                    why = "ended" if trunk.done else "was cut off by max_steps"
                    for branch in branches:
                        branch.error = (
                            f"the group's episode {why} after {trunk.step} step(s), before branch_at={branch_at}: "
                            "nothing to branch from"
                        )
                    return
                forks = await client.fork(len(branches)) if branches else []
                for branch in branches:
                    _take_prefix(branch, trunk)
                    branch.branched_at = branch_at
                trunk.branched_at = branch_at

                async def play_on(session: Any, episode: Episode) -> None:
                    began = time.perf_counter() - episode.duration_s
                    try:
                        await _steps(session, episode, call_policy, max_steps)
                    except Exception as exc:
                        episode.error = f"{type(exc).__name__}: {exc}"
                    finally:
                        episode.duration_s = time.perf_counter() - began

                await asyncio.gather(*(play_on(s, e) for s, e in zip([client, *forks], members, strict=True)))
            except Exception as exc:
                for episode in members:
                    if episode.error is None and not (episode.done or episode.truncated):
                        episode.error = f"{type(exc).__name__}: {exc}"
            finally:
                if client is not None:
                    await _close(client)  # (its forks with it)
                for episode in members:
                    sink.write(episode)
        failed = next((e for e in members if e.error is not None), None)
        if failed is not None and on_error == "raise":
            raise RuntimeError(f"episode {failed.index} failed: {failed.error}")

    tasks = [
        asyncio.ensure_future(group(plan[start : start + group_size])) for start in range(0, len(plan), group_size)
    ]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _take_prefix(branch: Episode, trunk: Episode) -> None:
    """``branch`` starts as ``trunk`` is now: its history so far, shared up to the branch point."""
    branch.session = trunk.session
    branch.started_at = trunk.started_at
    branch.reset_s = trunk.reset_s
    branch.duration_s = trunk.duration_s
    branch.observations = list(trunk.observations)
    branch.actions = list(trunk.actions)
    branch.rewards = list(trunk.rewards)
    branch.step_s = list(trunk.step_s)
    branch.policy_s = list(trunk.policy_s)


def _policy_caller(policy: Policy, in_thread: bool) -> Callable[..., Awaitable[Any]]:
    if not callable(policy):
        raise TypeError(f"policy must be callable as policy(observation, episode), got {policy!r}")
    is_async = inspect.iscoroutinefunction(policy) or inspect.iscoroutinefunction(type(policy).__call__)

    async def call(observation: Any, episode: Episode) -> Any:
        if is_async:
            return await policy(observation, episode)
        if in_thread:
            action = await asyncio.to_thread(policy, observation, episode)
        else:
            action = policy(observation, episode)
        if inspect.isawaitable(action):
            action = await action
        return action

    return call


def _session_factory(env: EnvSource, client_cls: type) -> Callable[[], Any]:
    if isinstance(env, str):
        return lambda: client_cls(base_url=env)
    if isinstance(env, SyncEnvClient):
        env = env.async_client
    if isinstance(env, EnvClient):
        template = env
        if template.base_url is None:
            raise ValueError(
                f"{type(template).__name__} has no server yet: connect it first (`with client:` or "
                "client.connect()) so that its provider starts the server, or pass a URL"
            )
        return lambda: type(template)(**template._clone_kwargs())
    if callable(env):
        return env
    raise TypeError(f"env must be a URL, a client or a factory of clients, got {env!r}")


async def _open(factory: Callable[[], Any]) -> Any:
    client = factory()
    if inspect.isawaitable(client):
        client = await client
    if isinstance(client, SyncEnvClient):
        raise TypeError("the client factory returned a sync client; return the async client (no .sync())")
    if not isinstance(client, EnvClient):
        raise TypeError(f"the client factory must return an EnvClient, got {client!r}")
    client._claim(Usage.ASYNC)
    await client._connect_async()
    return client


async def _close(client: Any) -> None:
    try:
        await client._close_async()
    except Exception:  # a session that cannot close cleanly must not hide the rollout's result
        pass


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data: pydantic models dumped, dataclasses and containers walked."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    tolist = getattr(value, "tolist", None)  # numpy arrays, tensors
    if callable(tolist):
        return _plain(tolist())
    if hasattr(value, "__dataclass_fields__"):
        return _plain(vars(value))
    return repr(value)


class _Sink:
    """Where finished episodes go: the JSONL file and the progress bar."""

    def __init__(self, jsonl_path: Any, total: int, progress: bool) -> None:
        self._file: Optional[IO[str]] = None
        if jsonl_path is not None:
            path = Path(jsonl_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")
        self._bar: Any = None
        self._task: Any = None
        self._returns: List[float] = []
        self._errors = 0
        if progress:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("rollout"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[note]}"),
                console=Console(file=sys.stderr),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("rollout", total=total, note="")

    def write(self, episode: Episode) -> None:
        if self._file is not None:
            self._file.write(json.dumps(episode.to_json(), allow_nan=False) + "\n")
            self._file.flush()
        if self._bar is not None:
            if episode.ok:
                self._returns.append(episode.total_return)
            else:
                self._errors += 1
            mean = statistics.fmean(self._returns) if self._returns else float("nan")
            self._bar.update(self._task, advance=1, note=f"mean return {mean:.3f}, {self._errors} failed")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
