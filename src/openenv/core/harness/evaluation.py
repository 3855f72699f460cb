"""Evaluating a model endpoint on an environment's tasks: the engine of ``openenv eval``.

:class:`EvalRunner` plays ``tasks x repeats`` rollouts, up to ``concurrency`` at once, each one a
white-box rollout (:class:`~openenv.core.harness.rollout.MCPHarnessAdapter`) of a session from
the factory (:class:`~openenv.core.harness.env_sessions.EnvSessionFactory` for a served
environment) with :class:`ChatModelStep` (any OpenAI-compatible chat-completions endpoint) as the
model. Every rollout becomes one line of ``results.jsonl`` (:class:`RolloutSerializer`): its
messages, tool calls, reward, token counts, timings, the error that stopped it, and, when the
model calls went through the capture proxy, the captured rollout document (each turn's token
counts and logprobs, each sequence's token ids as the engine saw and sampled them).

Nothing a rollout does can hang the run: every environment call is bounded (the session's
``call_timeout_s``), every model call too, and the whole rollout has a deadline
(``rollout_timeout_s``) after which it is recorded as failed (cause ``timeout``) and its session
closed, whatever its thread is stuck in. An environment server that dies makes the rollouts in
flight fail (``env_lost``), and the ones after it fail at once (``env_unreachable``): recorded
failures, not a hang. A resumed run skips the rollouts that ended (scored or not) and plays the
failed ones again; their new line supersedes the old.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..llm_client import LLMResponse, ToolCall, clean_schema
from .collect import RolloutSerializer, jsonable
from .rollout import (
    CLIHarnessAdapter,
    HarnessRolloutResult,
    HarnessRunLimits,
    MCPHarnessAdapter,
    Message,
    ModelStepResult,
    ResourceSession,
    ResourceSessionFactory,
    SessionCallTimeout,
    VerifyResult,
    _final_state,
    _resolve_env_reward,
    _trace_reward,
)
from .tools import tool_name

__all__ = [
    "AgentError",
    "AgentHarness",
    "ChatModelStep",
    "EvalJob",
    "EvalRun",
    "EvalRunner",
    "EvalSettings",
    "ModelEndpoint",
    "ModelError",
    "ModelTimeoutError",
    "RolloutCancelled",
    "chat_api_url",
    "failure_cause",
    "served_model",
]

logger = logging.getLogger("openenv.harness.eval")

ENDED = ("ok", "unscored")
"""Statuses of a rollout that ran to its end: a resumed run does not play it again."""


class ModelError(RuntimeError):
    """The model endpoint failed: unreachable, an HTTP error, an answer that is not a chat completion."""


class ModelTimeoutError(ModelError):
    """The model endpoint did not answer in time."""


class RolloutCancelled(RuntimeError):
    """The rollout was stopped from outside (its deadline passed, or the run was interrupted)."""


class _RolloutTimeout(TimeoutError):
    pass


class AgentError(RuntimeError):
    """The agent CLI of a black-box rollout failed: it exited with an error (``cause``
    ``agent_error``) or ran past its time (``agent_timeout``) before the episode ended."""

    def __init__(self, message: str, *, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class AgentHarness:
    """The agent CLI ``harness`` (see :mod:`.agents`), installed at ``install_root``, as the agent of
    every rollout: each one is a black-box rollout of
    :class:`~openenv.core.harness.cli_runner.AgentCLIRunner`, the agent sandboxed with the session's
    tools as its MCP server and ``proxy`` (a :class:`~openenv.core.harness.capture.CaptureServer`
    on a Unix socket, in front of the model) as its model, asking for ``model``.

    Each rollout's capture session is an eval one (``eval_sampling``: the temperature and top-p the
    proxy pins, whatever the agent asks for) whose budget of model calls is the run's ``max_turns``.
    ``ValueError`` for a harness that cannot be given MCP tools, ``FileNotFoundError`` when it is
    not installed (see :class:`AgentCLIRunner`)."""

    def __init__(
        self,
        harness: str,
        *,
        proxy: Any,
        model: str,
        install_root: Any = None,
        node: Optional[str] = None,
        eval_sampling: Optional[Dict[str, Any]] = None,
    ) -> None:
        from .cli_runner import AgentCLIRunner

        self.harness = harness
        self.proxy = proxy
        self.model = model
        self.node = node
        self.eval_sampling = dict(eval_sampling or {})
        # checked now (harness wired for MCP, installed): a run that cannot start says so at once
        self.install_root = AgentCLIRunner(harness, proxy=proxy, install_root=install_root, model=model).install_root

    def runner(self, job: EvalJob, timeout_s: float) -> Any:
        """The runner of ``job``'s rollout, the agent stopped after ``timeout_s``."""
        from .cli_runner import AgentCLIRunner

        fields: Dict[str, Any] = {
            "purpose": "eval",
            "metadata": {"episode_id": job.episode_id, "harness": self.harness},
        }
        if self.eval_sampling:
            fields["eval_sampling"] = dict(self.eval_sampling)
        return AgentCLIRunner(
            self.harness,
            proxy=self.proxy,
            install_root=self.install_root,
            model=self.model,
            session_fields=fields,
            timeout_s=timeout_s,
            node=self.node,
        )


# --- the model ----------------------------------------------------------------------------------


def chat_api_url(model_url: str) -> str:
    """The OpenAI-compatible API base of ``model_url``: as given when it has a path
    (``http://host:8000/v1``), else with ``/v1`` added (``http://host:8000``)."""
    from urllib.parse import urlsplit

    url = model_url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the model URL must be an http(s) URL, got {model_url!r}")
    if parts.username or parts.password:
        raise ValueError("put the model's key in an environment variable, not in its URL")
    return url if parts.path else f"{url}/v1"


def served_model(api_url: str, *, api_key: Optional[str] = None, timeout_s: float = 30.0) -> str:
    """The first model the endpoint lists (``GET /models``): what to ask for when none was named."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{api_url}/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ModelError(f"cannot reach the model endpoint {api_url}: {exc}") from None
    if response.status_code >= 400:
        raise ModelError(f"{api_url}/models answered HTTP {response.status_code}: {response.text[:300]}")
    try:
        models = [m["id"] for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ModelError(f"{api_url}/models answered no model list: {response.text[:300]}") from None
    if not models:
        raise ModelError(f"{api_url}/models lists no model")
    return str(models[0])


@dataclass
class ModelEndpoint:
    """An OpenAI-compatible endpoint: its API base (``.../v1``), the model to ask for, its key
    (``None``: no ``Authorization`` header) and how long one request may take."""

    api_url: str
    model: str
    api_key: Optional[str] = None
    timeout_s: float = 120.0


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def _tool_spec(tool: Any) -> Dict[str, Any]:
    if isinstance(tool, dict):
        schema = tool.get("inputSchema", tool.get("input_schema"))
        description = tool.get("description") or ""
    else:
        schema, description = getattr(tool, "input_schema", None), getattr(tool, "description", "") or ""
    return {
        "type": "function",
        "function": {"name": tool_name(tool), "description": description, "parameters": clean_schema(schema)},
    }


class ChatModelStep:
    """A :class:`~openenv.core.harness.rollout.ModelStep` over an OpenAI-compatible
    ``/chat/completions``: each turn is one request (the conversation, the tools as functions,
    the sampling options), its reply the assistant's text and tool calls.

    It keeps what a report needs: per turn the token counts the endpoint reports (``usage``), the
    finish reason and the seconds it took (:attr:`turns`), and the conversation as the model last
    saw it with its reply (:attr:`last_messages`, for the record of a rollout that failed later).
    ``cancel`` (an event) stops it before its next request; ``deadline`` (``time.monotonic()``)
    shortens the request timeout to what is left."""

    def __init__(
        self,
        endpoint: ModelEndpoint,
        *,
        http: Any = None,
        api_key: Optional[str] = None,
        cancel: Optional[threading.Event] = None,
        deadline: Optional[float] = None,
    ) -> None:
        import httpx

        self.endpoint = endpoint
        self.http = http if http is not None else httpx.Client()
        self.api_key = api_key if api_key is not None else endpoint.api_key
        self.cancel = cancel
        self.deadline = deadline
        self.turns: List[Dict[str, Any]] = []
        self.last_messages: List[Message] = []
        self.seconds = 0.0

    def __call__(self, messages: List[Message], tools: List[Any], sampling: Dict[str, Any]) -> ModelStepResult:
        import httpx

        if self.cancel is not None and self.cancel.is_set():
            raise RolloutCancelled("the rollout was stopped before its next model call")
        body: Dict[str, Any] = {"model": self.endpoint.model, "messages": messages}
        if tools:
            body["tools"] = [_tool_spec(t) for t in tools]
        body.update({k: v for k, v in sampling.items() if v is not None})
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        timeout = self.endpoint.timeout_s
        if self.deadline is not None:
            timeout = max(0.1, min(timeout, self.deadline - time.monotonic()))
        url = f"{self.endpoint.api_url}/chat/completions"
        started = time.monotonic()
        try:
            response = self.http.post(url, json=body, headers=headers, timeout=timeout)
        except httpx.TimeoutException:
            raise ModelTimeoutError(f"the model did not answer within {timeout:.3g} s ({url})") from None
        except httpx.HTTPError as exc:
            raise ModelError(f"cannot reach the model at {url}: {type(exc).__name__}: {exc}") from None
        finally:
            elapsed = time.monotonic() - started
            self.seconds += elapsed
        if response.status_code >= 400:
            raise ModelError(f"the model answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            data = response.json()
            choice = data["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ModelError(f"the model's answer is not a chat completion: {response.text[:300]}") from None
        calls = []
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            raw = function.get("arguments") or "{}"
            try:
                arguments = json.loads(raw) if isinstance(raw, str) else dict(raw)
            except ValueError:
                raise ModelError(
                    f"the model called {function.get('name')!r} with arguments that are not JSON: {raw[:200]!r}"
                ) from None
            if not isinstance(arguments, dict):
                raise ModelError(f"the model called {function.get('name')!r} with arguments that are not an object")
            call_id = call.get("id") or f"call_{len(self.turns)}_{index}"
            calls.append(ToolCall(id=call_id, name=function.get("name") or "", args=arguments))
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        self.turns.append(
            {
                "prompt_tokens": usage.get("prompt_tokens"),
                "completion_tokens": usage.get("completion_tokens"),
                "finish_reason": choice.get("finish_reason"),
                "seconds": round(elapsed, 4),
            }
        )
        reply = LLMResponse(content=_text(message.get("content")) or None, tool_calls=calls)
        self.last_messages = [*messages, reply.to_message_dict()]
        return ModelStepResult(response=reply)


# --- one rollout --------------------------------------------------------------------------------


def _transport_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the environment server cannot be reached (or went away)."""
    from openenv.core.client_errors import SessionLostError

    if isinstance(exc, TimeoutError):
        return False
    return isinstance(exc, (ConnectionError, SessionLostError, EOFError, OSError))


class _Watched(ResourceSession):
    """The rollout's session, timed, stoppable, and closed at once when its server is gone (so the
    harness ends the rollout instead of showing the model one connection error after another)."""

    def __init__(self, inner: ResourceSession, cancel: threading.Event) -> None:
        self.inner = inner
        self.cancel = cancel
        self.seconds = 0.0
        self.calls = 0
        self.fatal: Optional[BaseException] = None

    @property
    def closed(self) -> bool:
        return bool(getattr(self.inner, "closed", False))

    def initial_messages(self) -> List[Message]:
        return self.inner.initial_messages()

    def list_tools(self) -> List[Any]:
        return self.inner.list_tools()

    def call_tool(self, name: str, arguments: Dict[str, Any]) -> Any:
        if self.cancel.is_set():
            raise RolloutCancelled("the rollout was stopped before its next tool call")
        started = time.monotonic()
        self.calls += 1
        try:
            return self.inner.call_tool(name, arguments)
        except Exception as exc:
            if _transport_failure(exc) or isinstance(exc, TimeoutError):
                self.fatal = exc
                if not isinstance(exc, TimeoutError):  # (a timed-out session is being closed already)
                    _close_quietly(self.inner)
            raise
        finally:
            self.seconds += time.monotonic() - started

    def verify(self, transcript: List[Message], final_state: Optional[Dict[str, Any]] = None) -> VerifyResult:
        return self.inner.verify(transcript, final_state)

    def close(self) -> None:
        self.inner.close()


def _close_quietly(session: Any) -> None:
    try:
        session.close()
    except Exception:
        logger.debug("closing a session failed", exc_info=True)


def failure_cause(exc: BaseException, phase: str) -> str:
    """The cause a failed rollout is filed under, from its error and the phase it failed in
    (``reset``: opening the session, ``run``, ``verify``)."""
    from openenv.core.client_errors import CapacityReachedError, EnvClientError, StepTimeoutError

    if isinstance(exc, _RolloutTimeout):
        return "timeout"
    if isinstance(exc, AgentError):
        return exc.cause
    if isinstance(exc, RolloutCancelled):
        return "cancelled"
    if isinstance(exc, ModelTimeoutError):
        return "model_timeout"
    if isinstance(exc, ModelError):
        return "model_error"
    if isinstance(exc, (SessionCallTimeout, StepTimeoutError)) or isinstance(exc, TimeoutError):
        return "env_timeout"
    if isinstance(exc, CapacityReachedError):
        return "env_capacity"
    if _transport_failure(exc):
        return "env_unreachable" if phase == "reset" else "env_lost"
    if isinstance(exc, _RewardMismatch):
        return "reward_mismatch"
    if isinstance(exc, EnvClientError) or phase == "reset":
        return "env_error"
    return "harness_error"


class _RewardMismatch(ValueError):
    pass


def _message(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class EvalJob:
    """One rollout to play: its id, the task (index) it plays, which repeat of it, the seed."""

    episode_id: str
    task: Any
    repeat: int
    seed: Optional[int]


@dataclass
class EvalSettings:
    """How an evaluation runs: ``tasks`` task indices from ``first_task``, ``repeats`` rollouts of
    each, ``concurrency`` at once, ``max_turns`` model turns per rollout, the ``sampling`` options
    every request carries, a rollout's deadline and a rollout's success threshold."""

    tasks: int = 8
    first_task: int = 0
    repeats: int = 1
    concurrency: int = 4
    max_turns: int = 8
    sampling: Dict[str, Any] = field(default_factory=dict)
    rollout_timeout_s: float = 300.0
    success_threshold: float = 1.0

    def __post_init__(self) -> None:
        for name in ("tasks", "repeats", "concurrency", "max_turns"):
            value = getattr(self, name)
            if type(value) is not int or value < (0 if name == "tasks" else 1):
                raise ValueError(f"{name} must be a whole number >= {0 if name == 'tasks' else 1}, got {value!r}")
        if type(self.first_task) is not int or self.first_task < 0:
            raise ValueError(f"first_task must be a whole number >= 0, got {self.first_task!r}")
        if not self.rollout_timeout_s > 0:
            raise ValueError(f"rollout_timeout_s must be > 0, got {self.rollout_timeout_s!r}")


@dataclass
class EvalRun:
    """What one :meth:`EvalRunner.run` did: rollouts played now (and of them failed), skipped
    (ended in an earlier run), and the wall time."""

    ran: int
    failed: int
    skipped: int
    wall_s: float
    records: List[Dict[str, Any]] = field(default_factory=list)


class _Flight:
    """A rollout in flight: what the run needs to stop it from outside."""

    def __init__(self, job: EvalJob, deadline: float) -> None:
        self.job = job
        self.deadline = deadline
        self.cancel = threading.Event()
        self.session: Optional[ResourceSession] = None
        self.model_step: Optional[ChatModelStep] = None
        self.started = time.monotonic()
        self.started_at = _now()


class EvalRunner:
    """Plays an evaluation's rollouts and writes them (see the module docstring).

    ``capture`` is an optional running :class:`~openenv.core.harness.capture.CaptureServer` in
    front of the model: each rollout then gets a capture session, its model calls go through the
    proxy (which asks the engine for its token ids and logprobs), and its record carries the
    captured trace. ``on_start(total, skipped)`` and ``on_result(record)`` report progress (from
    the thread that called :meth:`run`)."""

    def __init__(
        self,
        *,
        session_factory: ResourceSessionFactory[Any],
        model: ModelEndpoint,
        serializer: RolloutSerializer,
        settings: EvalSettings,
        capture: Any = None,
        agent: Optional[AgentHarness] = None,
        on_start: Optional[Callable[[int, int], None]] = None,
        on_result: Optional[Callable[[Dict[str, Any]], None]] = None,
    ) -> None:
        self.session_factory = session_factory
        self.model = model
        self.serializer = serializer
        self.settings = settings
        self.capture = capture if agent is None else agent.proxy
        self.agent = agent
        self.on_start = on_start
        self.on_result = on_result
        self._results: queue.Queue[Tuple[_Flight, Dict[str, Any]]] = queue.Queue()
        self._http: Any = None

    def jobs(self) -> List[EvalJob]:
        """Every rollout of the evaluation, task by task (``task-<index, 6 digits>-<repeat>``)."""
        s = self.settings
        return [
            EvalJob(f"task-{task:06d}-{repeat}", task, repeat, task)
            for task in range(s.first_task, s.first_task + s.tasks)
            for repeat in range(s.repeats)
        ]

    def ended_ids(self) -> Set[str]:
        """The ids whose last record on disk ran to its end (``ok`` or ``unscored``)."""
        last: Dict[str, str] = {}
        for record in self.serializer.read_records():
            last[record["episode_id"]] = str(record.get("status") or "ok")
        return {k for k, status in last.items() if status in ENDED}

    # --- the run -----------------------------------------------------------------------------

    def run(self, *, resume: bool = True) -> EvalRun:
        """Play the rollouts not ended yet (all of them without ``resume``), ``concurrency`` at once."""
        import httpx

        done = self.ended_ids() if resume else set()
        todo = [job for job in self.jobs() if job.episode_id not in done]
        skipped = len(self.jobs()) - len(todo)
        if self.on_start is not None:
            self.on_start(len(todo), skipped)
        concurrency = self.settings.concurrency
        limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
        self._http = httpx.Client(limits=limits)
        started = time.monotonic()
        records: List[Dict[str, Any]] = []
        pending = list(reversed(todo))
        flying: Dict[str, _Flight] = {}
        try:
            while pending or flying:
                while pending and len(flying) < concurrency:
                    job = pending.pop()
                    flight = _Flight(job, time.monotonic() + self.settings.rollout_timeout_s)
                    flying[job.episode_id] = flight
                    threading.Thread(
                        target=self._play, args=(flight,), name=f"openenv-eval-{job.episode_id}", daemon=True
                    ).start()
                wait = max(0.0, min(f.deadline for f in flying.values()) - time.monotonic())
                try:
                    flight, record = self._results.get(timeout=wait)
                except queue.Empty:
                    now = time.monotonic()
                    for flight in [f for f in flying.values() if f.deadline <= now]:
                        del flying[flight.job.episode_id]
                        record = self._abandon(flight)
                        self._keep(record, records)
                    continue
                if flying.get(flight.job.episode_id) is flight:  # (an abandoned one's late answer is ignored)
                    del flying[flight.job.episode_id]
                    self._keep(record, records)
        except BaseException:  # Ctrl-C: stop what is in flight; what was written stays, for a resume
            for flight in flying.values():
                flight.cancel.set()
                if flight.session is not None:
                    threading.Thread(target=_close_quietly, args=(flight.session,), daemon=True).start()
            raise
        finally:
            self._http.close()
        failed = sum(1 for r in records if r["status"] == "failed")
        return EvalRun(
            ran=len(records), failed=failed, skipped=skipped, wall_s=time.monotonic() - started, records=records
        )

    def _keep(self, record: Dict[str, Any], records: List[Dict[str, Any]]) -> None:
        self.serializer.write_episode(record)
        records.append(record)
        if self.on_result is not None:
            self.on_result(record)

    def _abandon(self, flight: _Flight) -> Dict[str, Any]:
        """The record of a rollout past its deadline; its session is closed behind it."""
        flight.cancel.set()
        if flight.session is not None:
            threading.Thread(target=_close_quietly, args=(flight.session,), daemon=True).start()
        timeout = self.settings.rollout_timeout_s
        error = _RolloutTimeout(f"the rollout did not end within {timeout:g} s (its session was closed)")
        step = flight.model_step
        return self._record(
            flight,
            status="failed",
            error={"cause": "timeout", "message": _message(error), "phase": "run"},
            messages=list(step.last_messages) if step is not None else [],
            model_step=step,
        )

    def _play(self, flight: _Flight) -> None:
        try:
            record = self._rollout(flight)
        except BaseException as exc:  # never lose a rollout: a bug here is a recorded failure too
            logger.exception("rollout %s failed unexpectedly", flight.job.episode_id)
            record = self._record(
                flight, status="failed", error={"cause": "harness_error", "message": _message(exc), "phase": "run"}
            )
        self._results.put((flight, record))

    def _capture_session(self, flight: _Flight) -> Optional[str]:
        if self.capture is None:
            return None
        session_id = f"{flight.job.episode_id}-{uuid.uuid4().hex[:8]}"
        fields: Dict[str, Any] = {
            "session_id": session_id,
            "purpose": "eval",
            "metadata": {"episode_id": flight.job.episode_id},
        }
        sampling = {k: self.settings.sampling[k] for k in ("temperature", "top_p") if k in self.settings.sampling}
        if sampling:
            fields["eval_sampling"] = sampling
        return str(self.capture.create_session(**fields)["api_key"])

    def _rollout(self, flight: _Flight) -> Dict[str, Any]:
        job = flight.job
        phase = "reset"
        rollout: Optional[HarnessRolloutResult] = None
        watched: Optional[_Watched] = None
        capture_key: Optional[str] = None
        timings: Dict[str, Any] = {}
        endpoint = self.model
        if self.agent is not None:
            return self._agent_rollout(flight)
        try:
            capture_key = self._capture_session(flight)
            if capture_key is not None:
                endpoint = ModelEndpoint(f"{self.capture.url}/v1", self.model.model, capture_key, self.model.timeout_s)
            flight.model_step = ChatModelStep(endpoint, http=self._http, cancel=flight.cancel, deadline=flight.deadline)
            began = time.monotonic()
            session = self.session_factory.create(job.task, seed=job.seed, episode_id=job.episode_id)
            flight.session = session
            timings["reset_s"] = round(time.monotonic() - began, 4)
            if flight.cancel.is_set():
                raise RolloutCancelled("the rollout was stopped while its session opened")
            watched = _Watched(session, flight.cancel)
            phase = "run"
            limits = HarnessRunLimits(max_turns=self.settings.max_turns, sampling=dict(self.settings.sampling))
            rollout = MCPHarnessAdapter().run_white_box(flight.model_step, watched, limits)
            if rollout.metrics.get("aborted"):
                cause = watched.fatal
                if cause is None:
                    raise RuntimeError(str(rollout.metrics["aborted"]))
                raise cause
            phase = "verify"
            verify = session.verify(rollout.messages, _final_state(rollout))
            status, reward = self._reward(rollout, verify)
            return self._record(
                flight,
                status=status,
                reward=reward,
                rollout=rollout,
                verify=verify,
                watched=watched,
                timings=timings,
                capture_key=capture_key,
                model_step=flight.model_step,
            )
        except Exception as exc:
            cause = failure_cause(exc, phase)
            messages = rollout.messages if rollout is not None else None
            if messages is None and flight.model_step is not None:
                messages = flight.model_step.last_messages
            return self._record(
                flight,
                status="failed",
                error={"cause": cause, "message": _message(exc), "phase": phase},
                rollout=rollout,
                messages=messages or [],
                watched=watched,
                timings=timings,
                capture_key=capture_key,
                model_step=flight.model_step,
            )
        finally:
            if flight.session is not None:
                _close_quietly(flight.session)

    def _agent_rollout(self, flight: _Flight) -> Dict[str, Any]:
        """One black-box rollout: the agent CLI over the session's tools, its model calls captured."""
        assert self.agent is not None
        job = flight.job
        phase = "reset"
        rollout: Optional[HarnessRolloutResult] = None
        watched: Optional[_Watched] = None
        timings: Dict[str, Any] = {}
        try:
            began = time.monotonic()
            session = self.session_factory.create(job.task, seed=job.seed, episode_id=job.episode_id)
            flight.session = session
            timings["reset_s"] = round(time.monotonic() - began, 4)
            if flight.cancel.is_set():
                raise RolloutCancelled("the rollout was stopped while its session opened")
            watched = _Watched(session, flight.cancel)
            phase = "run"
            # the agent is stopped before the rollout's deadline, so that its own end is recorded
            left = flight.deadline - time.monotonic()
            margin = min(15.0, 0.2 * self.settings.rollout_timeout_s)
            runner = self.agent.runner(job, timeout_s=max(1.0, left - margin))
            # eval_sampling pins the sampling on the proxy; the runner's sampling would be a training one
            limits = HarnessRunLimits(max_turns=self.settings.max_turns, sampling={})
            rollout = CLIHarnessAdapter(runner).run_black_box(watched, limits)
            metrics = rollout.metrics
            if watched.fatal is not None:
                raise watched.fatal
            if metrics.get("stop_reason") == "timeout":
                raise AgentError(
                    f"{self.agent.harness} did not end within {runner.timeout_s:.3g} s (it was stopped)",
                    cause="agent_timeout",
                )
            if metrics.get("stop_reason") == "agent_failed":
                raise AgentError(
                    f"{self.agent.harness} exited with code {metrics.get('exit_code')}: {_agent_stderr(rollout)[-300:]}",
                    cause="agent_error",
                )
            phase = "verify"
            verify = session.verify(rollout.messages, _final_state(rollout))
            status, reward = self._reward(rollout, verify)
            return self._record(
                flight, status=status, reward=reward, rollout=rollout, verify=verify, watched=watched, timings=timings
            )
        except Exception as exc:
            return self._record(
                flight,
                status="failed",
                error={"cause": failure_cause(exc, phase), "message": _message(exc), "phase": phase},
                rollout=rollout,
                messages=rollout.messages if rollout is not None else [],
                watched=watched,
                timings=timings,
            )
        finally:
            if flight.session is not None:
                _close_quietly(flight.session)

    @staticmethod
    def _reward(rollout: HarnessRolloutResult, verify: VerifyResult) -> Tuple[str, Optional[float]]:
        try:
            return "ok", float(_resolve_env_reward(rollout, verify))
        except ValueError as exc:
            if _trace_reward(rollout) is None and verify.env_reward is None:
                return "unscored", None
            raise _RewardMismatch(str(exc)) from None

    def _trace(self, capture_key: Optional[str], include_messages: bool = False) -> Optional[Dict[str, Any]]:
        """The capture session's rollout document (its turns with their token counts and logprobs,
        its sequences with the engine's token ids); the session is deleted after."""
        if capture_key is None or self.capture is None:
            return None
        try:
            if include_messages:
                return dict(self.capture.rollout(capture_key, include_messages=True))
            return dict(self.capture.rollout(capture_key))
        except Exception as exc:
            logger.debug("no trace for capture session %s: %s", capture_key, exc)
            return None
        finally:
            try:
                self.capture.delete_session(capture_key)
            except Exception:
                pass

    def _record(
        self,
        flight: _Flight,
        *,
        status: str,
        reward: Optional[float] = None,
        error: Optional[Dict[str, Any]] = None,
        rollout: Optional[HarnessRolloutResult] = None,
        verify: Optional[VerifyResult] = None,
        messages: Optional[Sequence[Message]] = None,
        watched: Optional[_Watched] = None,
        timings: Optional[Dict[str, Any]] = None,
        capture_key: Optional[str] = None,
        model_step: Optional[ChatModelStep] = None,
    ) -> Dict[str, Any]:
        job = flight.job
        extra: Dict[str, Any] = {}
        if self.agent is not None:
            capture_key = rollout.metrics.get("capture_session_id") if rollout is not None else None
            extra = _agent_extra(self.agent.harness, rollout)
        trace = self._trace(capture_key, include_messages=self.agent is not None)
        if self.agent is not None:
            conversation = _captured_conversation(trace)
            if conversation and rollout is not None:  # the agent's conversation as its model last saw it
                rollout.messages = conversation
                rollout.metrics.pop("trace_error", None)  # (an eval capture has no training trace: no error)
            elif conversation:
                messages = conversation
        turns = list(model_step.turns) if model_step is not None else _captured_turns(trace)
        tokens = _token_counts(turns, trace)
        timing = dict(timings or {})
        timing.update(
            {
                "started_at": flight.started_at,
                "total_s": round(time.monotonic() - flight.started, 4),
                "model_s": round(model_step.seconds, 4) if model_step is not None else 0.0,
                "env_s": round(watched.seconds, 4) if watched is not None else 0.0,
                "model_calls": len(turns),
                "tool_calls": watched.calls if watched is not None else 0,
            }
        )
        if self.agent is not None and rollout is not None and "elapsed_s" in rollout.metrics:
            timing["agent_s"] = rollout.metrics["elapsed_s"]
        artifacts = dict(verify.artifacts) if verify is not None else {}
        artifacts.pop("final_state", None)  # the rollout itself, already in this record
        tool_trace = []
        if rollout is not None:
            tool_trace = [
                {
                    "tool_name": entry.tool_name,
                    "arguments": entry.arguments,
                    "result": {
                        "data": entry.result.data,
                        "done": entry.result.done,
                        "metadata": entry.result.metadata,
                        "error": entry.result.error,
                    },
                }
                for entry in rollout.tool_trace
            ]
        record = {
            "episode_id": job.episode_id,
            "task": job.task,
            "repeat": job.repeat,
            "seed": job.seed,
            "status": status,
            "reward": reward,
            "success": None
            if status == "failed"
            else (reward is not None and reward >= self.settings.success_threshold),
            "done": bool(rollout.done) if rollout is not None else False,
            "error": error,
            "messages": list(rollout.messages) if rollout is not None else list(messages or []),
            "tool_trace": tool_trace,
            "metrics": dict(rollout.metrics) if rollout is not None else {},
            "verify_metrics": dict(verify.metrics) if verify is not None else {},
            "artifacts": artifacts,
            "tokens": tokens,
            "timings": timing,
            "trace": trace,
            "extra": extra,
        }
        return jsonable(record)


def _agent_stderr(rollout: Optional[HarnessRolloutResult]) -> str:
    for event in reversed(rollout.events if rollout is not None else []):
        if event.type == "agent_exit":
            return str(event.payload.get("stderr") or "")
    return ""


def _agent_extra(harness: str, rollout: Optional[HarnessRolloutResult]) -> Dict[str, Any]:
    """What a black-box record adds: the harness, how its agent ended (exit code, None when it was
    stopped or never started) and the end of its stderr."""
    metrics = rollout.metrics if rollout is not None else {}
    return {
        "harness": harness,
        "exit_code": metrics.get("exit_code"),
        "stop_reason": metrics.get("stop_reason"),
        "agent_stderr": _agent_stderr(rollout)[-1000:],
    }


def _captured_conversation(trace: Optional[Dict[str, Any]]) -> List[Message]:
    """The last captured turn's messages (its request's and its answer), taken out of every turn
    of ``trace`` (the record keeps them once)."""
    turns = [t for t in (trace or {}).get("turns") or [] if isinstance(t, dict)]
    kept = [t.pop("messages", None) for t in turns]
    for turn, messages in zip(reversed(turns), reversed(kept), strict=True):
        if not turn.get("discarded") and messages:
            return list(messages)
    return []


def _captured_turns(trace: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """A black-box rollout's model turns as the capture proxy counted them (the agent's own calls
    are not seen): per turn its prompt and sampled token counts and finish reason."""
    captured = [t for t in (trace or {}).get("turns") or [] if isinstance(t, dict) and not t.get("discarded")]
    return [
        {
            "prompt_tokens": t.get("n_prompt"),
            "completion_tokens": t.get("n_sampled"),
            "finish_reason": t.get("finish_reason"),
        }
        for t in captured
    ]


def _token_counts(turns: Sequence[Dict[str, Any]], trace: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A rollout's tokens: per turn what the endpoint reported (``usage``); where a turn reported
    none, what the capture proxy counted (``n_prompt``, ``n_sampled``). ``ids``: whether the trace
    holds the engine's token ids."""
    captured = [t for t in (trace or {}).get("turns") or [] if isinstance(t, dict) and not t.get("discarded")]
    per_turn = []
    for index, turn in enumerate(turns):
        prompt, completion = turn.get("prompt_tokens"), turn.get("completion_tokens")
        entry = captured[index] if index < len(captured) else {}
        if not isinstance(prompt, int) and isinstance(entry.get("n_prompt"), int):
            prompt = entry["n_prompt"]
        if not isinstance(completion, int) and isinstance(entry.get("n_sampled"), int):
            completion = entry["n_sampled"]
        per_turn.append({"prompt": prompt, "completion": completion, "finish_reason": turn.get("finish_reason")})
    known = [t for t in per_turn if isinstance(t["prompt"], int) and isinstance(t["completion"], int)]
    counted = len(known) == len(per_turn)
    prompt_total = sum(t["prompt"] for t in known) if counted else None
    completion_total = sum(t["completion"] for t in known) if counted else None
    sequences = (trace or {}).get("sequences") or []
    return {
        "prompt": prompt_total,
        "completion": completion_total,
        "total": prompt_total + completion_total if counted else None,
        "turns": per_turn,
        "ids": any(isinstance(q, dict) and q.get("input_ids") for q in sequences),
    }
