"""The turn-based harness layer (upstream's RFC 005): HarnessEnvironment over real harness processes.

The harness is a real program (``_turn_agent.py``, speaking the JSON-lines turn protocol, with its
own MCP client) or the real Claude Code CLI run once per turn; the environment's tools are a real
FastMCP server, served to the harness by the real bridge (streamable HTTP on 127.0.0.1, or on a
Unix socket reached from inside the harness sandbox). The Claude Code tests give it a scripted
Anthropic Messages server as its model (the replies stream through the capture proxy's own
Anthropic dialect), so that its tool call is known in advance; they skip without the install
(``bash scripts/install-harnesses.sh npm``, ``$OPENENV_HARNESS_DIR``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from fastmcp import Client, FastMCP
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.env_server.types import Action
from openenv.core.harness import agents
from openenv.core.harness.adapter import response_from_events
from openenv.core.harness.agentic_adapters import ClaudeCodeHarnessAdapter, JsonLinesHarnessAdapter
from openenv.core.harness.bridge import HarnessMCPBridge, build_bridge_server, split_unix_url, unix_socket_url
from openenv.core.harness.config import HarnessConfig, HarnessTransport
from openenv.core.harness.environment import HarnessAction, HarnessEnvironment
from openenv.core.harness.errors import HarnessError, HarnessNotRunningError
from openenv.core.harness.events import (
    HarnessClientMessage,
    HarnessEvent,
    HarnessEventType,
    HarnessProtocolError,
    events_to_metadata,
    parse_client_message,
)
from openenv.core.harness.process import HarnessSandbox
from openenv.core.rubrics import Rubric

ROOT = Path(__file__).resolve().parents[2]
PYTHON = os.path.realpath(sys.executable)  # the base interpreter: the sandbox shows it
AGENT = Path(__file__).with_name("_turn_agent.py")
AGENT_INSIDE = "/opt/agent/turn_agent.py"

needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)


# --- the environment's tools ---------------------------------------------------------------------


class Tools:
    """A FastMCP server whose ``read`` collides with the harness's built-in ``read``; calls are recorded."""

    def __init__(self) -> None:
        self.calls: List[Any] = []
        self.server = FastMCP("env-tools")

        @self.server.tool
        def read(path: str) -> str:
            """Read a file of the environment."""
            self.calls.append(("read", path))
            return f"contents of {path}"

        @self.server.tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            self.calls.append(("add", a, b))
            return a + b


@pytest.fixture
def tools() -> Tools:
    return Tools()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(f"/tmp/oe-turn-{uuid.uuid4().hex[:8]}")  # Unix socket paths stay under 108 bytes
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def line_adapter(
    workspace: Path, *, sandbox: Optional[HarnessSandbox] = None, session_timeout_s: float = 60.0
) -> JsonLinesHarnessAdapter:
    script = AGENT_INSIDE if sandbox is not None else str(AGENT)
    config = HarnessConfig(
        name="turn-agent",
        command=[PYTHON, "-I", script],
        working_directory="/workspace" if sandbox is not None else str(workspace),
        startup_timeout_s=30.0,
        session_timeout_s=session_timeout_s,
    )
    return JsonLinesHarnessAdapter(config, builtin_tools=["read"], sandbox=sandbox, terminate_grace_s=1.0)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _event_types(observation: Any) -> List[str]:
    return [event["type"] for event in observation.metadata["turn_events"]]


# --- the environment over a real harness ---------------------------------------------------------


async def test_reset_and_turns_over_a_real_harness_with_bridged_tools(tmp_path: Path, tools: Tools) -> None:
    env = HarnessEnvironment(line_adapter(tmp_path), mcp=tools.server)
    try:
        reset = await env.reset_async(episode_id="ep-1")
        assert reset.done is False and reset.reward is None  # unscored (upstream gives 0.0)
        assert reset.metadata == {"episode_id": "ep-1", "injected_tools": ["env_read", "add"]}
        assert env.bridge_url is not None and env.bridge_url.startswith("http://127.0.0.1:")
        process = env.adapter.process
        assert process is not None and process.is_running()

        listed = await env.step_async(HarnessAction(message="tools"))
        assert listed.metadata["response"] == "add env_read"  # the colliding tool renamed, the original gone
        assert listed.metadata["turn_number"] == 1 and listed.done is False and listed.reward == 0.0

        called = await env.step_async(HarnessAction(message='call env_read {"path": "notes.txt"}'))
        assert json.loads(called.metadata["response"]) == "contents of notes.txt"
        assert _event_types(called) == ["tool_call", "tool_result", "turn_complete"]
        assert called.metadata["turn_events"][0]["data"] == {
            "tool_name": "env_read",
            "arguments": {"path": "notes.txt"},
        }
        summed = await env.step_async(HarnessAction(message='call add {"a": 2, "b": 40}'))
        assert json.loads(summed.metadata["response"]) == 42
        assert tools.calls == [("read", "notes.txt"), ("add", 2, 40)]  # the host's tools ran

        echoed = await env.step_async(HarnessAction(message="hello there"))
        assert echoed.metadata["response"] == "echo: hello there"
        assert echoed.metadata["turn_events"][0] == {
            "type": "text_output",
            "timestamp": echoed.metadata["turn_events"][0]["timestamp"],
            "data": {"text": "plain text, not an event"},
        }

        # The environment's own MCP actions still work beside the turns.
        direct = await env.step_async(CallToolAction(tool_name="add", arguments={"a": 1, "b": 1}))
        assert direct.result.data == 2
        names = [t.name for t in (await env.step_async(ListToolsAction())).tools]
        assert names == ["read", "add"]

        finished = await env.step_async(HarnessAction(message="done all good"))
        assert finished.done is True and finished.metadata["response"] == "all good"
        assert env.state.episode_id == "ep-1" and env.state.step_count == 5
        assert [e.type for e in env.trajectory].count(HarnessEventType.TURN_COMPLETE) == 5

        with pytest.raises(TypeError, match="HarnessAction"):
            await env.step_async(Action())

        # A new episode stops the old harness and bridge and starts fresh ones.
        old_url = env.bridge_url
        again = await env.reset_async()
        assert again.metadata["episode_id"] != "ep-1" and env.state.step_count == 0 and env.trajectory == []
        assert not process.is_running() and env.bridge_url != old_url
    finally:
        await env.close_async()
    assert env.adapter.process is None and not _alive(process.pid or 0)


def test_the_sync_api_runs_turns(tmp_path: Path, tools: Tools) -> None:
    env = HarnessEnvironment(line_adapter(tmp_path), mcp=tools.server)
    try:
        assert env.reset().metadata["injected_tools"] == ["env_read", "add"]
        observation = env.step(HarnessAction(message='call add {"a": 3, "b": 4}'))
        assert json.loads(observation.metadata["response"]) == 7 and env.state.step_count == 1
    finally:
        env.close()
    assert tools.calls == [("add", 3, 4)]


class AnswerIs42(Rubric):
    """Scores a turn 1.0 when the harness answered 42; counts its resets."""

    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    def forward(self, action: Any, observation: Any) -> float:
        return 1.0 if observation.metadata.get("response") == "42" else 0.0

    def reset(self) -> None:
        self.resets += 1


async def test_the_rubric_scores_turns_and_reset_stays_unscored(tmp_path: Path, tools: Tools) -> None:
    rubric = AnswerIs42()
    env = HarnessEnvironment(line_adapter(tmp_path), mcp=tools.server, rubric=rubric)
    try:
        assert (await env.reset_async()).reward is None and rubric.resets == 1
        assert (await env.step_async(HarnessAction(message='call add {"a": 40, "b": 2}'))).reward == 1.0
        assert (await env.step_async(HarnessAction(message="hello"))).reward == 0.0
        assert (await env.step_async(HarnessAction(message="die"))).reward is None  # an error is not scored
    finally:
        await env.close_async()


async def test_without_tools_there_is_no_bridge(tmp_path: Path) -> None:
    env = HarnessEnvironment(line_adapter(tmp_path))
    try:
        reset = await env.reset_async()
        assert reset.metadata["injected_tools"] == [] and env.bridge_url is None
        observation = await env.step_async(HarnessAction(message="tools"))  # the agent has no MCP URL
        assert observation.done is False and observation.metadata["response"].startswith("failed:")
        assert "error" in _event_types(observation)
    finally:
        await env.close_async()


async def test_a_turn_past_its_time_ends_the_episode(tmp_path: Path, tools: Tools) -> None:
    env = HarnessEnvironment(line_adapter(tmp_path, session_timeout_s=1.0), mcp=tools.server)
    try:
        await env.reset_async()
        process = env.adapter.process
        assert process is not None
        pid = process.pid or 0
        # The config's per-turn limit applies without timeout_s.
        observation = await env.step_async(HarnessAction(message="sleep 30"))
        assert observation.done is True and observation.reward is None
        assert observation.metadata["error_type"] == "turn_timeout"
        assert "1 s" in observation.metadata["error"]
        last = observation.metadata["turn_events"][-1]
        assert last["type"] == "error" and last["data"]["recoverable"] is False
        assert not _alive(pid) and env.bridge_url is None  # torn down
        with pytest.raises(HarnessNotRunningError):
            await env.step_async(HarnessAction(message="hello"))

        # timeout_s of the step overrides the config's limit.
        await env.reset_async()
        observation = await env.step_async(HarnessAction(message="sleep 0.2"), timeout_s=20.0)
        assert observation.done is False and observation.metadata["response"] == "slept"
        observation = await env.step_async(HarnessAction(message="sleep 30"), timeout_s=0.5)
        assert observation.metadata["error_type"] == "turn_timeout"
    finally:
        await env.close_async()


async def test_a_harness_that_dies_mid_turn_ends_the_episode(tmp_path: Path, tools: Tools) -> None:
    env = HarnessEnvironment(line_adapter(tmp_path), mcp=tools.server)
    try:
        await env.reset_async()
        observation = await env.step_async(HarnessAction(message="die"))
        assert observation.done is True and observation.reward is None
        assert observation.metadata["error_type"] == "harness_crashed"
        assert "exit code 3" in observation.metadata["error"] and "told to die" in observation.metadata["error"]
        assert _event_types(observation) == ["text_output", "error"]  # what it said before dying is kept
        with pytest.raises(HarnessNotRunningError):
            await env.step_async(HarnessAction(message="hello"))
    finally:
        await env.close_async()


async def test_a_harness_killed_between_turns_is_reported_crashed(tmp_path: Path, tools: Tools) -> None:
    env = HarnessEnvironment(line_adapter(tmp_path), mcp=tools.server)
    try:
        await env.reset_async()
        process = env.adapter.process
        assert process is not None and process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        await process.wait(5.0)
        observation = await env.step_async(HarnessAction(message="hello"))
        assert observation.done is True and observation.metadata["error_type"] == "harness_crashed"
        assert observation.reward is None and "no longer running" in observation.metadata["error"]
    finally:
        await env.close_async()


async def test_a_step_before_reset_is_refused(tmp_path: Path, tools: Tools) -> None:
    env = HarnessEnvironment(line_adapter(tmp_path), mcp=tools.server)
    try:
        with pytest.raises(HarnessNotRunningError, match="reset"):
            await env.step_async(HarnessAction(message="hello"))
        with pytest.raises(HarnessNotRunningError):
            env.step(HarnessAction(message="hello"))
        assert env.adapter.process is None  # constructing and refusing started nothing
    finally:
        await env.close_async()


async def test_a_failed_start_tears_the_bridge_down(tmp_path: Path, tools: Tools) -> None:
    config = HarnessConfig(
        name="broken", command=[PYTHON, "-c", "import sys; sys.exit(2)"], working_directory=str(tmp_path)
    )
    env = HarnessEnvironment(JsonLinesHarnessAdapter(config), mcp=tools.server)
    try:
        with pytest.raises(HarnessError, match="exited with code 2"):
            await env.reset_async()
        assert env.bridge_url is None
        with pytest.raises(HarnessNotRunningError):
            await env.step_async(HarnessAction(message="hello"))
    finally:
        await env.close_async()


# --- the bridge ----------------------------------------------------------------------------------


async def test_the_bridge_serves_on_loopback_and_stops(tools: Tools) -> None:
    bridge = HarnessMCPBridge(tools.server)
    assert bridge.url is None
    url = bridge.start()
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp") and bridge.start() == url  # idempotent
        async with Client(url) as client:
            assert sorted(t.name for t in await client.list_tools()) == ["add", "read"]
            assert (await client.call_tool("add", {"a": 20, "b": 22})).data == 42
    finally:
        bridge.stop()
    bridge.stop()  # idempotent
    port = int(url.split(":")[2].split("/")[0])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert tools.calls == [("add", 20, 22)]


async def test_the_bridge_serves_on_a_unix_socket(tools: Tools, short_dir: Path) -> None:
    path = short_dir / "bridge.sock"
    with HarnessMCPBridge(tools.server, uds=path) as bridge:
        assert bridge.url == unix_socket_url(path) and split_unix_url(bridge.url) == (str(path), "/mcp")
        assert path.is_socket()
        with pytest.raises(HarnessError, match="already exists"):
            HarnessMCPBridge(tools.server, uds=path).start()
    assert not path.exists()
    assert split_unix_url("http://127.0.0.1:9/mcp") is None


@needs_bwrap
async def test_a_sandboxed_harness_reaches_the_bridge_on_a_unix_socket(
    tmp_path: Path, tools: Tools, short_dir: Path
) -> None:
    sandbox = HarnessSandbox(workspace=tmp_path, ro_paths=[(str(AGENT), AGENT_INSIDE)])
    env = HarnessEnvironment(line_adapter(tmp_path, sandbox=sandbox), mcp=tools.server, bridge_uds=short_dir / "b.sock")
    try:
        reset = await env.reset_async()
        assert reset.metadata["injected_tools"] == ["env_read", "add"]
        assert env.bridge_url is not None and env.bridge_url.startswith("http+unix://")
        observation = await env.step_async(HarnessAction(message='call add {"a": 5, "b": 6}'))
        assert json.loads(observation.metadata["response"]) == 11
        observation = await env.step_async(HarnessAction(message='call env_read {"path": "in/sandbox"}'))
        assert json.loads(observation.metadata["response"]) == "contents of in/sandbox"
        assert tools.calls == [("add", 5, 6), ("read", "in/sandbox")]  # the host's tools, from inside
    finally:
        await env.close_async()
    assert not (short_dir / "b.sock").exists()


@needs_bwrap
async def test_a_sandboxed_harness_cannot_use_a_loopback_bridge(tmp_path: Path, tools: Tools) -> None:
    sandbox = HarnessSandbox(workspace=tmp_path, ro_paths=[(str(AGENT), AGENT_INSIDE)])
    env = HarnessEnvironment(line_adapter(tmp_path, sandbox=sandbox), mcp=tools.server)
    try:
        with pytest.raises(HarnessError, match="bridge_uds"):
            await env.reset_async()
        assert env.bridge_url is None
    finally:
        await env.close_async()


async def test_build_bridge_server_renames_through_a_mounted_view(tools: Tools) -> None:
    assert await build_bridge_server(tools.server, {}) is tools.server
    assert await build_bridge_server(tools.server, {"add": "add"}) is tools.server  # renames nothing
    view = await build_bridge_server(tools.server, {"env_read": "read"})
    assert view is not tools.server
    async with Client(view) as client:
        assert sorted(t.name for t in await client.list_tools()) == ["add", "env_read"]
        assert (await client.call_tool("env_read", {"path": "x"})).data == "contents of x"
    assert tools.calls == [("read", "x")]  # the view forwards to the environment's own tool
    with pytest.raises(HarnessError, match="does not have: missing"):
        await build_bridge_server(tools.server, {"env_missing": "missing"})
    with pytest.raises(HarnessError, match="shadow"):
        await build_bridge_server(tools.server, {"add": "read"})


# --- events and the protocol ---------------------------------------------------------------------


async def test_events_to_metadata_and_the_drained_response() -> None:
    events = [
        HarnessEvent(type=HarnessEventType.TOOL_CALL, timestamp=1.5, data={"tool_name": "add", "arguments": {"a": 1}}),
        HarnessEvent(type="turn_complete", data={"response": 42, "done": 1}),
    ]
    dumped = events_to_metadata(events)
    assert dumped[0] == {"type": "tool_call", "timestamp": 1.5, "data": {"tool_name": "add", "arguments": {"a": 1}}}
    assert dumped[1]["type"] == "turn_complete" and isinstance(dumped[1]["timestamp"], float)
    assert json.loads(json.dumps(dumped)) == dumped
    response = response_from_events(events)
    assert response.response == "42" and response.done is True and response.events == events
    with pytest.raises(HarnessError, match="without any event"):
        response_from_events([])
    with pytest.raises(HarnessError, match="'tool_call'"):
        response_from_events(events[:1])


def test_protocol_errors_say_what_is_wrong_without_echoing_the_input() -> None:
    assert parse_client_message('{"type": "message", "content": "hi"}') == HarnessClientMessage(
        type="message", content="hi"
    )
    bad_json = parse_client_message("{not json SECRET-1")
    assert isinstance(bad_json, HarnessProtocolError) and bad_json.data["code"] == "INVALID_JSON"
    assert bad_json.data["message"].startswith("Invalid JSON: ") and "SECRET-1" not in bad_json.data["message"]
    wrong = parse_client_message('{"type": "SECRET-2", "content": ["SECRET-3"]}')
    assert isinstance(wrong, HarnessProtocolError) and wrong.type == "protocol_error"
    assert wrong.data["code"] == "VALIDATION_ERROR"
    message = wrong.data["message"]
    assert "type must be 'message'" in message and "content must be a string" in message
    for leak in ("SECRET", "pydantic", "https://", "input_value", "literal_error"):
        assert leak not in message
    missing = parse_client_message("[1, 2]")
    assert isinstance(missing, HarnessProtocolError) and "must be a JSON object" in missing.data["message"]
    assert isinstance(parse_client_message(b"\xff\xfe"), HarnessProtocolError)


def test_config_is_strict() -> None:
    config = HarnessConfig(name="x", command=["agent"])
    assert config.transport is HarnessTransport.STDIO and config.working_directory == "/workspace"
    assert (config.startup_timeout_s, config.session_timeout_s) == (30.0, 600.0)
    assert HarnessTransport("http") is HarnessTransport.STREAMABLE_HTTP
    for bad in (
        {"command": []},
        {"command": [""]},
        {"command": ["a"], "typo": 1},
        {"command": ["a"], "session_timeout_s": 0},
    ):
        with pytest.raises(ValueError):
            HarnessConfig(name="x", **bad)
    with pytest.raises(ValueError, match="stdio"):
        JsonLinesHarnessAdapter(HarnessConfig(name="x", command=["a"], transport="http"))


# --- Claude Code, one CLI run per turn -----------------------------------------------------------

HARNESS_ROOT = agents.harness_dir(ROOT / ".harnesses")
CLAUDE = agents.installed("claude-code", HARNESS_ROOT)
needs_claude = pytest.mark.skipif(
    CLAUDE is None, reason=f"Claude Code is not installed in {HARNESS_ROOT} (bash scripts/install-harnesses.sh npm)"
)


class ScriptedModel:
    """An Anthropic Messages endpoint with known answers: a new prompt ``add A B`` is answered with a
    call of the environment's ``add`` (as Claude Code names it), a tool result with a text quoting it,
    anything else with an echo. Replies stream as the capture proxy's Anthropic dialect streams them."""

    def __init__(self) -> None:
        self.requests: List[Dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/v1/messages", self.messages, methods=["POST"])])

    async def messages(self, request: Request) -> StreamingResponse:
        from openenv.core.harness.capture.dialects import APIType, dialect_for

        body = await request.json()
        self.requests.append(body)
        content = body["messages"][-1]["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        last = blocks[-1]
        tool_names = [tool["name"] for tool in body.get("tools") or []]
        if last.get("type") == "tool_result":
            result = last.get("content")
            text = result if isinstance(result, str) else " ".join(b.get("text", "") for b in result or [])
            answer, stop = [{"type": "text", "text": f"the tool said {text}"}], "end_turn"
        elif last.get("text", "").startswith("add ") and "mcp__env__add" in tool_names:
            a, b = (int(n) for n in last["text"].split()[1:3])
            answer = [
                {
                    "type": "tool_use",
                    "id": f"toolu_{len(self.requests)}",
                    "name": "mcp__env__add",
                    "input": {"a": a, "b": b},
                }
            ]
            stop = "tool_use"
        else:
            answer, stop = [{"type": "text", "text": f"echo {last.get('text', '')}"}], "end_turn"
        reply = {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "content": answer,
            "model": body.get("model"),
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
        return StreamingResponse(dialect_for(APIType.ANTHROPIC).sse(reply), media_type="text/event-stream")


def _user_texts(body: Dict[str, Any]) -> List[str]:
    texts = []
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            texts.append(content)
        else:
            texts += [b["text"] for b in content if b.get("type") == "text" and message["role"] == "user"]
    return texts


async def _claude_turns(env: HarnessEnvironment, model: ScriptedModel, tools: Tools) -> None:
    reset = await env.reset_async()
    assert reset.metadata["injected_tools"] == ["read", "add"]  # no built-ins given: nothing renamed
    first = await env.step_async(HarnessAction(message="add 2 3"), timeout_s=90.0)
    assert first.done is False, first.metadata
    assert first.metadata["response"] == 'the tool said {"result":5}'
    calls = [e["data"] for e in first.metadata["turn_events"] if e["type"] == "tool_call"]
    assert calls == [
        {
            "tool_name": "add",
            "harness_tool_name": "mcp__env__add",
            "arguments": {"a": 2, "b": 3},
            "tool_call_id": "toolu_1",
        }
    ]
    results = [e["data"] for e in first.metadata["turn_events"] if e["type"] == "tool_result"]
    assert len(results) == 1 and results[0]["is_error"] is False and "5" in json.dumps(results[0]["result"])
    assert tools.calls == [("add", 2, 3)]  # Claude Code's MCP client reached the environment's tool

    second = await env.step_async(HarnessAction(message="-what was it?"), timeout_s=90.0)
    assert second.metadata.get("response") == "echo -what was it?", second.metadata
    # The second run resumed the first's session: its request carries the first turn.
    assert _user_texts(model.requests[-1])[:1] == ["add 2 3"] and env.state.step_count == 2


@needs_claude
async def test_claude_code_runs_a_turn_per_step_with_the_bridged_tools(tmp_path: Path, tools: Tools) -> None:
    model = ScriptedModel()
    with BackgroundServer(model.app) as server:
        config = HarnessConfig(
            name="claude-code",
            command=[str(CLAUDE)],
            working_directory=str(tmp_path),
            model="tiny",
            env_vars={"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "test-key"},
        )
        adapter = ClaudeCodeHarnessAdapter(config)
        env = HarnessEnvironment(adapter, mcp=tools.server)
        try:
            await _claude_turns(env, model, tools)
            home = adapter.home
            assert home is not None and os.path.isdir(os.path.join(home, ".claude"))
        finally:
            await env.close_async()
        assert not os.path.exists(home)


@needs_claude
@needs_bwrap
async def test_claude_code_in_the_sandbox_reaches_its_model_and_the_bridge_over_unix_sockets(
    tmp_path: Path, tools: Tools, short_dir: Path
) -> None:
    model = ScriptedModel()
    with BackgroundServer(model.app, uds=str(short_dir / "model.sock")):
        sandbox = HarnessSandbox(
            workspace=tmp_path,
            services={"model": short_dir / "model.sock"},
            ro_paths=agents.HARNESSES["claude-code"].install_paths(HARNESS_ROOT),
        )
        config = HarnessConfig(
            name="claude-code",
            command=[str(CLAUDE)],
            model="tiny",
            env_vars={"ANTHROPIC_BASE_URL": sandbox.url("model"), "ANTHROPIC_API_KEY": "test-key"},
        )
        env = HarnessEnvironment(
            ClaudeCodeHarnessAdapter(config, sandbox=sandbox), mcp=tools.server, bridge_uds=short_dir / "b.sock"
        )
        try:
            await _claude_turns(env, model, tools)
        finally:
            await env.close_async()


@needs_claude
async def test_claude_code_killed_by_the_turn_timeout(tmp_path: Path, tools: Tools) -> None:
    # A model that never answers: the turn runs into its limit and the CLI is stopped.
    released = threading.Event()

    async def hang(request: Request) -> StreamingResponse:
        while not released.is_set():  # (until the test is over: the server then stops at once)
            await asyncio.sleep(0.05)
        raise AssertionError("unreachable")

    with BackgroundServer(Starlette(routes=[Route("/v1/messages", hang, methods=["POST"])])) as server:
        config = HarnessConfig(
            name="claude-code",
            command=[str(CLAUDE)],
            working_directory=str(tmp_path),
            model="tiny",
            env_vars={"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "test-key"},
        )
        adapter = ClaudeCodeHarnessAdapter(config, terminate_grace_s=0.5)
        env = HarnessEnvironment(adapter, mcp=tools.server)
        try:
            await env.reset_async()
            observation = await env.step_async(HarnessAction(message="hello"), timeout_s=3.0)
            assert observation.done is True and observation.metadata["error_type"] == "turn_timeout"
            assert adapter.process is None and adapter.home is None  # the CLI stopped, its home removed
        finally:
            released.set()
            await env.close_async()
