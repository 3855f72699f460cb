"""Concrete turn-based adapters: a JSON-lines agent program, and Claude Code run once per turn.

Both run their harness through :class:`~.process.HarnessProcess`, plainly or in its sandbox
(``sandbox=HarnessSandbox(...)``), and reach the environment's tools through the MCP bridge:

* :class:`JsonLinesHarnessAdapter` keeps one process for the episode and speaks the turn protocol
  as JSON lines: the harness prints ``{"type": "ready"}`` once it can take a turn; each turn it
  reads one :class:`~.events.HarnessClientMessage` line and prints :class:`~.events.HarnessEvent`
  lines (``{"type", "data"}``, ``timestamp`` optional), the last of type ``turn_complete``. A
  stdout line that is not an event becomes a ``text_output`` event. It finds its tools in
  ``OPENENV_MCP_URL`` (the bridge's URL as it can reach it; absent without tools) and
  ``OPENENV_TOOLS`` (a JSON list of ``{"name", "description", "input_schema"}``).
* :class:`ClaudeCodeHarnessAdapter` runs the ``claude`` CLI non-interactively once per turn
  (``claude -p --output-format stream-json``), the first turn with a fresh ``--session-id`` and the
  next ones with ``--resume`` of it, so the conversation carries over; the bridge is its only MCP
  server (``--strict-mcp-config``), and its JSON stream becomes the turn's events.

A sandboxed harness cannot reach the host's loopback: give the environment ``bridge_uds=`` and the
adapter adds the bridge's socket to its sandbox's services as ``mcp``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import uuid
from typing import Any, AsyncIterator, Dict, Iterable, List, Optional, Tuple

from openenv.core.env_server.mcp_types import Tool

from .adapter import AgenticHarnessAdapter
from .bridge import split_unix_url
from .config import HarnessConfig, HarnessTransport
from .errors import HarnessError, HarnessNotRunningError, HarnessStartupError
from .events import HarnessClientMessage, HarnessEvent, HarnessEventType
from .process import HarnessProcess, HarnessSandbox

MCP_SERVICE = "mcp"
"""The name of the bridge's service in a harness's sandbox."""


def agent_bridge_url(
    bridge_url: Optional[str], sandbox: Optional[HarnessSandbox]
) -> Tuple[Optional[str], Optional[HarnessSandbox]]:
    """The bridge's URL as the harness reaches it, and the sandbox to run it in.

    A bridge on a Unix socket becomes the sandbox's ``mcp`` service (``http://127.0.0.1:<port>/mcp``
    inside); without a sandbox its ``http+unix://`` URL is passed as it is. A bridge on a host port
    cannot be reached from a sandbox: ``HarnessError``."""
    if bridge_url is None:
        return None, sandbox
    unix = split_unix_url(bridge_url)
    if sandbox is None:
        return bridge_url, None
    if unix is None:
        raise HarnessError(
            f"a sandboxed harness cannot reach the MCP bridge at {bridge_url} (the host's loopback): "
            "serve it on a Unix socket (HarnessEnvironment(..., bridge_uds=path))"
        )
    socket_path, path = unix
    if MCP_SERVICE in sandbox.services:
        raise HarnessError(f"the harness's sandbox already has a service named {MCP_SERVICE!r}")
    sandbox = dataclasses.replace(sandbox, services={**sandbox.services, MCP_SERVICE: socket_path})
    return sandbox.url(MCP_SERVICE) + path, sandbox


def _tools_json(tools: Iterable[Tool]) -> str:
    return json.dumps([tool.model_dump() for tool in tools])


# --- a long-running JSON-lines agent -----------------------------------------------------------


def _is_ready(line: str) -> bool:
    try:
        message = json.loads(line)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("type") == "ready"


def _event_of_line(line: str) -> HarnessEvent:
    """A stdout line as an event: a JSON event as it is, anything else as text output."""
    try:
        message = json.loads(line)
    except ValueError:
        message = None
    if isinstance(message, dict) and message.get("type") in HarnessEventType._value2member_map_:
        try:
            return HarnessEvent.model_validate(message)
        except ValueError:
            pass
    return HarnessEvent(type=HarnessEventType.TEXT_OUTPUT, data={"text": line})


class JsonLinesHarnessAdapter(AgenticHarnessAdapter):
    """An agent program that lives for the episode and speaks the turn protocol as JSON lines.

    ``config.command`` is the program (its transport must be ``stdio``); ``builtin_tools`` the
    names of its own tools; ``sandbox`` where it runs (None: a plain process in
    ``working_directory``, with this process's environment plus ``config.env_vars``)."""

    def __init__(
        self,
        config: HarnessConfig,
        *,
        builtin_tools: Iterable[str] = (),
        sandbox: Optional[HarnessSandbox] = None,
        terminate_grace_s: float = 5.0,
    ) -> None:
        if config.transport != HarnessTransport.STDIO:
            raise ValueError(f"{type(self).__name__} speaks over stdio, not {config.transport.value!r}")
        super().__init__(config)
        self.BUILTIN_TOOL_NAMES = frozenset(builtin_tools)
        self.sandbox = sandbox
        self.terminate_grace_s = terminate_grace_s
        self._tool_env: Dict[str, str] = {}
        self._run_sandbox = sandbox
        self._process: Optional[HarnessProcess] = None

    @property
    def process(self) -> Optional[HarnessProcess]:
        """The harness's process while it runs."""
        return self._process

    async def inject_tools(self, tools: List[Tool], bridge_url: Optional[str] = None) -> None:
        url, self._run_sandbox = agent_bridge_url(bridge_url, self.sandbox)
        self._tool_env = {"OPENENV_TOOLS": _tools_json(tools)}
        if url is not None:
            self._tool_env["OPENENV_MCP_URL"] = url

    async def start(self, working_directory: str) -> None:
        if self._process is not None and self._process.is_running():
            raise HarnessStartupError(f"harness {self.config.name!r} is already running")
        process = HarnessProcess(
            self.config.command,
            working_directory,
            env_vars={**self.config.env_vars, **self._tool_env},
            startup_timeout_s=self.config.startup_timeout_s,
            terminate_grace_s=self.terminate_grace_s,
            sandbox=self._run_sandbox,
        )
        self._process = process
        await process.start(ready_check=_is_ready)

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            await process.stop()

    async def is_alive(self) -> bool:
        return self._process is not None and self._process.is_running()

    async def send_message_streaming(self, message: str) -> AsyncIterator[HarnessEvent]:
        process = self._process
        if process is None:
            raise HarnessNotRunningError(f"harness {self.config.name!r} is not running: start it first")
        await process.write_line(HarnessClientMessage(type="message", content=message).model_dump_json())
        while True:
            line = await process.read_line()
            if line is None:
                code = await process.wait(1.0)
                tail = process.drain_stderr()
                raise HarnessNotRunningError(
                    f"harness {self.config.name!r} exited during its turn (exit code {code})"
                    + (f"; stderr:\n{tail}" if tail else "")
                )
            event = _event_of_line(line)
            yield event
            if event.type == HarnessEventType.TURN_COMPLETE:
                return


# --- Claude Code, one CLI run per turn ---------------------------------------------------------

CLAUDE_QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
"""What keeps Claude Code from calling anything but its model (telemetry, updates, error reports)."""


class ClaudeCodeHarnessAdapter(AgenticHarnessAdapter):
    """Claude Code (the ``claude`` CLI), one non-interactive run per turn, resumed turn to turn.

    ``config.command`` is the ``claude`` executable (and any options of yours); ``config.model``
    its ``--model``; ``config.env_vars`` its environment (``ANTHROPIC_BASE_URL``,
    ``ANTHROPIC_API_KEY``: where its model is); ``config.api_key_env_var`` names a variable of this
    process passed on under the same name. ``tools`` are the built-in tools it may use (``--tools``;
    none by default: it then has only the environment's), ``system_prompt`` is appended to its own.
    Its home (``~/.claude``, where the session lives between turns) is a fresh directory per
    episode, removed by :meth:`stop`, unless ``sandbox.home`` (or ``HOME`` in ``env_vars``) is given.
    The environment's tools are named ``mcp__<server_name>__<tool>`` inside Claude Code; events
    report them under the injected name (``tool_name``) and Claude Code's (``harness_tool_name``).
    """

    def __init__(
        self,
        config: HarnessConfig,
        *,
        tools: Iterable[str] = (),
        sandbox: Optional[HarnessSandbox] = None,
        system_prompt: Optional[str] = None,
        server_name: str = "env",
        terminate_grace_s: float = 2.0,
    ) -> None:
        super().__init__(config)
        self.tools = list(tools)
        self.BUILTIN_TOOL_NAMES = frozenset(self.tools)
        self.sandbox = sandbox
        self.system_prompt = system_prompt
        self.server_name = server_name
        self.terminate_grace_s = terminate_grace_s
        self.session_id: Optional[str] = None
        self._mcp_config: Optional[str] = None
        self._tool_sandbox = sandbox  # the sandbox with the bridge's service added
        self._run_sandbox = sandbox  # ... and this episode's home
        self._home: Optional[str] = None
        self._cwd: Optional[str] = None
        self._turns = 0
        self._process: Optional[HarnessProcess] = None
        self._started = False

    @property
    def home(self) -> Optional[str]:
        """The episode's home directory on the host (its ``.claude`` holds the session), when made here."""
        return self._home

    @property
    def process(self) -> Optional[HarnessProcess]:
        """The CLI's process while a turn runs."""
        return self._process

    async def inject_tools(self, tools: List[Tool], bridge_url: Optional[str] = None) -> None:
        url, self._tool_sandbox = agent_bridge_url(bridge_url, self.sandbox)
        if url is not None and split_unix_url(url) is not None:
            raise HarnessError("Claude Code cannot reach an MCP server on a Unix socket without a sandbox's relay")
        servers = {self.server_name: {"type": "http", "url": url}} if url is not None and tools else {}
        self._mcp_config = json.dumps({"mcpServers": servers})

    async def start(self, working_directory: str) -> None:
        await self.stop()
        sandbox = self._run_sandbox = self._tool_sandbox
        if sandbox is None and not os.path.isdir(working_directory):
            raise HarnessStartupError(f"cannot start Claude Code: no directory {working_directory!r}")
        if (sandbox is None and "HOME" not in self.config.env_vars) or (sandbox is not None and sandbox.home is None):
            self._home = tempfile.mkdtemp(prefix="openenv-claude-home-")
            if sandbox is not None:
                self._run_sandbox = dataclasses.replace(sandbox, home=self._home)
        self._cwd = working_directory
        self.session_id = str(uuid.uuid4())
        self._turns = 0
        self._started = True

    async def stop(self) -> None:
        self._started = False
        process, self._process = self._process, None
        if process is not None:
            await process.stop()
        home, self._home = self._home, None
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)

    async def is_alive(self) -> bool:
        return self._started

    def _argv(self, message: str) -> List[str]:
        argv = [*self.config.command, "-p", "--bare", "--output-format", "stream-json", "--verbose"]
        argv += ["--dangerously-skip-permissions", "--tools", ",".join(self.tools)]
        if self.config.model:
            argv += ["--model", self.config.model]
        argv += ["--strict-mcp-config", "--mcp-config", self._mcp_config or '{"mcpServers": {}}']
        if self.system_prompt:
            argv += ["--append-system-prompt", self.system_prompt]
        argv += ["--resume" if self._turns else "--session-id", str(self.session_id)]
        # stdin at end of file: given its prompt as an argument, claude still waits up to 3 s for stdin
        return ["/bin/sh", "-c", 'exec "$0" "$@" </dev/null', *argv, "--", message]

    def _env(self) -> Dict[str, str]:
        env = dict(CLAUDE_QUIET_ENV)
        if os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"  # as root, --dangerously-skip-permissions refuses to run without it
        if self._run_sandbox is None and self._home is not None:
            env["HOME"] = self._home
        if self.config.api_key_env_var and self.config.api_key_env_var in os.environ:
            env[self.config.api_key_env_var] = os.environ[self.config.api_key_env_var]
        env.update(self.config.env_vars)
        return env

    async def send_message_streaming(self, message: str) -> AsyncIterator[HarnessEvent]:
        if not self._started or self._cwd is None:
            raise HarnessNotRunningError("Claude Code is not started: start it first")
        process = HarnessProcess(
            self._argv(message),
            self._cwd,
            env_vars=self._env(),
            startup_timeout_s=self.config.startup_timeout_s,
            terminate_grace_s=self.terminate_grace_s,
            sandbox=self._run_sandbox,
        )
        self._process = process
        try:
            await process.start()
            while True:
                line = await process.read_line()
                if line is None:
                    break
                for event in self._events_of(line):
                    if event.type == HarnessEventType.TURN_COMPLETE:
                        self._turns += 1  # the session exists now: the next turn resumes it
                        await process.wait(10.0)  # let it write its session before it is stopped
                        yield event
                        return
                    yield event
            code = await process.wait(10.0)
            tail = process.drain_stderr()
            raise HarnessNotRunningError(
                f"Claude Code exited (code {code}) without finishing its turn" + (f"; stderr:\n{tail}" if tail else "")
            )
        finally:
            if self._process is process:
                self._process = None
            await process.stop()

    def _events_of(self, line: str) -> List[HarnessEvent]:
        """The events of one line of Claude Code's ``stream-json`` output."""
        try:
            message = json.loads(line)
        except ValueError:
            return [HarnessEvent(type=HarnessEventType.TEXT_OUTPUT, data={"text": line})]
        if not isinstance(message, dict):
            return []
        kind = message.get("type")
        if kind == "assistant":
            events = []
            payload = message.get("message") or {}
            events.append(HarnessEvent(type=HarnessEventType.LLM_RESPONSE, data={"message": payload}))
            for block in payload.get("content") or []:
                if block.get("type") == "text":
                    events.append(HarnessEvent(type=HarnessEventType.TEXT_OUTPUT, data={"text": block.get("text", "")}))
                elif block.get("type") == "tool_use":
                    events.append(
                        HarnessEvent(
                            type=HarnessEventType.TOOL_CALL,
                            data={
                                "tool_name": self._tool_name(block.get("name", "")),
                                "harness_tool_name": block.get("name", ""),
                                "arguments": block.get("input") or {},
                                "tool_call_id": block.get("id"),
                            },
                        )
                    )
            return events
        if kind == "user":
            events = []
            for block in (message.get("message") or {}).get("content") or []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    data = {
                        "tool_call_id": block.get("tool_use_id"),
                        "result": block.get("content"),
                        "is_error": bool(block.get("is_error")),
                    }
                    events.append(HarnessEvent(type=HarnessEventType.TOOL_RESULT, data=data))
            return events
        if kind == "result":
            events = []
            data: Dict[str, Any] = {
                "response": str(message.get("result") or ""),
                "session_id": message.get("session_id"),
                "num_turns": message.get("num_turns"),
                "stop_reason": message.get("stop_reason"),
            }
            if message.get("is_error"):
                error = {
                    "message": str(message.get("result") or message.get("subtype") or "error"),
                    "recoverable": True,
                }
                events.append(HarnessEvent(type=HarnessEventType.ERROR, data=error))
            events.append(HarnessEvent(type=HarnessEventType.TURN_COMPLETE, data=data))
            return events
        return []  # system lines (init, UI notices): nothing of the turn's substance

    def _tool_name(self, name: str) -> str:
        prefix = f"mcp__{self.server_name}__"
        return name[len(prefix) :] if name.startswith(prefix) else name


__all__ = [
    "CLAUDE_QUIET_ENV",
    "ClaudeCodeHarnessAdapter",
    "JsonLinesHarnessAdapter",
    "MCP_SERVICE",
    "agent_bridge_url",
]
