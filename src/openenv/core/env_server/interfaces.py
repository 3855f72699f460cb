"""The environment contract.

An environment is a Python object with three operations over typed pydantic models:

* ``reset(seed=None, episode_id=None, **kwargs) -> Observation`` starts a new episode and returns
  its first observation. It must be called before ``step``. With the same ``seed`` an environment
  should produce the same episode (``openenv validate`` and ``check_env`` check this).
* ``step(action, timeout_s=None, **kwargs) -> Observation`` applies one action. The observation
  carries ``reward`` (for this step, ``None`` if the environment gives none) and ``done`` (the
  episode is over: call ``reset`` before stepping again).
* ``state`` (a property) returns the episode's :class:`State` (``episode_id``, ``step_count``, and
  any extra fields).

The server runs one instance per session. Instances of an environment whose
``SUPPORTS_CONCURRENT_SESSIONS`` is true may live side by side in one process; the server then
calls each instance from one task at a time, so an environment never needs its own locking.

An environment written with ``async def reset_async`` / ``step_async`` runs on the server's event
loop (it must not block). One that implements only the sync methods runs in the server's worker
pool; one that must always run on the same thread sets ``REQUIRES_SINGLE_THREAD_EXECUTOR``; one
whose sync calls are short and never block may set ``RUNS_ON_EVENT_LOOP`` to have them called on
the event loop (see :attr:`Environment.RUNS_ON_EVENT_LOOP` for its cost).

Snapshots (an extension of ours). An environment whose class sets ``SUPPORTS_SNAPSHOT`` can save
its session's state and load it back, so that a client can fork a session mid-episode, save it
and restore it on another server (``EnvClient.fork``, ``snapshot``, ``restore``):

* ``snapshot_state() -> data`` returns the state as plain Python data; ``restore_state(data)``
  makes this instance continue exactly as the one that saved it would. The server carries the
  data in its own exact format (:mod:`.snapshot_data`), seals it with its key, and loads it only
  into an instance of the same class and ``SNAPSHOT_VERSION``.
* By default both work on the instance's attributes (all but ``host`` and the names in
  ``SNAPSHOT_EXCLUDE`` of its class and of every base class, which keep the restoring
  instance's values): right for an environment
  whose state is plain Python data (numbers, strings, containers, pydantic models, dataclasses,
  ``random.Random``, NumPy arrays). An attribute a snapshot cannot carry (an open file, a
  subprocess, a lock, a lambda) is refused by name.
* An environment that holds outside resources (a workspace directory, a REPL process, a game
  engine's native state) overrides the two, saving what those resources hold (the files, the
  engine's own serialisation) and rebuilding them on restore; it may call ``super()`` for the
  rest. Where its state cannot be saved exactly, it leaves ``SUPPORTS_SNAPSHOT`` false, and
  snapshots are refused rather than approximated.
* An environment that can save some sessions exactly and not others (a game whose engine cannot
  serialise every position, a process running work of its own) refuses those from
  ``snapshot_state`` with :class:`~.exceptions.SnapshotUnsupportedError` ``(why)``: the client
  gets ``NOT_SUPPORTED`` with that reason, and the session goes on untouched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from abc import ABC, abstractmethod
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    List,
    Optional,
    Protocol,
    Tuple,
    TypeVar,
    runtime_checkable,
)

from typing_extensions import TypedDict

from .types import Action, EnvironmentMetadata, Observation, State

if TYPE_CHECKING:  # pragma: no cover
    from ..rubrics import Rubric

ActT = TypeVar("ActT", bound=Action)
ObsT = TypeVar("ObsT", bound=Observation)
StateT = TypeVar("StateT", bound=State)


class Message(TypedDict):
    """One chat message in the Hugging Face chat format."""

    role: str
    content: str


@runtime_checkable
class ModelTokenizer(Protocol):
    """What chat environments need of a tokenizer (any Hugging Face tokenizer qualifies)."""

    def apply_chat_template(
        self,
        conversation: List[Message],
        tokenize: bool = True,
        return_tensors: Optional[str] = None,
        **kwargs: Any,
    ) -> Any: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str: ...


class Transform(ABC, Generic[ObsT]):
    """A function from observation to observation, applied by an environment that opts in."""

    @abstractmethod
    def __call__(self, observation: ObsT) -> ObsT:
        raise NotImplementedError


@runtime_checkable
class TaskProvider(Protocol):
    """Optional task catalogue of an environment, served by the Task API routes.

    Define any of these methods on the environment (sync or ``async``). They must work on a
    freshly constructed instance and change nothing. ``get_task`` raises ``IndexError`` when the
    index is out of range. Task selection itself goes through ``reset(split=..., index=...)``.
    """

    def list_splits(self) -> list: ...

    def list_tasks(self, split: str) -> list: ...

    def num_tasks(self, split: str) -> int: ...

    def get_task(self, split: str, index: int) -> Any: ...

    def get_task_range(self, split: str, start: Optional[int] = None, stop: Optional[int] = None) -> list: ...


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


@dataclasses.dataclass(frozen=True)
class EnvironmentHost:
    """What the server an environment instance runs in tells it (:attr:`Environment.host`).

    ``mode``: ``"simulation"`` or ``"production"``, the server's mode (an ``MCPEnvironment``
    offers the tools of that mode). ``pool``: the server's worker pool (a
    :class:`~.workers.WorkerPool`), where the environment's own blocking work may run (an
    ``MCPEnvironment`` runs its sync tools there). Both None outside a server."""

    mode: Optional[str] = None
    pool: Any = None


OUTSIDE_A_SERVER = EnvironmentHost()

_NOT_SAVED = frozenset({"host"})
"""Attributes no snapshot carries: the server sets them on each instance it builds."""


def _left_out(cls: type) -> frozenset:
    """What the default snapshot leaves out of an instance of ``cls``: ``host`` and the
    ``SNAPSHOT_EXCLUDE`` of ``cls`` and of each of its bases."""
    names = set(_NOT_SAVED)
    for klass in cls.__mro__:
        excluded = vars(klass).get("SNAPSHOT_EXCLUDE", ())
        names.update((excluded,) if isinstance(excluded, str) else excluded)
    return frozenset(names)


class Environment(ABC, Generic[ActT, ObsT, StateT]):
    """Base class of every environment; see the module docstring for the contract."""

    SUPPORTS_CONCURRENT_SESSIONS: bool = False
    """True when several instances may run in one server process at once."""

    REQUIRES_SINGLE_THREAD_EXECUTOR: bool = False
    """True when every call must happen on one and the same thread (e.g. thread-bound C libraries)."""

    RUNS_ON_EVENT_LOOP: bool = False
    """True to have the server call the sync ``reset``, ``step`` and ``state`` on its event loop
    rather than in its worker pool. It spares each call two thread hand-offs (about a third of a
    trivial step's server CPU), and it has a cost: while one of these calls runs, nothing else in
    the server does, so a slow step stalls every session of that server, and the step timeout
    cannot interrupt it. Set it only where every call is short and never blocks (a board game, a
    grid world); an environment that waits for anything (a subprocess, the network, a sandbox)
    must leave it False. ``close`` still runs in the pool."""

    REPORT_REWARD_COMPONENTS: bool = False
    """True to have ``_apply_rubric`` put the rubric's named part scores (a reward vector) in the
    observation's ``metadata["reward_components"]``, as ``{"dotted.name": score}``."""

    ANSWERS_MCP: bool = False
    """True for an environment that answers MCP's ``tools/list`` and ``tools/call`` itself
    (``fastmcp_tools``, ``call_tool_payload``): :class:`~.mcp_environment.MCPEnvironment` sets it.
    The server runs such an environment's MCP actions on its event loop."""

    SUPPORTS_SNAPSHOT: bool = False
    """True when ``snapshot_state`` / ``restore_state`` save and load this environment's session
    exactly (see the module docstring); the server refuses snapshots of one that does not say so."""

    SNAPSHOT_VERSION: int = 1
    """The layout of what ``snapshot_state`` saves: raise it when that changes, and snapshots of
    the other layout are refused instead of loaded wrongly."""

    SNAPSHOT_EXCLUDE: Tuple[str, ...] = ()
    """Attributes the default ``snapshot_state`` leaves out (caches, handles rebuilt by the
    constructor): a restored instance keeps its own values of them. A class's names add to its
    base classes' (a subclass of :class:`~.mcp_environment.MCPEnvironment` names only its own
    attributes; the base's FastMCP server and tables stay out as well)."""

    GRADER_TOOLS: Tuple[str, ...] = ()
    """Names of MCP tools for the grader only (see docs/roles.md): an agent never sees them in
    ``tools/list`` and cannot call them; a grader sees and calls only these; the orchestrator all."""

    host: EnvironmentHost = OUTSIDE_A_SERVER
    """The server this instance runs in: its mode and worker pool (:class:`EnvironmentHost`). The
    server sets it on each instance it builds, before the first call; an instance used on its
    own keeps the default (no mode, no pool)."""

    def __init__(self, transform: Optional[Transform] = None, rubric: Optional[Rubric] = None) -> None:
        self.transform = transform
        self.rubric = rubric

    @abstractmethod
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ObsT:
        """Start a new episode and return its first observation."""

    @abstractmethod
    def step(self, action: ActT, timeout_s: Optional[float] = None, **kwargs: Any) -> ObsT:
        """Apply ``action`` and return the next observation (with its reward and ``done``)."""

    async def reset_async(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ObsT:
        """Async ``reset``. Override it to run on the event loop instead of the worker pool."""
        return self.reset(seed=seed, episode_id=episode_id, **kwargs)

    async def step_async(self, action: ActT, timeout_s: Optional[float] = None, **kwargs: Any) -> ObsT:
        """Async ``step``. Override it to run on the event loop instead of the worker pool."""
        return self.step(action, timeout_s=timeout_s, **kwargs)

    @property
    @abstractmethod
    def state(self) -> StateT:
        """The current episode's state."""

    def get_metadata(self) -> EnvironmentMetadata:
        """Name, description and version shown by ``GET /metadata``."""
        name = type(self).__name__
        return EnvironmentMetadata(name=name, description=f"{name} environment", version="1.0.0")

    def close(self) -> None:
        """Release resources; called when the session ends. Must be safe to call twice."""

    def grade(self) -> Any:
        """The grader's check of this episode (an oracle, the task's test suite): what it finds,
        as JSON-ready data. The server runs it for the grader role on a copy of the session
        restored from a snapshot (``POST /openenv/grade``, see docs/roles.md), never on the
        session itself, so it may change what it likes. Needs ``SUPPORTS_SNAPSHOT``."""
        raise NotImplementedError

    def workspace_dir(self) -> Optional[Path]:
        """The directory this session's agent works in, for the grader's diff (``POST
        /openenv/diff``, see docs/roles.md), or None: an environment with a work directory
        overrides it. The server walks it right after each ``reset`` (and ``restore_state``), in
        the same call, and compares it with that later, never following a link. Called on the
        environment's own thread, like ``reset``."""
        return None

    def snapshot_state(self) -> Any:
        """This session's state as plain Python data (see the module docstring). By default, the
        instance's attributes but ``host`` and those in ``SNAPSHOT_EXCLUDE``."""
        left_out = _left_out(type(self))
        return {name: value for name, value in vars(self).items() if name not in left_out}

    def restore_state(self, data: Any) -> None:
        """Continue from ``data``, what ``snapshot_state`` of an instance of this class returned.
        By default, the instance's attributes become those saved (those left out stay)."""
        left_out = _left_out(type(self))
        kept = {name: value for name, value in vars(self).items() if name in left_out}
        vars(self).clear()
        vars(self).update(data)
        vars(self).update(kept)

    # --- helpers environments call themselves ---------------------------------------------

    def _apply_transform(self, observation: ObsT) -> ObsT:
        transform = getattr(self, "transform", None)
        return transform(observation) if transform is not None else observation

    def _apply_rubric(self, action: ActT, observation: ObsT) -> float:
        """The rubric's score for this step (0.0 without a rubric).

        An async rubric (an ``LLMJudge``, say) is run to completion when this thread has no
        event loop, as in the server's worker pool; inside a running loop call
        ``await self._apply_rubric_async(...)`` instead. With ``REPORT_REWARD_COMPONENTS`` the
        observation's metadata also gets ``"reward_components"``.
        """
        rubric = getattr(self, "rubric", None)
        if rubric is None:
            return 0.0
        score = rubric(action, observation)
        if inspect.isawaitable(score) and not isinstance(score, float):  # a float is a rubrics.Score: done
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                score = asyncio.run(_awaited(score))
            else:
                if inspect.iscoroutine(score):
                    score.close()
                raise TypeError(
                    f"{type(rubric).__name__} is async and this thread runs an event loop: "
                    "use 'await self._apply_rubric_async(action, observation)' in step_async"
                )
        self._report_reward_components(observation)
        return float(score)

    async def _apply_rubric_async(self, action: ActT, observation: ObsT) -> float:
        """``_apply_rubric`` for ``step_async``: awaits an async rubric on the running loop."""
        rubric = getattr(self, "rubric", None)
        if rubric is None:
            return 0.0
        score = rubric(action, observation)
        if inspect.isawaitable(score):
            score = await score
        self._report_reward_components(observation)
        return float(score)

    def _report_reward_components(self, observation: ObsT) -> None:
        if not self.REPORT_REWARD_COMPONENTS:
            return
        component_scores = getattr(self.rubric, "component_scores", None)
        if component_scores is None:
            return
        metadata = getattr(observation, "metadata", None)
        if isinstance(metadata, dict):
            metadata["reward_components"] = component_scores()

    def _reset_rubric(self) -> None:
        rubric = getattr(self, "rubric", None)
        if rubric is not None:
            rubric.reset()

    async def _reset_rubric_async(self) -> None:
        rubric = getattr(self, "rubric", None)
        if rubric is None:
            return
        reset_async = getattr(rubric, "reset_async", None)
        if reset_async is not None:
            await reset_async()
        else:
            rubric.reset()

    # --- web interface hooks ----------------------------------------------------------------

    def render_web(self, observation: dict) -> Optional[str]:
        """HTML drawn for an observation in the web playground, or None."""
        return None

    def web_actions(self, observation: dict) -> List[Tuple[str, dict]]:
        """One-click actions ``(label, action_dict)`` offered by the web playground."""
        return []
