"""Loop-owning sessions whose model calls go through the capture proxy: :class:`CapturedAgentSession`.

A trainer that lets the agent own its loop (TRL's async GRPO harness path without an adapter)
needs a session it can create, wait for, and read back token by token. This is that session:

* :meth:`CapturedAgentSessionFactory.create` opens an environment session (any
  :class:`~openenv.core.harness.rollout.ResourceSessionFactory`), mints a capture session on the
  proxy (``POST /sessions``, with the trainer's sampling policy) and starts the agent on a thread;
* the agent is any callable ``agent(run: AgentRun) -> exit code``: it gets the proxy's
  OpenAI-compatible base URL and its session key, the opening messages and the environment's
  tools, and calls the tools through ``run.session`` (or ``run.bridge``, the MCP view).
  :func:`chat_tool_agent` is a minimal one (OpenAI chat completions with tools);
* :meth:`CapturedAgentSession.wait_for_completion` waits for the agent,
  :meth:`~CapturedAgentSession.fetch_training_trace` reads the proxy's
  :class:`~openenv.core.harness.training.TrainingTrace` of that session, and
  :meth:`~CapturedAgentSession.verify` forwards the environment's own verdict (its reward is never
  made up here).

So the session is a :class:`~openenv.core.harness.rollout.TrainableSession` and a
:class:`~openenv.core.harness.rollout.LoopOwningSession`, and a ``ResourceSession`` besides.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

import httpx

from .capture.upstream import training_sampling
from .rollout import (
    Message,
    ResourceSession,
    ResourceSessionFactory,
    SessionMCPBridge,
    ToolResult,
    VerifyResult,
    _tool_message_content,
)
from .training import TraceEntry, TrainingTrace

__all__ = [
    "Agent",
    "AgentRun",
    "CapturedAgentSession",
    "CapturedAgentSessionFactory",
    "chat_tool_agent",
]

logger = logging.getLogger("openenv.harness")

EXIT_ERROR = 1
"""The exit code of an agent that raised."""


@dataclass
class AgentRun:
    """What an agent gets for one episode.

    ``base_url`` is the proxy's OpenAI-compatible root (``.../v1``; on a Unix socket, the socket
    is ``uds``), ``api_key`` the capture session's key, ``model`` the name to ask for. ``messages``
    and ``tools`` open the episode; ``session`` runs the tools (``bridge`` is the same as an MCP
    server). ``cancelled`` is set when the trainer gave up waiting or closed the session: an agent
    should stop at its next turn."""

    base_url: str
    api_key: str
    model: str
    messages: List[Message]
    tools: List[Any]
    session: ResourceSession
    bridge: SessionMCPBridge
    episode_id: Optional[str] = None
    uds: Optional[str] = None
    cancelled: threading.Event = field(default_factory=threading.Event)


Agent = Callable[[AgentRun], Optional[int]]
"""An agent: runs one episode to its end and returns its exit code (``None`` counts as 0)."""


class _ProxyAdmin:
    """The capture proxy's admin routes over HTTP (``url``, ``admin_key``, optional ``uds``)."""

    def __init__(self, proxy: Any, timeout_s: float = 30.0) -> None:
        uds = getattr(proxy, "uds", None)
        self.url: str = proxy.url
        self.uds: Optional[str] = uds
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {proxy.admin_key}"},
            transport=httpx.HTTPTransport(uds=uds) if uds else None,
            timeout=timeout_s,
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The route's JSON; ``ValueError`` when the proxy refuses the rollout as training data
        (409: eval rollout, fatal findings, turns without logprobs), ``RuntimeError`` otherwise."""
        response = self._http.request(method, path, **kwargs)
        if response.status_code == 409:
            try:
                why = response.json().get("error") or response.text
            except ValueError:
                why = response.text
            raise ValueError(f"the capture proxy refuses {path}: {why}")
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {self.url}{path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def close(self) -> None:
        self._http.close()


class CapturedAgentSession(ResourceSession):
    """One episode: an agent on a thread, its model calls captured by the proxy, its tools those
    of ``env`` (a :class:`ResourceSession` this session owns and closes).

    Made by :class:`CapturedAgentSessionFactory` (or directly). The agent starts at once.
    ``timeout_s`` bounds :meth:`wait_for_completion` when it is given no timeout; the agent's own
    HTTP calls are bounded by the agent. :meth:`close` tells the agent to stop, closes the
    environment session and, with ``delete_on_close``, deletes the capture session.
    """

    def __init__(
        self,
        env: ResourceSession,
        proxy: Any,
        agent: Agent,
        *,
        episode_id: Optional[str] = None,
        sampling: Optional[Mapping[str, Any]] = None,
        model: str = "policy",
        max_model_calls: Optional[int] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        timeout_s: float = 600.0,
        delete_on_close: bool = True,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._env = env
        self.timeout_s = timeout_s
        self.delete_on_close = delete_on_close
        self._lock = threading.Lock()
        self._closed = False
        self._exit_code: Optional[int] = None
        self.error: Optional[BaseException] = None
        """What the agent raised, if it did (its exit code is then :data:`EXIT_ERROR`)."""
        self._admin = _ProxyAdmin(proxy)
        fields: Dict[str, Any] = {"metadata": {**dict(metadata or {}), "episode_id": episode_id}}
        if sampling:
            fields["sampling"] = dict(sampling)
        if max_model_calls is not None:
            fields["max_model_calls"] = max_model_calls
        try:
            created = self._admin.call("POST", "/sessions", json=fields)
        except BaseException:
            self._admin.close()
            raise
        self.session_id: str = created["session_id"]
        """The capture session's id on the proxy."""
        self.run = AgentRun(
            base_url=self._admin.url.rstrip("/") + "/v1",
            api_key=created["api_key"],
            model=model,
            messages=list(env.initial_messages()),
            tools=list(env.list_tools()),
            session=env,
            bridge=SessionMCPBridge(env),
            episode_id=episode_id,
            uds=self._admin.uds,
        )
        self._agent = agent
        self._thread = threading.Thread(target=self._main, name=f"openenv-agent-{self.session_id[:12]}", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            code = self._agent(self.run)
            self._exit_code = 0 if code is None else int(code)
        except BaseException as exc:  # the agent's failure is the session's to report, not the thread's
            self.error = exc
            self._exit_code = EXIT_ERROR
            if not self.run.cancelled.is_set():
                logger.warning("the agent of capture session %s failed", self.session_id, exc_info=exc)

    # --- the loop-owning protocols ----------------------------------------------------------

    @property
    def exit_code(self) -> Optional[int]:
        """The agent's exit code (``None`` while it runs)."""
        return self._exit_code

    def wait_for_completion(self, timeout_s: Optional[float] = None) -> int:
        """Wait for the agent to end and return its exit code; ``TimeoutError`` (the agent is told
        to stop) when it runs past ``timeout_s`` (default :attr:`timeout_s`)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        self._thread.join(limit)
        if self._thread.is_alive():
            self.run.cancelled.set()
            raise TimeoutError(f"the agent of capture session {self.session_id} did not finish within {limit:g} s")
        assert self._exit_code is not None
        return self._exit_code

    def fetch_training_trace(self) -> TrainingTrace:
        """The proxy's validated token capture of this session; ``ValueError`` when the proxy
        cannot vouch for it as training data.

        An agent that made no model call (it failed at once, or timed out first) gives an empty
        trace: nothing to train on is not a broken capture, and TRL stops training on a
        ``ValueError`` here."""
        try:
            return TrainingTrace.model_validate(self._admin.call("GET", f"/sessions/{self.session_id}/training_trace"))
        except ValueError:
            if self.fetch_proxy_trace() == []:  # the proxy's only answer for a session without turns
                return TrainingTrace(turns=[])
            raise

    def fetch_proxy_trace(self) -> List[TraceEntry]:
        """The session's usable turns as trace entries (``ValueError`` as :meth:`fetch_training_trace`)."""
        return self._admin.call("GET", f"/sessions/{self.session_id}/trace_entries")["entries"]

    # --- the environment's side -------------------------------------------------------------

    def initial_messages(self) -> List[Message]:
        return self._env.initial_messages()

    def list_tools(self) -> List[Any]:
        return self._env.list_tools()

    def call_tool(self, name: str, arguments: Dict[str, Any]) -> ToolResult:
        return self._env.call_tool(name, arguments)

    def verify(self, transcript: List[Message], final_state: Optional[Dict[str, Any]] = None) -> VerifyResult:
        """The environment's verdict, as it gave it (``env_reward`` included); the agent's exit
        code is added to its metrics."""
        verdict = self._env.verify(transcript, final_state)
        return dataclasses.replace(verdict, metrics={**verdict.metrics, "agent_exit_code": self._exit_code})

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.run.cancelled.set()
        try:
            self._env.close()  # an agent still calling tools now fails at its next call
        finally:
            try:
                if self.delete_on_close:
                    self._admin.call("DELETE", f"/sessions/{self.session_id}")
            except Exception:
                logger.warning("deleting capture session %s failed", self.session_id, exc_info=True)
            finally:
                self._admin.close()


class CapturedAgentSessionFactory(ResourceSessionFactory[CapturedAgentSession]):
    """Makes a :class:`CapturedAgentSession` per rollout: ``env_factory.create(task, seed=,
    episode_id=)`` for the environment, ``proxy`` (a
    :class:`~openenv.core.harness.capture.CaptureServer`, or anything with its ``url``,
    ``admin_key`` and ``uds``) for the capture, ``agent`` for the loop.

    ``sampling`` is the training policy every capture session samples with; it is checked here
    with :func:`~openenv.core.harness.capture.upstream.training_sampling`. TRL's async GRPO
    worker calls the factory's constructor with ``sampling=`` itself, so hand it
    ``functools.partial(CapturedAgentSessionFactory, proxy, env_factory, agent)``.
    """

    def __init__(
        self,
        proxy: Any,
        env_factory: ResourceSessionFactory[Any],
        agent: Agent,
        *,
        sampling: Optional[Mapping[str, Any]] = None,
        model: str = "policy",
        max_model_calls: Optional[int] = None,
        timeout_s: float = 600.0,
        delete_on_close: bool = True,
    ) -> None:
        self.proxy = proxy
        self.env_factory = env_factory
        self.agent = agent
        self.sampling = training_sampling(sampling) or None
        self.model = model
        self.max_model_calls = max_model_calls
        self.timeout_s = timeout_s
        self.delete_on_close = delete_on_close

    def create(self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None) -> CapturedAgentSession:
        env = self.env_factory.create(task, seed=seed, episode_id=episode_id)
        try:
            return CapturedAgentSession(
                env,
                self.proxy,
                self.agent,
                episode_id=episode_id,
                sampling=self.sampling,
                model=self.model,
                max_model_calls=self.max_model_calls,
                metadata={"seed": seed},
                timeout_s=self.timeout_s,
                delete_on_close=self.delete_on_close,
            )
        except BaseException:
            env.close()
            raise


# --- a minimal agent ------------------------------------------------------------------------------


def _function_schema(tool: Any) -> Dict[str, Any]:
    """A tool (MCP ``Tool`` or its listing) as an OpenAI function tool."""
    if isinstance(tool, Mapping):
        name, description = tool["name"], tool.get("description", "")
        schema = tool.get("input_schema", tool.get("inputSchema", {}))
    else:
        name, description, schema = tool.name, tool.description, tool.input_schema
    return {"type": "function", "function": {"name": name, "description": description or "", "parameters": schema}}


def chat_tool_agent(
    *,
    max_turns: int = 8,
    max_tokens: Optional[int] = None,
    seed: Optional[int] = None,
    request_timeout_s: float = 120.0,
) -> Agent:
    """A minimal agent: OpenAI chat completions with the environment's tools, each call run on the
    session and answered with a tool message, until the model stops calling tools, a tool ends
    the episode, ``max_turns`` model calls were made, or the run is cancelled (exit code 0; an
    HTTP error raises). ``seed`` (turn ``t`` asks for ``seed + t``) makes a run repeatable."""
    if type(max_turns) is not int or max_turns < 1:
        raise ValueError(f"max_turns must be a whole number >= 1, got {max_turns!r}")

    def agent(run: AgentRun) -> int:
        tools = [_function_schema(t) for t in run.tools]
        messages: List[Message] = [dict(m) for m in run.messages]
        transport = httpx.HTTPTransport(uds=run.uds) if run.uds else None
        headers = {"Authorization": f"Bearer {run.api_key}"}
        with httpx.Client(
            base_url=run.base_url, headers=headers, transport=transport, timeout=request_timeout_s
        ) as http:
            for turn in range(max_turns):
                if run.cancelled.is_set():
                    return 0
                body: Dict[str, Any] = {"model": run.model, "messages": messages}
                if tools:
                    body["tools"] = tools
                if max_tokens is not None:
                    body["max_tokens"] = max_tokens
                if seed is not None:
                    body["seed"] = seed + turn
                answer = http.post("/chat/completions", json=body)
                answer.raise_for_status()
                message = answer.json()["choices"][0]["message"]
                calls = message.get("tool_calls") or []
                reply: Message = {"role": "assistant", "content": message.get("content")}
                if calls:
                    reply["tool_calls"] = calls
                messages.append(reply)
                if not calls:
                    return 0
                ended = False
                for call in calls:
                    name = call["function"]["name"]
                    if ended or run.cancelled.is_set():
                        result = ToolResult(error="not run: the episode ended at an earlier call")
                    else:
                        try:
                            result = run.session.call_tool(name, json.loads(call["function"].get("arguments") or "{}"))
                        except Exception as exc:  # shown to the model, as a harness would
                            result = ToolResult(error=f"{type(exc).__name__}: {exc}")
                        ended = result.done
                    content = _tool_message_content(result)
                    messages.append({"role": "tool", "tool_call_id": call.get("id"), "name": name, "content": content})
                if ended:
                    return 0
        return 0

    return agent
