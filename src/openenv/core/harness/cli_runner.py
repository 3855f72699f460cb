"""Black-box rollouts with a real agent CLI: the session's tools over MCP, the model through the proxy.

:class:`CLIHarnessAdapter` leaves the agent to a ``runner(bridge, session, limits)``; this module is
that runner for the agent CLIs of :mod:`.agents`. One rollout:

* the session's tools become an MCP server (:func:`session_mcp_server`: FastMCP, every call answered
  through the :class:`~.rollout.SessionMCPBridge`), served by a :class:`~.bridge.HarnessMCPBridge`
  on a Unix socket of its own;
* a capture session is opened on the :class:`~.capture.CaptureServer` (its budget of model calls is
  ``limits.max_turns``), so every model call the agent makes is recorded token by token;
* the agent runs unchanged in a :class:`~.process.HarnessSandbox` whose only network is those two
  sockets (``services={"proxy": ..., "mcp": ...}``), given the session's opening messages as its
  task, until it exits or ``timeout_s`` passes (then it is stopped, and the rollout is not done);
* the :class:`~.rollout.HarnessRolloutResult` holds every tool call that reached the session (the
  tool trace), and the captured model turns as ``steps`` with the engine's own token ids and
  logprobs (and upstream's flat lists), so a trainer reads a black-box rollout as a white-box one.

Tool calls past ``limits.max_total_tool_calls``, and calls after one that ended the episode, are
answered with an error and not run, as :class:`~.rollout.MCPHarnessAdapter` answers them: the
environment's last reward stays the reward of the step that ended it.

Which harnesses can be given MCP tools: :data:`MCP_HARNESSES` (how each one is told where the server
is, and the name under which its model sees a tool, :func:`mcp_tool_name`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

from . import agents
from .bridge import HarnessMCPBridge
from .process import HarnessProcess, HarnessSandbox
from .rollout import (
    HarnessRolloutResult,
    HarnessRunLimits,
    Message,
    ModelStepResult,
    ResourceSession,
    RolloutEvent,
    SessionMCPBridge,
    ToolResult,
    ToolTraceEntry,
    _tool_message_content,
)

if TYPE_CHECKING:  # pragma: no cover
    from .capture import CaptureServer

__all__ = ["AgentCLIRunner", "MCP_HARNESSES", "ToolCallLog", "mcp_tool_name", "session_mcp_server", "with_mcp_server"]

MCP_SERVER_NAME = "env"
"""The name the session's MCP server goes by in the agent's configuration."""
HOME_PATH = "/home/agent"


# --- the session's tools as an MCP server ----------------------------------------------------------


def _call_through(bridge: SessionMCPBridge, name: str, arguments: Dict[str, Any]) -> ToolResult:
    """One ``tools/call`` through the bridge, its answer (or JSON-RPC error) as a :class:`ToolResult`."""
    answer = bridge.handle_request(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    )
    if "error" in answer:
        return ToolResult(error=str(answer["error"].get("message") or answer["error"]))
    body = answer["result"]
    return ToolResult(
        data=body.get("data"), done=bool(body.get("done")), metadata=body.get("metadata") or {}, error=body.get("error")
    )


_TOOL_CLASS: Any = None


def _bridged_tool_class() -> Any:
    """A FastMCP tool whose schema is given and whose call is a plain function (made once, lazily:
    FastMCP is an optional dependency)."""
    global _TOOL_CLASS
    if _TOOL_CLASS is None:
        from fastmcp.tools import Tool
        from fastmcp.tools import ToolResult as MCPToolResult
        from mcp.types import TextContent
        from pydantic import PrivateAttr

        class BridgedTool(Tool):
            _call: Callable[[str, Dict[str, Any]], ToolResult] = PrivateAttr()

            async def run(self, arguments: Dict[str, Any]) -> MCPToolResult:
                result = await asyncio.to_thread(self._call, self.name, dict(arguments or {}))
                text = _tool_message_content(result)
                return MCPToolResult(content=[TextContent(type="text", text=text)], is_error=result.error is not None)

        _TOOL_CLASS = BridgedTool
    return _TOOL_CLASS


def session_mcp_server(
    bridge: SessionMCPBridge,
    *,
    name: str = MCP_SERVER_NAME,
    call_tool: Optional[Callable[[str, Dict[str, Any]], ToolResult]] = None,
) -> Any:
    """The session behind ``bridge`` as a FastMCP server: its tools (names, descriptions, input
    schemas as ``tools/list`` gives them), each call answered through ``bridge`` (or by
    ``call_tool(name, arguments)``) with the result's text, and ``isError`` when it failed."""
    from fastmcp import FastMCP

    listing = bridge.handle_request({"jsonrpc": "2.0", "id": 0, "method": "tools/list"})
    if "error" in listing:
        raise RuntimeError(f"the session's tools could not be listed: {listing['error'].get('message')}")
    call = call_tool or (lambda tool, arguments: _call_through(bridge, tool, arguments))
    tool_class = _bridged_tool_class()
    server = FastMCP(name)
    for spec in listing["result"]["tools"]:
        tool = tool_class(
            name=spec["name"],
            description=spec.get("description") or "",
            parameters=spec.get("inputSchema") or {"type": "object", "properties": {}},
        )
        tool._call = call
        server.add_tool(tool)
    return server


# --- telling a harness about an MCP server ----------------------------------------------------------


def _claude_code_mcp(launch: agents.AgentLaunch, url: str, server: str) -> agents.AgentLaunch:
    argv = list(launch.argv)
    task = argv.pop()  # agents.launch puts the task last
    tools = argv.index("--tools")
    argv[tools + 1] = ""  # no built-in tools: the environment's are the agent's only ones
    config = json.dumps({"mcpServers": {server: {"type": "http", "url": url}}})
    # --mcp-config takes several values: "--" ends them before the task
    argv += ["--strict-mcp-config", "--mcp-config", config, "--", task]
    return agents.AgentLaunch(launch.harness, launch.dialect, argv, dict(launch.env), dict(launch.files))


MCP_HARNESSES: Dict[str, Callable[[agents.AgentLaunch, str, str], agents.AgentLaunch]] = {
    "claude-code": _claude_code_mcp,
}
"""The harnesses that can be given an MCP server (by :func:`with_mcp_server`), by install name."""

_MCP_TOOL_NAMES: Dict[str, Callable[[str, str], str]] = {
    "claude-code": lambda server, tool: f"mcp__{server}__{tool}",
}


def with_mcp_server(launch: agents.AgentLaunch, url: str, *, server: str = MCP_SERVER_NAME) -> agents.AgentLaunch:
    """``launch`` (from :func:`.agents.launch`) with the MCP server at ``url`` (streamable HTTP, as
    the agent reaches it) as its one source of tools; ``ValueError`` for a harness not in
    :data:`MCP_HARNESSES`."""
    wire = MCP_HARNESSES.get(launch.harness)
    if wire is None:
        raise ValueError(f"no MCP wiring for harness {launch.harness!r} (known: {', '.join(sorted(MCP_HARNESSES))})")
    return wire(launch, url, server)


def mcp_tool_name(harness: str, tool: str, *, server: str = MCP_SERVER_NAME) -> str:
    """The name under which ``harness`` shows an MCP server's ``tool`` to its model (what a model
    must call; ``mcp__env__run_command`` for Claude Code)."""
    if harness not in _MCP_TOOL_NAMES:
        raise ValueError(f"no MCP wiring for harness {harness!r} (known: {', '.join(sorted(MCP_HARNESSES))})")
    return _MCP_TOOL_NAMES[harness](server, tool)


# --- one rollout ------------------------------------------------------------------------------------


class ToolCallLog:
    """``call_tool`` for :func:`session_mcp_server`: the agent's tool calls run on the session one at a
    time, in order, each recorded (``trace``, ``events``). A call after one that ended the episode,
    or past ``limits.max_total_tool_calls`` (``metrics["truncated"]``), is answered with an error and
    not run, so the environment's last reward stays that of the step that ended it."""

    def __init__(self, bridge: SessionMCPBridge, limits: HarnessRunLimits) -> None:
        self.bridge = bridge
        self.limits = limits
        self.lock = threading.Lock()
        self.trace: List[ToolTraceEntry] = []
        self.events: List[RolloutEvent] = []
        self.metrics: Dict[str, Any] = {}
        self.episode_done = False

    def __call__(self, name: str, arguments: Dict[str, Any]) -> ToolResult:
        with self.lock:  # a session is not thread-safe, and the agent may call tools in parallel
            why_not = None
            if self.episode_done:
                why_not = "not run: the episode ended at an earlier call"
            elif self.limits.max_total_tool_calls is not None and len(self.trace) >= self.limits.max_total_tool_calls:
                self.metrics["truncated"] = True
                why_not = f"not run: the rollout's {self.limits.max_total_tool_calls} tool calls are used up (max_total_tool_calls)"
            if why_not is not None:
                self.metrics["skipped_tool_calls"] = self.metrics.get("skipped_tool_calls", 0) + 1
                payload = {"tool_name": name, "arguments": arguments, "reason": why_not}
                self.events.append(RolloutEvent("tool_call_skipped", payload))
                return ToolResult(error=why_not)
            result = _call_through(self.bridge, name, arguments)
            self.trace.append(ToolTraceEntry(name, dict(arguments), result))
            payload = {"tool_name": name, "arguments": arguments, "done": result.done}
            if result.error is not None:
                payload["error"] = result.error
                self.metrics["tool_errors"] = self.metrics.get("tool_errors", 0) + 1
            self.events.append(RolloutEvent("tool_call", payload))
            if result.done:
                self.episode_done = True
            return result


def _task_text(messages: List[Message]) -> str:
    """The opening messages as one prompt (a CLI takes its task as a single argument)."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content:
            parts.append(str(content))
    return "\n\n".join(parts)


def _step_of(turn: Any) -> ModelStepResult:
    """A captured turn as a model step (the engine's message parsed back into an :class:`LLMResponse`)."""
    from ..llm_client import LLMResponse, ToolCall

    choices = (turn.response or {}).get("choices") or [{}]
    message = choices[0].get("message") or {}
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
        except ValueError:
            parsed = {"_raw": arguments}
        calls.append(ToolCall(str(call.get("id") or ""), str(function.get("name") or ""), parsed))
    return ModelStepResult(
        LLMResponse(message.get("content"), calls),
        prompt_ids=list(turn.prompt_token_ids),
        completion_ids=list(turn.completion_token_ids),
        logprobs=list(turn.per_token_logps),
    )


def _run_blocking(coroutine_fn: Callable[[], Any]) -> Any:
    """Run ``coroutine_fn()`` to its end from blocking code, also when called inside an event loop
    (then on a thread of its own, since a loop cannot be nested)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine_fn())
    box: Dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(coroutine_fn())
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="openenv-cli-rollout")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class AgentCLIRunner:
    """A ``runner(bridge, session, limits)`` for :class:`~.rollout.CLIHarnessAdapter`: one rollout of
    the agent CLI ``harness`` (installed at ``install_root``, see :func:`.agents.harness_dir`),
    sandboxed, with the session's tools as its MCP server and ``proxy`` as its model.

    ``session_fields`` go to each capture session (``llm_url`` and ``model`` to pick the engine,
    ``purpose``); ``limits.sampling``, when given, becomes its training sampling. ``timeout_s``
    bounds the agent's run: past it the agent is stopped (SIGTERM, SIGKILL after
    ``terminate_grace_s``) and, unless a tool ended the episode, the rollout is not done.
    ``limits.max_turns`` is the capture session's budget of model calls (a call past it gets the
    proxy's final answer), ``limits.max_total_tool_calls`` bounds the calls run on the session;
    ``limits.max_tool_calls_per_turn`` does not apply (the runner does not see the agent's turns).
    ``task_builder(messages)`` makes the agent's one prompt from the session's opening messages.
    ``node``: the ``node`` executable the npm harnesses run on, shown in the sandbox when it is not
    the system's.

    The result: ``done`` when a tool ended the episode or the agent ended by itself (exit 0);
    ``metrics``: ``stop_reason`` (``env_done``, ``agent_exited``, ``agent_failed``, ``timeout``),
    ``exit_code``, ``timed_out``, ``elapsed_s``, ``turns`` (captured model calls), ``tool_calls``,
    ``capture_session_id`` (the proxy's record of the rollout), and where they apply
    ``truncated``, ``skipped_tool_calls``, ``tool_errors``, ``trace_error``. The last event,
    ``agent_exit``, carries the end of the agent's stderr.
    """

    def __init__(
        self,
        harness: str,
        *,
        proxy: CaptureServer,
        install_root: Optional[Union[str, os.PathLike]] = None,
        model: str = "tiny",
        session_fields: Optional[Dict[str, Any]] = None,
        timeout_s: float = 300.0,
        terminate_grace_s: float = 2.0,
        startup_timeout_s: float = 60.0,
        task_builder: Callable[[List[Message]], str] = _task_text,
        node: Optional[str] = None,
    ) -> None:
        if harness not in MCP_HARNESSES:
            raise ValueError(f"no MCP wiring for harness {harness!r} (known: {', '.join(sorted(MCP_HARNESSES))})")
        if proxy.uds is None:
            raise ValueError("the capture proxy must listen on a Unix socket: the sandbox reaches nothing else")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.harness = harness
        self.proxy = proxy
        self.install_root = agents.harness_dir(install_root)
        self.executable = agents.installed(harness, self.install_root)
        if self.executable is None:
            raise FileNotFoundError(
                f"{harness} is not installed in {self.install_root}: run `{agents.HARNESSES[harness].install_command}`"
            )
        self.model = model
        self.session_fields = dict(session_fields or {})
        self.timeout_s = float(timeout_s)
        self.terminate_grace_s = float(terminate_grace_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.task_builder = task_builder
        self.node = node

    def _sandbox(self, workdir: str, mcp_socket: str) -> HarnessSandbox:
        ro_paths: List[Any] = list(agents.HARNESSES[self.harness].install_paths(self.install_root))
        path: List[str] = []
        node_dir = os.path.dirname(os.path.realpath(self.node)) if self.node else None
        if (
            node_dir
            and agents.HARNESSES[self.harness].kind == "npm"
            and not node_dir.startswith(("/usr/", "/bin", "/sbin"))
        ):
            ro_paths.append(os.path.dirname(node_dir))  # the system is shown anyway
            path.append(node_dir)
        return HarnessSandbox(
            workspace=os.path.join(workdir, "workspace"),
            services={"proxy": str(self.proxy.uds), "mcp": mcp_socket},
            home=os.path.join(workdir, "home"),
            home_path=HOME_PATH,
            ro_paths=ro_paths,
            path=path,
        )

    def __call__(
        self, bridge: SessionMCPBridge, session: ResourceSession, limits: Optional[HarnessRunLimits] = None
    ) -> HarnessRolloutResult:
        limits = limits if limits is not None else HarnessRunLimits()
        return _run_blocking(lambda: self.run(bridge, session, limits))

    async def run(
        self, bridge: SessionMCPBridge, session: ResourceSession, limits: HarnessRunLimits
    ) -> HarnessRolloutResult:
        """One rollout (the async form of calling the runner)."""
        opening = list(session.initial_messages())
        if limits.max_turns < 1:  # not one model call allowed: the agent is not started
            return HarnessRolloutResult(
                messages=opening, metrics={"turns": 0, "tool_calls": 0, "stop_reason": "max_turns"}
            )
        fields = {**self.session_fields, "max_model_calls": limits.max_turns}
        fields.setdefault("metadata", {"harness": self.harness})
        if limits.sampling:
            fields["sampling"] = dict(limits.sampling)
        capture = self.proxy.create_session(**fields)
        calls = ToolCallLog(bridge, limits)
        workdir = tempfile.mkdtemp(prefix="oe-cli-", dir="/tmp")  # short: Unix socket paths stay under 108 bytes
        mcp = HarnessMCPBridge(session_mcp_server(bridge, call_tool=calls), uds=os.path.join(workdir, "mcp.sock"))
        process: Optional[HarnessProcess] = None
        code: Optional[int] = None
        started = time.monotonic()
        try:
            os.mkdir(os.path.join(workdir, "workspace"))
            os.mkdir(os.path.join(workdir, "home"))
            await mcp.start_async()
            sandbox = self._sandbox(workdir, str(mcp.uds))
            launch = agents.launch(
                self.harness,
                base_url=sandbox.url("proxy"),
                api_key=capture["api_key"],
                model=self.model,
                task=self.task_builder(opening),
                executable=str(self.executable),
                home=HOME_PATH,
            )
            launch = with_mcp_server(launch, sandbox.url("mcp") + mcp.path)
            launch.write_files(sandbox.home)  # type: ignore[arg-type]
            process = HarnessProcess(
                launch.argv,
                None,
                env_vars=launch.env,
                startup_timeout_s=self.startup_timeout_s,
                terminate_grace_s=self.terminate_grace_s,
                sandbox=sandbox,
                stdin="closed",
            )
            await process.start()
            code = await process.wait(self.timeout_s)
        finally:
            elapsed = time.monotonic() - started
            stderr = process.drain_stderr() if process is not None else ""
            if process is not None:
                await process.stop()
            try:
                await mcp.stop_async()
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        return self._result(opening, calls, capture["session_id"], code, elapsed, stderr)

    def _result(
        self,
        opening: List[Message],
        calls: ToolCallLog,
        capture_id: str,
        code: Optional[int],
        elapsed: float,
        stderr: str,
    ) -> HarnessRolloutResult:
        timed_out = code is None
        rollout = HarnessRolloutResult(messages=opening, tool_trace=list(calls.trace), events=list(calls.events))
        metrics = rollout.metrics
        metrics.update(calls.metrics)
        try:
            turns = self.proxy.training_trace(capture_id).turns
        except Exception as exc:  # a capture a trainer cannot use: say why, keep the rest
            turns = []
            metrics["trace_error"] = str(exc)
        for turn in turns:
            step = _step_of(turn)
            rollout.steps.append(step)
            rollout.prompt_ids.extend(step.prompt_ids)
            rollout.completion_ids.extend(step.completion_ids)
            rollout.logprobs.extend(step.logprobs)
        if turns:  # the conversation as the model last saw it, and its answer
            last = turns[-1]
            rollout.messages = [
                *last.request.get("messages", []),
                *[s.response.to_message_dict() for s in rollout.steps[-1:]],
            ]
        if timed_out:
            stop_reason = "timeout"
        elif calls.episode_done:
            stop_reason = "env_done"
        else:
            stop_reason = "agent_exited" if code == 0 else "agent_failed"
        rollout.done = calls.episode_done or code == 0
        rollout.events.append(
            RolloutEvent("agent_exit", {"exit_code": code, "timed_out": timed_out, "stderr": stderr[-2000:]})
        )
        metrics.update(
            {
                "turns": len(rollout.steps),
                "tool_calls": len(rollout.tool_trace),
                "stop_reason": stop_reason,
                "exit_code": code,
                "timed_out": timed_out,
                "elapsed_s": round(elapsed, 3),
                "capture_session_id": capture_id,
            }
        )
        return rollout
