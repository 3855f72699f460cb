"""Whole rollouts for trainers: an environment session, a harness that drives it, a verdict.

Upstream OpenEnv 0.10's trainer-side API (``openenv.core.harness``), in four roles:

* a :class:`ResourceSession` is one episode of an environment, seen as an agent sees it: the
  opening messages, a list of tools, ``call_tool``, and ``verify`` once the agent stopped, whose
  :class:`VerifyResult` forwards the reward the *environment* produced. A
  :class:`ResourceSessionFactory` makes one per rollout (``create(task, seed=, episode_id=)``);
  :class:`StepEnvSessionAdapter` makes any reset/step client (ours, or anything with
  ``reset``/``step``) such a session;
* a :class:`HarnessAdapter` runs the episode: ``run_white_box`` lets the trainer sample every
  turn through a :class:`ModelStep` (:class:`MCPHarnessAdapter`), ``run_black_box`` lets an agent
  own its loop and reach the tools through :class:`SessionMCPBridge` (:class:`CLIHarnessAdapter`);
* sessions whose agent owns the loop and whose model calls were captured are
  :class:`LoopOwningSession` / :class:`TrainableSession` (``fetch_training_trace``);
* :func:`build_harness_rollout_func` puts it together as a TRL ``rollout_func``.

Where upstream's behaviour hurts training this keeps the API and fixes the behaviour:
:class:`MCPHarnessAdapter` keeps each turn's tokens apart (:attr:`HarnessRolloutResult.steps`,
besides upstream's flat lists), hands the model a copy of the conversation, answers every tool
call it did not run, and shows a failing tool to the model as an error instead of aborting; the
rollout function runs its prompts concurrently, seeds each session, and records a failed prompt
(reward ``None``) instead of failing the batch.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import logging
import math
import threading
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generic,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    runtime_checkable,
)

from ..llm_client import LLMResponse
from .tools import RESERVED_TOOL_NAMES, resolve_tool_conflicts, tool_name
from .training import TraceEntry, TrainingTrace, TrainingTurn

if TYPE_CHECKING:  # pragma: no cover
    from openenv.core.env_server.mcp_types import Tool

__all__ = [
    "CLIHarnessAdapter",
    "HarnessAdapter",
    "HarnessRolloutResult",
    "HarnessRunLimits",
    "LoopOwningSession",
    "MCPHarnessAdapter",
    "Message",
    "ModelStep",
    "ModelStepResult",
    "RESERVED_TOOL_NAMES",
    "ResourceSession",
    "ResourceSessionFactory",
    "RolloutEvent",
    "SessionMCPBridge",
    "StepEnvSessionAdapter",
    "ToolResult",
    "ToolTraceEntry",
    "TrainableSession",
    "VerifyResult",
    "build_harness_rollout_func",
    "resolve_tool_conflicts",
]

logger = logging.getLogger("openenv.harness")

Message = Dict[str, Any]
"""One chat message in OpenAI's format (``{"role": ..., "content": ...}``, tool calls, tool results)."""


# --- data -----------------------------------------------------------------------------------------


@dataclass
class ToolResult:
    """What one tool call gave back: its value, whether it ended the episode, and why it failed."""

    data: Any = None
    done: bool = False
    metadata: Dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None


@dataclass
class VerifyResult:
    """A finished rollout judged by its environment.

    ``env_reward`` forwards a reward the environment itself produced (``None``: it produced
    none); it is never made up outside the environment. :func:`build_harness_rollout_func`
    checks it against the rewards the rollout's tool calls reported.
    """

    env_reward: Optional[float] = None
    done: bool = False
    metrics: Dict[str, Any] = field(default_factory=dict)
    artifacts: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutEvent:
    """One thing that happened in a rollout (``model_response``, ``tool_call``, ``tool_call_skipped``)."""

    type: str
    payload: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolTraceEntry:
    """One tool call the harness made on the session, with its result."""

    tool_name: str
    arguments: Dict[str, Any]
    result: ToolResult


@dataclass
class ModelStepResult:
    """One model turn: the parsed reply, and the engine's own token ids and logprobs for it.

    ``prompt_ids`` is the engine's tokenisation of the turn's prompt, ``completion_ids`` what it
    sampled, ``logprobs`` one per completion id (empty lists when the step has no tokens)."""

    response: LLMResponse
    prompt_ids: List[int] = field(default_factory=list)
    completion_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)


@dataclass
class HarnessRolloutResult:
    """A rollout as a harness ran it.

    ``messages`` is the whole conversation, ``tool_trace`` every tool call made on the session,
    ``events`` what happened in order, ``done`` whether the episode ended (the model stopped
    calling tools, or a tool ended it). ``steps`` holds each model turn's tokens apart
    (:class:`ModelStepResult`, one per turn): that is what a trainer learns from, and what
    :meth:`training_trace` turns into a :class:`TrainingTrace`. ``prompt_ids``,
    ``completion_ids`` and ``logprobs`` are upstream's flat lists, every turn's concatenated, kept
    for code written against upstream. ``metrics`` has ``turns``, ``tool_calls``, ``stop_reason``
    and, where they apply, ``truncated``, ``skipped_tool_calls``, ``tool_errors``, ``aborted``.
    """

    messages: List[Message] = field(default_factory=list)
    tool_trace: List[ToolTraceEntry] = field(default_factory=list)
    events: List[RolloutEvent] = field(default_factory=list)
    done: bool = False
    metrics: Dict[str, Any] = field(default_factory=dict)
    prompt_ids: List[int] = field(default_factory=list)
    completion_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    steps: List[ModelStepResult] = field(default_factory=list)

    def training_trace(self) -> TrainingTrace:
        """The model turns as a validated :class:`TrainingTrace` (one turn per step, loss over the completion).

        Each turn's ``request.messages`` is the conversation the model was shown, its ``response``
        the reply; ``ValueError`` when a step carries no usable tokens (a model step that returned
        none, or logprobs that do not match the completion)."""
        starts = [e.payload.get("message_index") for e in self.events if e.type == "model_response"]
        turns = []
        for i, step in enumerate(self.steps):
            start = starts[i] if i < len(starts) else None
            request: Dict[str, Any] = {"messages": list(self.messages[:start])} if isinstance(start, int) else {}
            turns.append(
                TrainingTurn(
                    node_id=f"turn-{i}",
                    prompt_token_ids=list(step.prompt_ids),
                    completion_token_ids=list(step.completion_ids),
                    per_token_logps=[float(x) for x in step.logprobs],
                    loss_mask=[0] * len(step.prompt_ids) + [1] * len(step.completion_ids),
                    request=request,
                    response={"choices": [{"message": step.response.to_message_dict()}]},
                    metadata={"turn": i},
                )
            )
        return TrainingTrace(turns=turns)


@dataclass
class HarnessRunLimits:
    """Bounds of one rollout: model turns, tool calls per turn and in all, and the sampling options
    handed to every model step (``temperature``, ``max_tokens``, ...)."""

    max_turns: int = 10
    max_tool_calls_per_turn: Optional[int] = None
    max_total_tool_calls: Optional[int] = None
    sampling: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tool_calls_per_turn", "max_total_tool_calls"):
            value = getattr(self, name)
            if value is None and name != "max_turns":
                continue
            if type(value) is not int or value < 0:
                raise ValueError(f"HarnessRunLimits.{name} must be a whole number >= 0, got {value!r}")


# --- roles ----------------------------------------------------------------------------------------


@runtime_checkable
class ModelStep(Protocol):
    """The trainer's model for one turn: the conversation so far, the tools, the sampling options
    in; the reply with its tokens out. It gets a copy of the conversation: changing it changes
    nothing in the rollout."""

    def __call__(self, messages: List[Message], tools: List[Tool], sampling: Dict[str, Any]) -> ModelStepResult: ...


@runtime_checkable
class LoopOwningSession(Protocol):
    """A session whose agent runs its own loop; its model calls come back as trace entries."""

    def wait_for_completion(self, timeout_s: Optional[float] = ...) -> int: ...

    def fetch_proxy_trace(self) -> List[TraceEntry]: ...


@runtime_checkable
class TrainableSession(Protocol):
    """A session whose agent runs its own loop and whose model calls were captured token by token."""

    def wait_for_completion(self, timeout_s: Optional[float] = ...) -> int: ...

    def fetch_training_trace(self) -> TrainingTrace: ...


class ResourceSession(ABC):
    """One episode of an environment, as an agent sees it. Not thread-safe except :meth:`close`."""

    @abstractmethod
    def initial_messages(self) -> List[Message]:
        """The conversation the agent starts from (the task, the first observation)."""

    @abstractmethod
    def list_tools(self) -> List[Tool]:
        """The tools the agent may call (MCP ``Tool``: ``name``, ``description``, ``input_schema``)."""

    @abstractmethod
    def call_tool(self, name: str, arguments: Dict[str, Any]) -> ToolResult:
        """Call one tool; ``KeyError`` for a tool that does not exist (or is reserved)."""

    @abstractmethod
    def verify(self, transcript: List[Message], final_state: Optional[Dict[str, Any]] = None) -> VerifyResult:
        """Judge the episode after the harness stopped, with the environment's own reward."""

    @abstractmethod
    def close(self) -> None:
        """Release the episode's resources; safe to call twice, and from another thread."""


SessionT = TypeVar("SessionT")


class ResourceSessionFactory(ABC, Generic[SessionT]):
    """Makes the session of one rollout. GRPO compares the rollouts of one task, so ``seed``
    should pick the task's randomness (every rollout of a group gets the same one); ``episode_id``
    names the rollout."""

    @abstractmethod
    def create(self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None) -> SessionT:
        """A new session for ``task`` (a prompt, a task record: whatever the factory understands)."""


# --- a reset/step client as a session -------------------------------------------------------------


class SessionCallTimeout(TimeoutError):
    """A call on the environment got no answer in time; the session was closed."""


def _plain(value: Any) -> Any:
    """A model object as plain data (what a tool message shows the model), anything else as is."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump()
    return value


def _error_text(observation: Any) -> Optional[str]:
    """The error an observation reports (MCP ``ToolError``, a string field), if any."""
    error = observation.get("error") if isinstance(observation, Mapping) else getattr(observation, "error", None)
    if not error:
        return None
    if isinstance(error, Mapping):
        return str(error.get("message") or error)
    return str(getattr(error, "message", None) or error)


class StepEnvSessionAdapter(ResourceSession):
    """Any reset/step environment client as a :class:`ResourceSession`.

    The constructor resets the episode (``reset_kwargs`` plus ``seed`` / ``episode_id`` when given;
    ``task`` goes to the builders, not to ``reset``) and reads ``state()`` when the client has it;
    if either fails, the client is closed and the error raised. A client with ``.sync()`` (our
    async ``EnvClient``) is driven through it. Each tool call is one ``step``:
    ``action_builder(name, arguments)`` makes the action, ``tool_result_builder(name, arguments,
    step_result, state)`` the :class:`ToolResult` (default: ``data`` = tool name, arguments,
    observation, reward, done; ``metadata`` = reward and state; ``error`` = the observation's
    ``error``). ``initial_messages_builder(reset_result, task)`` makes the opening messages;
    ``verify_builder(transcript, final_state, last_result, last_state)`` the verdict (default: the
    last step's reward and done). Tool names may not be :data:`RESERVED_TOOL_NAMES`.

    ``call_timeout_s`` bounds every call on the client (reset, step, state; ``None``: unbounded).
    A call past it raises :class:`TimeoutError` and closes the session, so an environment that
    never answers costs at most that long, whatever the client's own timeouts are. Bounded calls
    run on a short-lived thread each: a client bound to its caller's thread wants ``None``.
    """

    def __init__(
        self,
        client: Any,
        *,
        task: Any = None,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        tool_specs: Sequence[Tool],
        action_builder: Callable[[str, Dict[str, Any]], Any],
        initial_messages_builder: Callable[[Any, Any], List[Message]],
        tool_result_builder: Optional[Callable[[str, Dict[str, Any], Any, Any], ToolResult]] = None,
        verify_builder: Optional[Callable[[List[Message], Any, Any, Any], VerifyResult]] = None,
        reset_kwargs: Optional[Dict[str, Any]] = None,
        call_timeout_s: Optional[float] = 300.0,
    ) -> None:
        tools = list(tool_specs)
        names = [tool_name(t) for t in tools]
        reserved = sorted({n for n in names if n in RESERVED_TOOL_NAMES})
        if reserved:
            raise ValueError(
                f"tool name(s) {', '.join(reserved)} are reserved for orchestration "
                f"({', '.join(sorted(RESERVED_TOOL_NAMES))}); an agent cannot be given them"
            )
        if call_timeout_s is not None and not call_timeout_s > 0:
            raise ValueError(f"call_timeout_s must be > 0 or None, got {call_timeout_s!r}")
        sync = getattr(client, "sync", None)
        self._client = sync() if callable(sync) else client
        self._task = task
        self._tools = tools
        self._tool_names = set(names)
        self._action_builder = action_builder
        self._initial_messages_builder = initial_messages_builder
        self._tool_result_builder = tool_result_builder
        self._verify_builder = verify_builder
        self._call_timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._broken: Optional[str] = None
        self._step_count = 0
        self._last_result: Any = None
        self._last_state: Any = None
        kwargs = dict(reset_kwargs or {})
        if seed is not None:
            kwargs["seed"] = seed
        if episode_id is not None:
            kwargs["episode_id"] = episode_id
        try:
            self._reset_result = self._call("reset", kwargs)
            self._last_state = self._read_state()
        except BaseException:
            if self._broken is None:  # (a call that timed out is being closed already, off this thread)
                self.close()
            raise

    @property
    def client(self) -> Any:
        """The client the session drives (the sync view of an async one)."""
        return self._client

    @property
    def closed(self) -> bool:
        """Whether the session was closed (by :meth:`close`, or after a call timed out)."""
        return self._closed

    @property
    def step_count(self) -> int:
        """Tool calls (steps) made so far."""
        return self._step_count

    def _read_state(self) -> Any:
        return self._call("state", {}) if callable(getattr(self._client, "state", None)) else None

    def _call(self, what: str, kwargs: Dict[str, Any], *args: Any) -> Any:
        """``client.<what>(*args, **kwargs)``, given up after ``call_timeout_s`` (the session is then closed)."""
        client = self._client
        if self._closed or client is None:
            raise RuntimeError(self._broken or f"the session is closed; {what} cannot run")
        method = getattr(client, what)
        timeout = self._call_timeout_s
        if timeout is None:
            return method(*args, **kwargs)
        outcome: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                outcome.set_result(method(*args, **kwargs))
            except BaseException as exc:  # handed to the caller's thread
                outcome.set_exception(exc)

        # A daemon thread of its own, not a pool's: a call that never returns must not hold up
        # the interpreter's exit (pool threads are joined at exit).
        threading.Thread(target=run, name=f"openenv-session-{what}", daemon=True).start()
        concurrent.futures.wait([outcome], timeout=timeout)
        if outcome.done():
            return outcome.result()
        self._broken = f"{what} got no answer within {timeout:g} s (call_timeout_s); the session was closed"
        self._closed = True  # no further call; close() below still closes the client
        # Closing over a dead link can itself take seconds (the WebSocket's close handshake): the
        # caller is told now, the close finishes behind it, and the stuck call then fails.
        threading.Thread(target=self.close, name="openenv-session-close", daemon=True).start()
        raise SessionCallTimeout(self._broken)

    def initial_messages(self) -> List[Message]:
        return list(self._initial_messages_builder(self._reset_result, self._task))

    def list_tools(self) -> List[Tool]:
        return list(self._tools)

    def call_tool(self, name: str, arguments: Dict[str, Any]) -> ToolResult:
        if name in RESERVED_TOOL_NAMES:
            raise KeyError(f"Reserved orchestration tool: {name}")
        if name not in self._tool_names:
            raise KeyError(f"Unknown tool: {name}")
        if self._closed:
            raise RuntimeError(self._broken or f"the session is closed; {name} cannot run")
        action = self._action_builder(name, arguments)
        result = self._call("step", {}, action)
        self._step_count += 1
        self._last_result = result
        self._last_state = self._read_state()
        if self._tool_result_builder is not None:
            return self._tool_result_builder(name, arguments, result, self._last_state)
        observation = _plain(getattr(result, "observation", None))
        reward = getattr(result, "reward", None)
        done = bool(getattr(result, "done", False))
        return ToolResult(
            data={
                "tool_name": name,
                "arguments": arguments,
                "observation": observation,
                "reward": reward,
                "done": done,
            },
            done=done,
            metadata={"reward": reward, "state": _plain(self._last_state)},
            error=_error_text(observation),
        )

    def verify(self, transcript: List[Message], final_state: Optional[Dict[str, Any]] = None) -> VerifyResult:
        if self._verify_builder is not None:
            return self._verify_builder(transcript, final_state, self._last_result, self._last_state)
        last = self._last_result
        return VerifyResult(
            env_reward=getattr(last, "reward", None) if last is not None else None,
            done=bool(getattr(last, "done", False)) if last is not None else False,
            metrics={"step_count": self._step_count},
            artifacts={
                "final_state": final_state,
                "env_state": _plain(self._last_state),
                "transcript_length": len(transcript),
            },
        )

    def close(self) -> None:
        with self._lock:
            if self._closed and self._client is None:
                return
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> StepEnvSessionAdapter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --- the session as an MCP server (JSON-RPC) ------------------------------------------------------


def _rpc_error(request_id: Any, code: int, message: str) -> Dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message, "data": None}}


def _tool_listing(tool: Any) -> Dict[str, Any]:
    """A tool as MCP's ``tools/list`` shows it (camelCase ``inputSchema``)."""
    if isinstance(tool, Mapping):
        schema = tool.get("inputSchema", tool.get("input_schema", {}))
        return {"name": tool["name"], "description": tool.get("description", ""), "inputSchema": schema}
    return {"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema}


class SessionMCPBridge:
    """A :class:`ResourceSession` as an MCP server: ``handle_request`` answers one JSON-RPC request.

    ``tools/list`` lists the session's tools; ``tools/call`` calls one and answers the
    :class:`ToolResult` (``data``, ``done``, ``metadata``, ``error``). Errors are JSON-RPC errors:
    -32600 not JSON-RPC 2.0, -32601 unknown method or tool, -32602 bad parameters (no name, a
    reserved name, the session's ``ValueError``), -32603 any other failure of the call.
    """

    def __init__(self, session: ResourceSession) -> None:
        self.session = session

    def handle_request(self, request: Dict[str, Any]) -> Dict[str, Any]:
        request_id = request.get("id") if isinstance(request, Mapping) else None
        if not isinstance(request, Mapping) or request.get("jsonrpc") != "2.0":
            return _rpc_error(request_id, -32600, "Invalid Request")
        method = request.get("method")
        params = request.get("params")
        params = {} if params is None else params
        if not isinstance(params, Mapping):
            return _rpc_error(request_id, -32602, "params must be an object")
        if method == "tools/list":
            tools = [_tool_listing(t) for t in self.session.list_tools()]
            return {"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}}
        if method != "tools/call":
            return _rpc_error(request_id, -32601, "Method not found")
        name = params.get("name")
        if not name or not isinstance(name, str):
            return _rpc_error(request_id, -32602, "Missing tool name")
        if name in RESERVED_TOOL_NAMES:  # refused here: the session is never asked
            return _rpc_error(request_id, -32602, f"Reserved orchestration tool: {name}")
        arguments = params.get("arguments")
        arguments = {} if arguments is None else arguments
        if not isinstance(arguments, Mapping):
            return _rpc_error(request_id, -32602, "arguments must be an object")
        try:
            result = self.session.call_tool(name, dict(arguments))
        except KeyError as exc:
            return _rpc_error(request_id, -32601, str(exc.args[0]) if exc.args else f"Unknown tool: {name}")
        except ValueError as exc:
            return _rpc_error(request_id, -32602, str(exc))
        except Exception as exc:
            return _rpc_error(request_id, -32603, str(exc) or type(exc).__name__)
        body = {"data": result.data, "done": result.done, "metadata": result.metadata, "error": result.error}
        return {"jsonrpc": "2.0", "id": request_id, "result": body}


# --- harnesses ------------------------------------------------------------------------------------


class HarnessAdapter(ABC):  # noqa: B024 (upstream's ABC; a subclass implements only the modes it supports)
    """Runs one rollout on a session: ``run_white_box`` with the trainer sampling each turn through
    a :class:`ModelStep`, ``run_black_box`` with an agent that owns its loop. An adapter implements
    the modes it supports; the other raises ``NotImplementedError``. Neither verifies nor closes
    the session: the caller does."""

    def run_white_box(
        self, model_step: ModelStep, session: ResourceSession, limits: Optional[HarnessRunLimits] = None
    ) -> HarnessRolloutResult:
        raise NotImplementedError(f"{type(self).__name__} does not run white-box rollouts (the trainer sampling)")

    def run_black_box(
        self, session: ResourceSession, limits: Optional[HarnessRunLimits] = None
    ) -> HarnessRolloutResult:
        raise NotImplementedError(f"{type(self).__name__} does not run black-box rollouts (an agent's own loop)")


def _tool_message_content(result: ToolResult) -> str:
    """What the model reads for a tool result: the value as text, then the error if there is one."""
    data = result.data
    if data is None:
        text = ""
    elif isinstance(data, str):
        text = data
    else:
        text = json.dumps(data, sort_keys=True, default=str)
    if result.error is None:
        return text
    return f"{text}\nError: {result.error}" if text else f"Error: {result.error}"


class MCPHarnessAdapter(HarnessAdapter):
    """The trainer's own tool-calling loop (white box): the model step samples a turn, its tool calls
    run on the session, their results go back into the conversation, until the model stops calling
    tools, a tool ends the episode, or a limit is reached.

    Every tool call the model made is answered with a tool message, so the conversation stays
    valid for the next request: a call that ran with its result (a failing tool as an error the
    model reads, not an aborted rollout), a call not run (past ``max_tool_calls_per_turn``, past
    ``max_total_tool_calls``, after a call that ended the episode) with an error saying why. A call
    that timed out, or a session closed under the rollout, ends it (``metrics["aborted"]``).
    """

    def run_black_box(
        self, session: ResourceSession, limits: Optional[HarnessRunLimits] = None
    ) -> HarnessRolloutResult:
        raise NotImplementedError("MCPHarnessAdapter runs white-box rollouts only: use run_white_box with a ModelStep")

    def run_white_box(
        self, model_step: ModelStep, session: ResourceSession, limits: Optional[HarnessRunLimits] = None
    ) -> HarnessRolloutResult:
        limits = limits if limits is not None else HarnessRunLimits()
        rollout = HarnessRolloutResult(messages=list(session.initial_messages()))
        messages = rollout.messages
        tools = list(session.list_tools())
        metrics = rollout.metrics
        stop_reason = "max_turns"
        for turn in range(limits.max_turns):
            step = model_step(copy.deepcopy(messages), list(tools), dict(limits.sampling))
            if not isinstance(step, ModelStepResult):
                raise TypeError(f"a model step must return a ModelStepResult, got {type(step).__name__}")
            response = step.response
            rollout.events.append(
                RolloutEvent(
                    "model_response",
                    {
                        "turn": turn,
                        "content": response.content,
                        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.args} for c in response.tool_calls],
                        "message_index": len(messages),
                    },
                )
            )
            messages.append(response.to_message_dict())
            rollout.steps.append(step)
            rollout.prompt_ids.extend(step.prompt_ids)
            rollout.completion_ids.extend(step.completion_ids)
            rollout.logprobs.extend(step.logprobs)
            if not response.tool_calls:
                rollout.done = True
                stop_reason = "no_tool_calls"
                break
            stop = self._run_calls(session, response, limits, rollout)
            if stop is not None:
                stop_reason = stop
                break
        metrics.setdefault("turns", sum(1 for e in rollout.events if e.type == "model_response"))
        metrics.setdefault("tool_calls", len(rollout.tool_trace))
        metrics.setdefault("stop_reason", stop_reason)
        return rollout

    def _run_calls(
        self, session: ResourceSession, response: LLMResponse, limits: HarnessRunLimits, rollout: HarnessRolloutResult
    ) -> Optional[str]:
        """Run (or answer without running) one turn's tool calls; the reason the rollout stops, if it does."""
        stop: Optional[str] = None
        why_not: Optional[str] = None  # once set, the turn's remaining calls are answered with it
        metrics = rollout.metrics
        for index, call in enumerate(response.tool_calls):
            skip = why_not
            if skip is None and limits.max_tool_calls_per_turn is not None and index >= limits.max_tool_calls_per_turn:
                skip = (
                    f"not run: at most {limits.max_tool_calls_per_turn} tool calls per turn (max_tool_calls_per_turn)"
                )
            if skip is None and limits.max_total_tool_calls is not None:
                if len(rollout.tool_trace) >= limits.max_total_tool_calls:
                    metrics["truncated"] = True
                    stop = stop or "max_total_tool_calls"
                    why_not = skip = (
                        f"not run: the rollout's {limits.max_total_tool_calls} tool calls are used up "
                        "(max_total_tool_calls)"
                    )
            if skip is not None:
                self._answer(rollout, call.id, call.name, ToolResult(error=skip))
                rollout.events.append(
                    RolloutEvent("tool_call_skipped", {"tool_name": call.name, "arguments": call.args, "reason": skip})
                )
                metrics["skipped_tool_calls"] = metrics.get("skipped_tool_calls", 0) + 1
                continue
            try:
                result = session.call_tool(call.name, call.args)
                if not isinstance(result, ToolResult):
                    raise TypeError(f"call_tool must return a ToolResult, got {type(result).__name__}")
            except Exception as exc:
                message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
                result = ToolResult(error=f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
                if isinstance(exc, TimeoutError) or getattr(session, "closed", False):
                    # The session cannot take another call: end here rather than fail every later one.
                    metrics["aborted"] = result.error
                    stop = stop or "aborted"
                    why_not = "not run: the session failed at an earlier call"
            rollout.tool_trace.append(ToolTraceEntry(call.name, dict(call.args), result))
            payload = {"tool_name": call.name, "arguments": call.args, "done": result.done}
            if result.error is not None:
                payload["error"] = result.error
                metrics["tool_errors"] = metrics.get("tool_errors", 0) + 1
            rollout.events.append(RolloutEvent("tool_call", payload))
            self._answer(rollout, call.id, call.name, result)
            if result.done and stop != "aborted":
                rollout.done = True
                stop = "env_done"
                why_not = "not run: the episode ended at an earlier call"
        return stop

    @staticmethod
    def _answer(rollout: HarnessRolloutResult, call_id: str, name: str, result: ToolResult) -> None:
        rollout.messages.append(
            {"role": "tool", "tool_call_id": call_id, "name": name, "content": _tool_message_content(result)}
        )


class CLIHarnessAdapter(HarnessAdapter):
    """An agent that owns its loop (black box): ``runner(bridge, session, limits)`` runs it, with
    the session's tools reachable through ``bridge`` (a :class:`SessionMCPBridge`), and returns
    the :class:`HarnessRolloutResult`."""

    def __init__(
        self,
        runner: Callable[[SessionMCPBridge, ResourceSession, Optional[HarnessRunLimits]], HarnessRolloutResult],
    ) -> None:
        self.runner = runner

    def run_black_box(
        self, session: ResourceSession, limits: Optional[HarnessRunLimits] = None
    ) -> HarnessRolloutResult:
        result = self.runner(SessionMCPBridge(session), session, limits)
        if not isinstance(result, HarnessRolloutResult):
            raise TypeError(f"the harness runner must return a HarnessRolloutResult, got {type(result).__name__}")
        return result

    def run_white_box(
        self, model_step: ModelStep, session: ResourceSession, limits: Optional[HarnessRunLimits] = None
    ) -> HarnessRolloutResult:
        raise NotImplementedError("CLIHarnessAdapter runs black-box rollouts only (the agent owns its loop)")


# --- rewards and the TRL rollout function --------------------------------------------------------


def _trace_reward(rollout: HarnessRolloutResult) -> Optional[float]:
    """The last reward a tool call reported (``metadata["reward"]``, else ``data["reward"]``)."""
    for entry in reversed(rollout.tool_trace):
        result = entry.result
        reward = result.metadata.get("reward") if isinstance(result.metadata, Mapping) else None
        if reward is None and isinstance(result.data, Mapping):
            reward = result.data.get("reward")
        if reward is not None:
            return float(reward)
    return None


def _resolve_env_reward(rollout: HarnessRolloutResult, verify: VerifyResult) -> float:
    """The rollout's reward: the environment's, as the tool trace reported it and ``verify`` forwarded it.

    ``ValueError`` when the two disagree (``verify`` must forward the environment's reward, not
    make one up) or when there is none at all."""
    from_trace = _trace_reward(rollout)
    from_verify = None if verify.env_reward is None else float(verify.env_reward)
    if (
        from_trace is not None
        and from_verify is not None
        and not math.isclose(from_trace, from_verify, rel_tol=1e-9, abs_tol=1e-6)
    ):
        raise ValueError(
            "verify.env_reward must forward the environment reward from the rollout "
            f"(the rollout's last tool call reported {from_trace!r}, verify returned {from_verify!r})"
        )
    if from_trace is not None:
        return from_trace
    if from_verify is not None:
        return from_verify
    raise ValueError("rollout did not produce an environment reward (no tool call reported one, verify gave None)")


def _final_state(rollout: HarnessRolloutResult) -> Dict[str, Any]:
    """The rollout as plain data, for ``verify(transcript, final_state)``."""
    return {
        "done": rollout.done,
        "metrics": dict(rollout.metrics),
        "events": [{"type": e.type, "payload": e.payload} for e in rollout.events],
        "tool_trace": [
            {
                "tool_name": e.tool_name,
                "arguments": e.arguments,
                "result": {
                    "data": e.result.data,
                    "done": e.result.done,
                    "metadata": e.result.metadata,
                    "error": e.result.error,
                },
            }
            for e in rollout.tool_trace
        ],
    }


def _prompt_seed(prompt: Any) -> int:
    from openenv.core.utils import prompt_seed  # one definition of "the seed of a prompt"

    return prompt_seed(prompt)


def build_harness_rollout_func(
    *,
    session_factory: ResourceSessionFactory[Any],
    harness_adapter: HarnessAdapter,
    model_step_builder: Callable[[Any, ResourceSession], ModelStep],
    limits: Optional[HarnessRunLimits] = None,
    reward_key: str = "env_reward",
    max_concurrency: int = 8,
    seed_fn: Optional[Callable[[Any], Optional[int]]] = _prompt_seed,
) -> Callable[..., Dict[str, List[Any]]]:
    """A TRL ``rollout_func(prompts, trainer)`` that plays one white-box rollout per prompt.

    For each prompt: ``session_factory.create(prompt, seed=seed_fn(prompt), episode_id=<uuid hex>)``
    (by default the seed is a hash of the prompt, so the rollouts of one GRPO group face the same
    task), ``model_step_builder(trainer, session)``, ``harness_adapter.run_white_box``,
    ``session.verify(messages, final_state)``, the reward (the environment's, checked against the
    tool trace), and ``session.close()`` whatever happened. Up to ``max_concurrency`` prompts run
    at once, on threads.

    Returns ``{"prompt_ids", "completion_ids", "logprobs", <reward_key>, "verify_metrics"}``, one
    entry per prompt in order (the token lists flat over the turns, as upstream's). A prompt whose
    rollout failed gets empty token lists, reward ``None`` (TRL leaves it out of the group's
    baseline) and ``{"error": "<type>: <message>"}`` as its verify metrics; only when every prompt
    failed is the (first) error raised.
    """
    if type(max_concurrency) is not int or max_concurrency < 1:
        raise ValueError(f"max_concurrency must be a whole number >= 1, got {max_concurrency!r}")

    def one(prompt: Any, trainer: Any) -> Tuple[HarnessRolloutResult, VerifyResult, float]:
        seed = seed_fn(prompt) if seed_fn is not None else None
        session = session_factory.create(prompt, seed=seed, episode_id=uuid.uuid4().hex)
        try:
            model_step = model_step_builder(trainer, session)
            rollout = harness_adapter.run_white_box(model_step=model_step, session=session, limits=limits)
            verify = session.verify(rollout.messages, _final_state(rollout))
            return rollout, verify, _resolve_env_reward(rollout, verify)
        finally:
            try:
                session.close()
            except Exception:
                logger.warning("closing a harness session failed", exc_info=True)

    def rollout_func(prompts: Sequence[Any], trainer: Any = None) -> Dict[str, List[Any]]:
        prompts = list(prompts)
        out: Dict[str, List[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            reward_key: [],
            "verify_metrics": [],
        }
        if not prompts:
            return out
        workers = min(max_concurrency, len(prompts))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="harness-rollout") as pool:
            futures = [pool.submit(one, prompt, trainer) for prompt in prompts]
            concurrent.futures.wait(futures)
        errors = [f.exception() for f in futures]
        if all(e is not None for e in errors):
            raise errors[0]  # type: ignore[misc]
        for index, (future, error) in enumerate(zip(futures, errors, strict=True)):
            if error is not None:
                logger.warning("harness rollout of prompt %d failed; recorded as unscored", index, exc_info=error)
                out["prompt_ids"].append([])
                out["completion_ids"].append([])
                out["logprobs"].append([])
                out[reward_key].append(None)
                out["verify_metrics"].append({"error": f"{type(error).__name__}: {error}"})
                continue
            rollout, verify, reward = future.result()
            out["prompt_ids"].append(list(rollout.prompt_ids))
            out["completion_ids"].append(list(rollout.completion_ids))
            out["logprobs"].append(list(rollout.logprobs))
            out[reward_key].append(reward)
            out["verify_metrics"].append(dict(verify.metrics))
        return out

    return rollout_func
