"""White-box and black-box rollouts over catalogue environments (issue 39, point 3).

Two environments of ``envs/``, each served by its real server on 127.0.0.1 and driven through
:class:`StepEnvSessionAdapter`:

* ``shell_env``, a tool environment: its own MCP tool ``run_command`` (``{"command": ...}``), run in
  the environment's bubblewrap sandbox;
* ``grid_world_env``, a game: a tool ``move`` whose ``command`` is the move (UP, DOWN, LEFT, RIGHT;
  any other string is the environment's own "unknown action" step, which costs its step reward).

The model is the tiny real engine (:mod:`openenv.testing.tiny_engine`), trained to call the tool
under the name its caller shows the model: the environment's name in the white box, Claude Code's
``mcp__env__<tool>`` in the black box.

* White box: :class:`MCPHarnessAdapter` with a trainer's :class:`ModelStep` that asks the engine's
  HTTP API for each turn and hands back its own prompt ids, sampled ids and logprobs.
* Black box: :class:`CLIHarnessAdapter` with :class:`AgentCLIRunner`: the real Claude Code CLI,
  unchanged, in :class:`HarnessSandbox`, whose MCP server is the session (over a Unix socket) and
  whose model is the capture proxy (a Unix socket) in front of the engine.

The tiny model is weak, so nothing here needs it to solve a task: what is checked is what must
hold whatever it does. The agent ran (in its sandbox) and its model calls were captured with the
engine's token ids; every tool call it made reached the environment's session, in order, and is
in the tool trace; ``verify()`` forwards the environment's reward (``None`` when nothing was
scored), and the environment's own state agrees. A black-box agent that hangs is stopped at the
runner's limit and the rollout is recorded as not done.

Skips, saying why, without bubblewrap, node, the Claude Code install (``bash
scripts/install-harnesses.sh npm``; ``$OPENENV_HARNESS_DIR``), torch or transformers.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

pytest.importorskip("torch", reason="the tiny engine needs torch")
pytest.importorskip("transformers", reason="the tiny engine needs transformers")
pytest.importorskip("shell_env", reason="shell_env is not installed (pip install -e envs/shell_env)")
pytest.importorskip("grid_world_env", reason="grid_world_env is not installed (pip install -e envs/grid_world_env)")

from grid_world_env import GridWorldAction, GridWorldEnv
from shell_env import ShellEnv
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.mcp_types import CallToolAction, Tool
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.harness import (
    CLIHarnessAdapter,
    HarnessRolloutResult,
    HarnessRunLimits,
    MCPHarnessAdapter,
    ModelStepResult,
    SessionMCPBridge,
    StepEnvSessionAdapter,
    _resolve_env_reward,
    agents,
)
from openenv.core.harness.capture import CaptureServer
from openenv.core.harness.cli_runner import AgentCLIRunner, ToolCallLog, mcp_tool_name, session_mcp_server
from openenv.core.llm_client import LLMResponse, ToolCall

ROOT = Path(__file__).resolve().parents[2]
HARNESS = "claude-code"
HARNESS_ROOT = agents.harness_dir(ROOT / ".harnesses")
NODE = shutil.which("node")

needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)
needs_agent = pytest.mark.skipif(
    agents.installed(HARNESS, HARNESS_ROOT) is None,
    reason=f"{HARNESS} is not installed in {HARNESS_ROOT}: run `{agents.HARNESSES[HARNESS].install_command}`",
)


# --- the environments --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shell_url() -> Iterator[str]:
    if find_bwrap() is None:
        pytest.skip("shell_env runs commands in bubblewrap, which is not installed")
    from shell_env.server.app import app

    with BackgroundServer(app) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def grid_url() -> Iterator[str]:
    from grid_world_env.server.app import app

    with BackgroundServer(app) as server:
        yield server.base_url


def shell_session(url: str, seed: int) -> StepEnvSessionAdapter:
    with ShellEnv(base_url=url).sync() as lister:
        tools = [t for t in lister.list_tools() if t.name == "run_command"]
    return StepEnvSessionAdapter(
        ShellEnv(base_url=url),
        seed=seed,
        tool_specs=tools,
        action_builder=lambda name, args: CallToolAction(tool_name=name, arguments=args),
        initial_messages_builder=lambda reset, task: [{"role": "user", "content": reset.observation.instruction}],
    )


MOVE = Tool(
    name="move",
    description="Move one cell on the grid.",
    input_schema={
        "type": "object",
        "properties": {"command": {"type": "string", "description": "UP, DOWN, LEFT or RIGHT"}},
        "required": ["command"],
    },
)


def grid_session(url: str, seed: int) -> StepEnvSessionAdapter:
    def opening(reset: Any, task: Any) -> List[Dict[str, Any]]:
        observation = reset.observation
        return [{"role": "user", "content": f"{observation.message}\n{observation.text}\nCall move to walk."}]

    return StepEnvSessionAdapter(
        GridWorldEnv(base_url=url),
        seed=seed,
        tool_specs=[MOVE],
        action_builder=lambda name, args: GridWorldAction(action=str(args.get("command", ""))),
        initial_messages_builder=opening,
        reset_kwargs={"size": 4},
    )


@dataclass(frozen=True)
class Catalogue:
    """A catalogue environment as the tests use it: its tool, its server, how to open a session."""

    name: str
    tool: str
    url_fixture: str
    open: Callable[[str, int], StepEnvSessionAdapter]


ENVS = [
    pytest.param(Catalogue("shell_env", "run_command", "shell_url", shell_session), id="shell_env"),
    pytest.param(Catalogue("grid_world_env", "move", "grid_url", grid_session), id="grid_world_env"),
]


def env_steps(verdict: Any) -> int:
    """How many steps the environment itself counted (its state, as ``verify`` reports it)."""
    return int(verdict.artifacts["env_state"]["step_count"])


# --- the engines, one per tool name ----------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[Callable[[str], Any]]:
    """``engine(tool_name)``: the tiny engine trained to call ``tool_name``, served (built once, cached)."""
    from openenv.testing.tiny_engine import TinyEngine

    servers: Dict[str, Any] = {}
    contexts: List[Any] = []

    def get(tool_name: str) -> Any:
        if tool_name not in servers:
            context = TinyEngine.build(tool_name=tool_name).serve()
            servers[tool_name] = context.__enter__()
            contexts.append(context)
        return servers[tool_name]

    try:
        yield get
    finally:
        for context in reversed(contexts):
            context.__exit__(None, None, None)


class EngineStep:
    """The trainer's model step: one chat-completions call to the engine per turn, returning the
    engine's own prompt ids, sampled ids and logprobs (vLLM's ``return_token_ids``, ``logprobs``)."""

    def __init__(self, server: Any) -> None:
        import httpx

        self.http = httpx.Client(base_url=server.base_url, timeout=120)
        self.model = server.model

    def __call__(self, messages: List[Dict[str, Any]], tools: List[Tool], sampling: Dict[str, Any]) -> ModelStepResult:
        functions = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in tools
        ]
        body = {
            "model": self.model,
            "messages": messages,
            "tools": functions,
            "logprobs": True,
            "return_token_ids": True,
        }
        answer = self.http.post("/chat/completions", json={**body, **sampling})
        answer.raise_for_status()
        data = answer.json()
        choice = data["choices"][0]
        message = choice["message"]
        calls = [
            ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
            for c in message.get("tool_calls") or []
        ]
        return ModelStepResult(
            LLMResponse(message.get("content"), calls),
            prompt_ids=data["prompt_token_ids"],
            completion_ids=choice["token_ids"],
            logprobs=[t["logprob"] for t in choice["logprobs"]["content"]],
        )


def check_reward_is_the_environments(rollout: HarnessRolloutResult, verdict: Any) -> Optional[float]:
    """``verify`` forwards the reward of the environment's last step (None before any); the rollout's
    reward resolves to it; the environment counted exactly the calls in the tool trace."""
    assert env_steps(verdict) == len(rollout.tool_trace)
    if not rollout.tool_trace:
        assert verdict.env_reward is None  # unscored, not 0
        with pytest.raises(ValueError, match="did not produce an environment reward"):
            _resolve_env_reward(rollout, verdict)
        return None
    last = rollout.tool_trace[-1].result
    assert verdict.env_reward == last.metadata["reward"] == last.data["reward"]
    assert _resolve_env_reward(rollout, verdict) == verdict.env_reward
    return verdict.env_reward


# --- white box: the trainer's model step -----------------------------------------------------------


@pytest.mark.parametrize("env", ENVS)
def test_white_box_over_a_catalogue_environment(env: Catalogue, engine: Any, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(env.url_fixture)
    limits = HarnessRunLimits(max_turns=3, sampling={"temperature": 0.0, "max_tokens": 48})
    started = time.monotonic()
    with env.open(url, 0) as session:
        rollout = MCPHarnessAdapter().run_white_box(EngineStep(engine(env.tool)), session, limits)
        verdict = session.verify(rollout.messages)
    elapsed = time.monotonic() - started
    # every turn's tokens are the engine's: ids, one logprob per sampled id; a valid training trace
    assert 1 <= len(rollout.steps) == rollout.metrics["turns"] <= 3
    for step in rollout.steps:
        assert step.prompt_ids and len(step.logprobs) == len(step.completion_ids) > 0
        assert all(lp <= 0 for lp in step.logprobs)
    assert len(rollout.training_trace().turns) == len(rollout.steps)
    # greedy, the engine calls the tool it was trained on when it is declared; each call reached the env
    assert rollout.tool_trace and {e.tool_name for e in rollout.tool_trace} == {env.tool}
    calls = [(c.name, c.args) for s in rollout.steps for c in s.response.tool_calls]
    assert [(e.tool_name, e.arguments) for e in rollout.tool_trace] == calls
    reward = check_reward_is_the_environments(rollout, verdict)
    if env.name == "grid_world_env":  # every move (a word it does not know, too) costs the step reward
        assert reward == -0.1 and verdict.artifacts["env_state"]["total_reward"] == pytest.approx(-0.1 * len(calls))
    print(
        f"\n[white box, {env.name}] turns={len(rollout.steps)} tool_calls={len(rollout.tool_trace)} "
        f"reward={reward} done={rollout.done} stop={rollout.metrics['stop_reason']} time={elapsed:.1f}s"
    )


# --- black box: a real agent CLI in the sandbox ----------------------------------------------------


@pytest.fixture(scope="module")
def proxy(engine: Any) -> Iterator[CaptureServer]:
    """The capture proxy on a Unix socket; each session names its engine (``llm_url``)."""
    path = Path(f"/tmp/oe-cat-{uuid.uuid4().hex[:8]}")  # short: Unix socket paths stay under 108 bytes
    path.mkdir(mode=0o700)
    default = engine(mcp_tool_name(HARNESS, "run_command"))
    server = CaptureServer(
        llm_url=default.base_url,
        model=default.model,
        uds=str(path / "proxy.sock"),
        journal_dir=str(path / "journal"),
        max_output_tokens=96,  # the tiny model's answers are short; a bound keeps each call quick on CPU
    )
    with server:
        yield server
    shutil.rmtree(path, ignore_errors=True)


def runner_for(proxy: CaptureServer, engine_server: Any, **kwargs: Any) -> AgentCLIRunner:
    kwargs.setdefault("timeout_s", 150.0)
    return AgentCLIRunner(
        HARNESS,
        proxy=proxy,
        install_root=HARNESS_ROOT,
        session_fields={"llm_url": engine_server.base_url, "model": engine_server.model},
        node=NODE,
        **kwargs,
    )


@needs_bwrap
@needs_agent
@pytest.mark.parametrize("env", ENVS)
def test_black_box_real_agent_over_a_catalogue_environment(
    env: Catalogue, engine: Any, proxy: CaptureServer, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(env.url_fixture)
    seen_name = mcp_tool_name(HARNESS, env.tool)  # what the agent's model is shown, and was trained to call
    adapter = CLIHarnessAdapter(runner_for(proxy, engine(seen_name)))
    # A near-greedy policy (the capture session's pinned sampling, whatever the agent asks for): the
    # tiny model then mostly calls its tool, so the tool path is exercised; it is not asserted on.
    limits = HarnessRunLimits(max_turns=3, sampling={"temperature": 0.01})
    with env.open(url, 0) as session:
        rollout = adapter.run_black_box(session, limits)
        verdict = session.verify(rollout.messages)
    metrics = rollout.metrics
    exit_event = rollout.events[-1]
    print(
        f"\n[black box, {env.name}, {HARNESS}] exit={metrics['exit_code']} stop={metrics['stop_reason']} "
        f"turns={metrics['turns']} tool_calls={metrics['tool_calls']} reward={verdict.env_reward} "
        f"done={rollout.done} time={metrics['elapsed_s']}s\nstderr: {exit_event.payload['stderr'][-800:]}"
    )
    # the agent ran to its own end, within its budget of model calls
    assert exit_event.type == "agent_exit" and not metrics["timed_out"], exit_event.payload
    assert metrics["exit_code"] == 0 and rollout.done
    capture = proxy.rollout(metrics["capture_session_id"])
    assert capture["metadata"]["api_type"] == "anthropic"  # Claude Code's own dialect, through the proxy
    assert 1 <= len(rollout.steps) == metrics["turns"] <= limits.max_turns
    # each model call captured with the engine's tokens; the agent's model was shown the env's tool
    for step in rollout.steps:
        assert step.prompt_ids and len(step.logprobs) == len(step.completion_ids) > 0
    trace = proxy.training_trace(metrics["capture_session_id"])
    first = trace.turns[0].request
    assert [t["function"]["name"] for t in first["tools"]] == [seen_name]
    # It ran in the sandbox: its working directory is the sandbox's /workspace (the host's is under /tmp).
    assert re.search(r"\bCWD: /workspace\s", first["messages"][0]["content"]), first["messages"][0]
    # max_turns is the capture session's budget: a model call past it got the proxy's final answer
    if len(rollout.steps) == limits.max_turns and rollout.steps[-1].response.tool_calls:
        assert capture["budget_stop_count"] >= 1, capture
    # every tool call its model made reached the environment's session, in order, and is in the trace
    calls = [(c.name, c.args) for s in rollout.steps for c in s.response.tool_calls]
    assert [(seen_name, e.arguments) for e in rollout.tool_trace] == [c for c in calls if c[0] == seen_name]
    assert all(e.tool_name == env.tool for e in rollout.tool_trace)
    assert [e.type for e in rollout.events[:-1]] == ["tool_call"] * len(rollout.tool_trace)
    check_reward_is_the_environments(rollout, verdict)


@needs_bwrap
@needs_agent
def test_black_box_agent_that_hangs_is_stopped_at_the_limit(engine: Any, proxy: CaptureServer, grid_url: str) -> None:
    """A session that never finishes: the agent's model never answers, so the agent waits forever.
    The runner stops it at ``timeout_s``; the rollout is recorded, not done and unscored."""
    released = threading.Event()
    asked: List[Dict[str, Any]] = []

    async def never(request: Request) -> JSONResponse:
        asked.append(await request.json())
        while not released.is_set():
            await asyncio.sleep(0.05)
        return JSONResponse({"error": {"message": "released"}}, status_code=503)

    app = Starlette(routes=[Route("/v1/chat/completions", never, methods=["POST"])])
    limit = 8.0
    with BackgroundServer(app) as hanging:
        runner = AgentCLIRunner(
            HARNESS,
            proxy=proxy,
            install_root=HARNESS_ROOT,
            session_fields={"llm_url": hanging.base_url + "/v1", "model": "hang"},
            node=NODE,
            timeout_s=limit,
            terminate_grace_s=1.0,
        )
        try:
            started = time.monotonic()
            with grid_session(grid_url, 0) as session:
                rollout = CLIHarnessAdapter(runner).run_black_box(session, HarnessRunLimits(max_turns=3))
                verdict = session.verify(rollout.messages)
            elapsed = time.monotonic() - started
        finally:
            released.set()
    print(f"\n[black box, hang] stop={rollout.metrics['stop_reason']} time={elapsed:.1f}s limit={limit}s")
    assert asked, "the agent never reached its model: it did not run"
    assert rollout.metrics["timed_out"] and rollout.metrics["stop_reason"] == "timeout"
    assert rollout.metrics["exit_code"] is None and not rollout.done
    assert limit <= elapsed < limit + 20.0, elapsed  # stopped at the limit (plus start-up and the stop)
    assert rollout.steps == [] and rollout.tool_trace == []
    assert verdict.env_reward is None and env_steps(verdict) == 0


# --- the session's tools over MCP ------------------------------------------------------------------


async def test_the_sessions_tools_over_mcp_reach_the_environment(grid_url: str) -> None:
    """What the black-box agent's MCP client sees: the session's tools with their schemas; a call
    runs one environment step and answers its result; an error the env reports is an MCP error
    result (``isError``), not a failed request; reserved and unknown tools never reach the env."""
    from fastmcp import Client

    with grid_session(grid_url, 0) as session:
        server = session_mcp_server(SessionMCPBridge(session))
        async with Client(server) as client:
            tools = await client.list_tools()
            assert [(t.name, getattr(t, "input_schema", None) or t.inputSchema) for t in tools] == [
                ("move", MOVE.input_schema)
            ]
            moved = await client.call_tool("move", {"command": "RIGHT"}, raise_on_error=False)
            refused = await client.call_tool("move", {"command": "ls"}, raise_on_error=False)
            for name in ("reset", "step", "nope"):
                answer = await client.call_tool(name, {}, raise_on_error=False)
                assert answer.is_error, name
        assert not moved.is_error and json.loads(moved.content[0].text)["observation"]["y"] in (0, 1)
        assert refused.is_error and "unknown action 'ls'" in refused.content[0].text
        verdict = session.verify([])
    assert env_steps(verdict) == 2 and verdict.env_reward == -0.1


def open_grid(url: str) -> StepEnvSessionAdapter:
    """A 2x2 grid without walls or pits: RIGHT then DOWN reaches the goal (reward 1.0, episode over)."""
    return StepEnvSessionAdapter(
        GridWorldEnv(base_url=url),
        seed=0,
        tool_specs=[MOVE],
        action_builder=lambda name, args: GridWorldAction(action=str(args.get("command", ""))),
        initial_messages_builder=lambda reset, task: [{"role": "user", "content": reset.observation.message}],
        reset_kwargs={"size": 2, "num_walls": 0, "num_pits": 0},
    )


async def test_black_box_calls_after_the_episode_or_past_the_limit_are_not_run(grid_url: str) -> None:
    """Upstream's white-box rules, held for an agent that owns its loop: after the call that ended the
    episode nothing more reaches the environment (its reward stays the final one), and calls past
    ``max_total_tool_calls`` are answered without running."""
    from fastmcp import Client

    async def moves(session: StepEnvSessionAdapter, log: ToolCallLog, commands: List[str]) -> List[Any]:
        server = session_mcp_server(SessionMCPBridge(session), call_tool=log)
        async with Client(server) as client:
            return [await client.call_tool("move", {"command": c}, raise_on_error=False) for c in commands]

    with open_grid(grid_url) as session:
        log = ToolCallLog(SessionMCPBridge(session), HarnessRunLimits())
        answers = await moves(session, log, ["RIGHT", "DOWN", "LEFT"])
        verdict = session.verify([])
    assert [a.is_error for a in answers] == [False, False, True]
    assert "episode ended" in answers[2].content[0].text
    assert [e.arguments["command"] for e in log.trace] == ["RIGHT", "DOWN"] and log.trace[-1].result.done
    assert env_steps(verdict) == 2 and verdict.env_reward == 1.0 and verdict.done
    rollout = HarnessRolloutResult(tool_trace=log.trace)
    assert _resolve_env_reward(rollout, verdict) == 1.0
    assert [e.type for e in log.events] == ["tool_call", "tool_call", "tool_call_skipped"]

    with open_grid(grid_url) as session:
        log = ToolCallLog(SessionMCPBridge(session), HarnessRunLimits(max_total_tool_calls=1))
        answers = await moves(session, log, ["RIGHT", "DOWN"])
        verdict = session.verify([])
    assert [a.is_error for a in answers] == [False, True] and "max_total_tool_calls" in answers[1].content[0].text
    assert log.metrics == {"truncated": True, "skipped_tool_calls": 1}
    assert env_steps(verdict) == 1 and verdict.env_reward == -0.1 and not verdict.done
