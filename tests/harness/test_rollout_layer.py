"""Upstream 0.10's whole-rollout layer (``openenv.core.harness.rollout``) against real environments.

Every environment here is a catalogue package served by a real server on 127.0.0.1: ``echo_env``
(MCP tools), ``openspiel_env`` (blackjack, a reset/step game) and ``shell_env`` (MCP tools that run
commands in a sandbox). Two kinds of model step drive the white-box harness:

* ``Scripted`` replays a fixed list of replies (with made-up token ids): the tests of the harness's
  bookkeeping (limits, answered calls, copies, the rollout function's shape, concurrency,
  failures, a hung tool) use it, so that each reply is known in advance;
* ``EngineStep`` calls the tiny engine (``openenv.testing.tiny_engine``: a real model, trained to
  call ``run_command``) over its vLLM-compatible HTTP endpoint and hands back the engine's own
  prompt ids, sampled ids and logprobs: the ``test_tiny_engine_*`` tests, over ``shell_env``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

pytest.importorskip("echo_env", reason="echo_env is not installed (pip install -e envs/echo_env)")
pytest.importorskip("openspiel_env", reason="openspiel_env is not installed (pip install -e envs/openspiel_env)")

from echo_env import EchoEnv
from echo_env.server.app import app as echo_app
from openspiel_env import OpenSpielAction, OpenSpielEnv, OpenSpielObservation
from openspiel_env.models import OpenSpielState
from openspiel_env.server.openspiel_environment import OpenSpielEnvironment

from openenv.core.client_errors import CapacityReachedError
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, Tool
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.generic_client import GenericEnvClient
from openenv.core.harness import (
    RESERVED_TOOL_NAMES,
    CLIHarnessAdapter,
    HarnessAdapter,
    HarnessRolloutResult,
    HarnessRunLimits,
    LoopOwningSession,
    MCPHarnessAdapter,
    ModelStep,
    ModelStepResult,
    ResourceSession,
    ResourceSessionFactory,
    SessionMCPBridge,
    StepEnvSessionAdapter,
    ToolResult,
    ToolTraceEntry,
    TrainableSession,
    TrainingTrace,
    VerifyResult,
    _resolve_env_reward,
    build_harness_rollout_func,
    resolve_tool_conflicts,
)
from openenv.core.llm_client import LLMResponse, ToolCall
from openenv.testing.faults import FaultProxy

# --- environments ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with BackgroundServer(echo_app) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def echo_server() -> Iterator[BackgroundServer]:
    """A second echo server, for the tests that put a fault proxy in front of it."""
    with BackgroundServer(echo_app) as server:
        yield server


@pytest.fixture(scope="module")
def echo_tools(echo_url: str) -> List[Tool]:
    """The echo environment's tools, as its server lists them."""
    with EchoEnv(base_url=echo_url).sync() as client:
        return list(client.list_tools())


@pytest.fixture(scope="module")
def spiel_url() -> Iterator[str]:
    # one session at a time: the test of a failed constructor shows the client was closed by
    # opening the next session
    app = create_app(
        OpenSpielEnvironment,
        OpenSpielAction,
        OpenSpielObservation,
        env_name="openspiel_env",
        max_concurrent_envs=1,
        state_cls=OpenSpielState,
    )
    with BackgroundServer(app) as server:
        yield server.base_url


def call_tool_action(name: str, arguments: Dict[str, Any]) -> CallToolAction:
    return CallToolAction(tool_name=name, arguments=arguments)


def echo_session(url: str, tools: Sequence[Tool], task: Any = "Say hello.", **kwargs: Any) -> StepEnvSessionAdapter:
    def opening(reset: Any, task: Any) -> List[Dict[str, Any]]:
        if isinstance(task, list):  # a chat prompt, as TRL hands it over
            return [dict(m) for m in task]
        return [
            {"role": "system", "content": reset.observation.echoed_message},
            {"role": "user", "content": task},
        ]

    kwargs.setdefault("action_builder", call_tool_action)
    return StepEnvSessionAdapter(
        EchoEnv(base_url=url), task=task, tool_specs=tools, initial_messages_builder=opening, **kwargs
    )


PLAY = Tool(
    name="play",
    description="Play one of the legal actions, by its id.",
    input_schema={"type": "object", "properties": {"action_id": {"type": "integer"}}, "required": ["action_id"]},
)
HIT, STAND = 0, 1


def spiel_session(url: str, seed: int = 3, **kwargs: Any) -> StepEnvSessionAdapter:
    kwargs.setdefault("reset_kwargs", {"game_name": "blackjack"})
    return StepEnvSessionAdapter(
        OpenSpielEnv(base_url=url),
        seed=seed,
        tool_specs=[PLAY],
        action_builder=lambda name, args: OpenSpielAction(action_id=int(args["action_id"])),
        initial_messages_builder=lambda reset, task: [{"role": "user", "content": reset.observation.text}],
        **kwargs,
    )


# --- model steps -------------------------------------------------------------------------------------


def reply(content: Optional[str] = None, *calls: Tuple[str, Dict[str, Any]]) -> LLMResponse:
    return LLMResponse(content, [ToolCall(f"call_{i}_{name}", name, args) for i, (name, args) in enumerate(calls)])


class Scripted:
    """A ModelStep replaying fixed replies. Turn ``t`` reports prompt ids ``[t, t, t]``, completion
    ids ``[100 + t]`` and logprob ``-0.5``, so each turn's tokens are recognisable. It keeps the
    conversations it was shown, and may mutate them (``vandal``) to show that is harmless."""

    def __init__(self, replies: Sequence[LLMResponse], vandal: bool = False, hook: Optional[Callable] = None) -> None:
        self.replies = list(replies)
        self.seen: List[List[Dict[str, Any]]] = []
        self.vandal = vandal
        self.hook = hook

    def __call__(self, messages: List[Dict[str, Any]], tools: List[Tool], sampling: Dict[str, Any]) -> ModelStepResult:
        turn = len(self.seen)
        self.seen.append(json.loads(json.dumps(messages)))
        if self.hook is not None:
            self.hook(turn, messages, tools, sampling)
        if self.vandal:
            messages[0]["content"] = "overwritten by the model step"
            messages.append({"role": "user", "content": "smuggled in"})
            tools.clear()
            sampling["temperature"] = 99
        response = self.replies[min(turn, len(self.replies) - 1)]
        return ModelStepResult(response, prompt_ids=[turn] * 3, completion_ids=[100 + turn], logprobs=[-0.5])


def answered_ids(messages: List[Dict[str, Any]]) -> List[str]:
    return [m["tool_call_id"] for m in messages if m["role"] == "tool"]


def called_ids(messages: List[Dict[str, Any]]) -> List[str]:
    return [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]


# --- data types --------------------------------------------------------------------------------------


def test_data_types_have_upstreams_defaults() -> None:
    assert ToolResult() == ToolResult(data=None, done=False, metadata={}, error=None)
    assert VerifyResult() == VerifyResult(env_reward=None, done=False, metrics={}, artifacts={})
    limits = HarnessRunLimits()
    assert (limits.max_turns, limits.max_tool_calls_per_turn, limits.max_total_tool_calls, limits.sampling) == (
        10,
        None,
        None,
        {},
    )
    result = HarnessRolloutResult()
    assert (result.messages, result.tool_trace, result.events, result.done, result.metrics) == ([], [], [], False, {})
    assert (result.prompt_ids, result.completion_ids, result.logprobs, result.steps) == ([], [], [], [])
    assert RESERVED_TOOL_NAMES == {"reset", "step", "state", "close"}
    with pytest.raises(ValueError, match="max_turns"):
        HarnessRunLimits(max_turns=-1)


def test_llm_response_message_has_tool_calls_only_when_there_are_some() -> None:
    assert reply("hi").to_message_dict() == {"role": "assistant", "content": "hi"}
    message = reply(None, ("echo_message", {"message": "x"})).to_message_dict()
    assert message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0_echo_message",
                "type": "function",
                "function": {"name": "echo_message", "arguments": '{"message": "x"}'},
            }
        ],
    }


def test_session_protocols_check_the_methods_a_trainer_calls() -> None:
    class Captured:
        def wait_for_completion(self, timeout_s: Optional[float] = None) -> int:
            return 0

        def fetch_training_trace(self) -> TrainingTrace:
            return TrainingTrace(turns=[])

    class Proxied:
        def wait_for_completion(self, timeout_s: Optional[float] = None) -> int:
            return 0

        def fetch_proxy_trace(self) -> list:
            return []

    assert isinstance(Captured(), TrainableSession) and not isinstance(Captured(), LoopOwningSession)
    assert isinstance(Proxied(), LoopOwningSession) and not isinstance(Proxied(), TrainableSession)
    assert isinstance(Scripted([reply("x")]), ModelStep)


# --- StepEnvSessionAdapter ---------------------------------------------------------------------------


def test_echo_session_lists_its_tools_calls_them_and_forwards_the_reward(echo_url: str, echo_tools: List[Tool]) -> None:
    with echo_session(echo_url, echo_tools, task="Echo hello.", episode_id="episode-7") as session:
        assert session.initial_messages() == [
            {"role": "system", "content": "Echo environment ready!"},
            {"role": "user", "content": "Echo hello."},
        ]
        assert [t.name for t in session.list_tools()] == ["echo_message", "echo_with_length"]
        result = session.call_tool("echo_message", {"message": "hello"})
        assert result.data["observation"]["result"] == "hello"
        assert (result.data["tool_name"], result.data["reward"], result.done, result.error) == (
            "echo_message",
            0.5,
            False,
            None,
        )
        assert result.metadata["reward"] == 0.5
        assert result.metadata["state"]["episode_id"] == "episode-7"
        verdict = session.verify([{"role": "user", "content": "Echo hello."}])
        assert verdict.env_reward == 0.5  # the rubric's 0.1 per character, as the environment computed it
        assert verdict.metrics == {"step_count": 1}
        assert verdict.artifacts["transcript_length"] == 1
    assert session.closed
    session.close()  # twice is fine


def test_an_error_the_environment_reports_becomes_the_tool_results_error(echo_url: str, echo_tools: List[Tool]) -> None:
    with echo_session(echo_url, echo_tools) as session:
        result = session.call_tool("echo_message", {"wrong": "argument"})
    assert result.error is not None and "message" in result.error


def test_blackjack_session_is_seeded_and_its_last_step_is_the_verdict(spiel_url: str) -> None:
    with spiel_session(spiel_url, seed=3) as session:
        first_deal = session.initial_messages()
        assert session.verify([]).env_reward is None  # nothing played yet: unscored, not 0
        refused = session.call_tool("play", {"action_id": 7})
        assert "illegal action_id 7" in refused.error and not refused.done
        result = session.call_tool("play", {"action_id": STAND})
        assert result.done and result.data["reward"] in (-1.0, 0.0, 1.0)
        verdict = session.verify(first_deal)
        assert (verdict.env_reward, verdict.done) == (result.data["reward"], True)
        assert verdict.metrics == {"step_count": 2}
    with spiel_session(spiel_url, seed=3) as again:
        assert again.initial_messages() == first_deal  # the same seed deals the same cards


def test_reserved_tool_names_are_refused(spiel_url: str) -> None:
    step_tool = Tool(name="step", description="", input_schema={"type": "object"})
    with pytest.raises(ValueError, match="reserved"):
        StepEnvSessionAdapter(
            OpenSpielEnv(base_url=spiel_url),
            tool_specs=[PLAY, step_tool],
            action_builder=lambda name, args: None,
            initial_messages_builder=lambda reset, task: [],
        )
    with spiel_session(spiel_url) as session:
        for name in sorted(RESERVED_TOOL_NAMES):
            with pytest.raises(KeyError, match=f"Reserved orchestration tool: {name}"):
                session.call_tool(name, {})
        with pytest.raises(KeyError, match="Unknown tool: fold"):
            session.call_tool("fold", {})
        assert session.step_count == 0


def test_a_constructor_that_fails_closes_the_client(spiel_url: str) -> None:
    with pytest.raises(Exception, match="no_such_game"):
        spiel_session(spiel_url, reset_kwargs={"game_name": "no_such_game"})
    # The server holds one session at most: the next one opens only if the failed one was closed.
    with spiel_session(spiel_url) as session:
        assert session.initial_messages()
        other = OpenSpielEnv(base_url=spiel_url).sync()
        try:
            with pytest.raises(CapacityReachedError):  # (what makes the check above a check)
                other.reset(game_name="blackjack")
        finally:
            other.close()


def test_a_tool_call_that_never_answers_costs_call_timeout_s(
    echo_server: BackgroundServer, echo_tools: List[Tool]
) -> None:
    with FaultProxy(echo_server.port) as proxy:
        proxy.stall_s = 60.0
        session = StepEnvSessionAdapter(
            GenericEnvClient(base_url=proxy.base_url),  # one connection, the one stalled below
            tool_specs=echo_tools,
            action_builder=lambda name, args: {"type": "call_tool", "tool_name": name, "arguments": args},
            initial_messages_builder=lambda reset, task: [{"role": "user", "content": "Echo twice."}],
            call_timeout_s=1.0,
        )
        assert proxy.fault("stall")
        model = Scripted([reply(None, ("echo_message", {"message": "a"}), ("echo_message", {"message": "b"}))])
        started = time.monotonic()
        rollout = MCPHarnessAdapter().run_white_box(model, session, HarnessRunLimits(max_turns=5))
        elapsed = time.monotonic() - started
        assert elapsed < 4.0, elapsed
        assert "call_timeout_s" in rollout.metrics["aborted"] and rollout.metrics["stop_reason"] == "aborted"
        assert len(model.seen) == 1 and not rollout.done  # no further turn on a dead session
        assert session.closed
        assert [e.result.error is not None for e in rollout.tool_trace] == [True]
        tool_messages = [m for m in rollout.messages if m["role"] == "tool"]
        assert answered_ids(rollout.messages) == called_ids(rollout.messages)
        assert "TimeoutError" in tool_messages[0]["content"] or "SessionCallTimeout" in tool_messages[0]["content"]
        assert "not run" in tool_messages[1]["content"]
        answer = SessionMCPBridge(session).handle_request(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo_message", "arguments": {}}}
        )
        assert answer["error"]["code"] == -32603 and "call_timeout_s" in answer["error"]["message"]


# --- SessionMCPBridge --------------------------------------------------------------------------------


def rpc(bridge: SessionMCPBridge, method: str, params: Optional[Dict[str, Any]] = None, **extra: Any) -> Dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": 9, "method": method, **extra}
    if params is not None:
        request["params"] = params
    return bridge.handle_request(request)


def test_bridge_lists_and_calls_the_sessions_tools(echo_url: str, echo_tools: List[Tool]) -> None:
    with echo_session(echo_url, echo_tools) as session:
        bridge = SessionMCPBridge(session)
        listing = rpc(bridge, "tools/list")
        assert listing["jsonrpc"] == "2.0" and listing["id"] == 9
        assert [sorted(t) for t in listing["result"]["tools"]] == [["description", "inputSchema", "name"]] * 2
        assert listing["result"]["tools"][0]["inputSchema"]["required"] == ["message"]
        called = rpc(bridge, "tools/call", {"name": "echo_with_length", "arguments": {"message": "abc"}})
        assert sorted(called["result"]) == ["data", "done", "error", "metadata"]
        assert called["result"]["data"]["observation"]["result"] == {"message": "abc", "length": 3}


def test_bridge_answers_json_rpc_errors(spiel_url: str) -> None:
    with spiel_session(spiel_url) as session:
        bridge = SessionMCPBridge(session)

        def error(answer: Dict[str, Any]) -> Tuple[int, str]:
            assert answer["error"]["data"] is None and "result" not in answer
            return answer["error"]["code"], answer["error"]["message"]

        assert error(bridge.handle_request({"jsonrpc": "1.0", "id": 1, "method": "tools/list"})) == (
            -32600,
            "Invalid Request",
        )
        assert error(rpc(bridge, "tools/call", {"arguments": {}})) == (-32602, "Missing tool name")
        assert error(rpc(bridge, "tools/call", {"name": "reset"})) == (-32602, "Reserved orchestration tool: reset")
        assert error(rpc(bridge, "tools/call", {"name": "fold"})) == (-32601, "Unknown tool: fold")
        code, message = error(rpc(bridge, "tools/call", {"name": "play", "arguments": {"action_id": "abc"}}))
        assert code == -32602 and "invalid literal" in message  # the action builder's ValueError
        assert error(rpc(bridge, "resources/list")) == (-32601, "Method not found")
        assert session.step_count == 0  # none of these reached the environment
        session.close()
        code, message = error(rpc(bridge, "tools/call", {"name": "play", "arguments": {"action_id": 1}}))
        assert code == -32603 and "closed" in message


# --- MCPHarnessAdapter (white box) --------------------------------------------------------------------


def test_white_box_rollout_over_echo(echo_url: str, echo_tools: List[Tool]) -> None:
    model = Scripted(
        [
            reply("Echoing.", ("echo_message", {"message": "hi"}), ("echo_with_length", {"message": "abc"})),
            reply("Done."),
        ]
    )
    limits = HarnessRunLimits(sampling={"temperature": 0.7, "max_tokens": 32})
    with echo_session(echo_url, echo_tools) as session:
        rollout = MCPHarnessAdapter().run_white_box(model, session, limits)
        verdict = session.verify(rollout.messages)
    assert rollout.done and rollout.metrics == {"turns": 2, "tool_calls": 2, "stop_reason": "no_tool_calls"}
    assert [m["role"] for m in rollout.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert answered_ids(rollout.messages) == called_ids(rollout.messages)
    assert rollout.messages[3]["name"] == "echo_message" and '"result": "hi"' in rollout.messages[3]["content"]
    assert [(e.tool_name, e.arguments) for e in rollout.tool_trace] == [
        ("echo_message", {"message": "hi"}),
        ("echo_with_length", {"message": "abc"}),
    ]
    assert [e.type for e in rollout.events] == ["model_response", "tool_call", "tool_call", "model_response"]
    assert rollout.events[0].payload["tool_calls"][0] == {
        "id": "call_0_echo_message",
        "name": "echo_message",
        "arguments": {"message": "hi"},
    }
    # each turn's tokens kept apart; upstream's flat lists beside them
    assert [(s.prompt_ids, s.completion_ids) for s in rollout.steps] == [([0, 0, 0], [100]), ([1, 1, 1], [101])]
    assert rollout.prompt_ids == [0, 0, 0, 1, 1, 1] and rollout.completion_ids == [100, 101]
    assert rollout.logprobs == [-0.5, -0.5]
    # the second turn saw the first turn's reply and both tool results
    assert model.seen[1] == rollout.messages[:5]
    assert verdict.env_reward == _resolve_env_reward(rollout, verdict) == pytest.approx(0.3)
    trace = rollout.training_trace()
    assert [t.loss_mask for t in trace.turns] == [[0, 0, 0, 1], [0, 0, 0, 1]]
    assert trace.turns[1].request["messages"] == rollout.messages[:5]


def test_the_model_step_gets_a_copy_of_the_conversation(echo_url: str, echo_tools: List[Tool]) -> None:
    seen_sampling: List[Dict[str, Any]] = []
    model = Scripted(
        [reply(None, ("echo_message", {"message": "x"})), reply("ok")],
        vandal=True,
        hook=lambda turn, messages, tools, sampling: seen_sampling.append(dict(sampling)),
    )
    limits = HarnessRunLimits(sampling={"temperature": 0.5})
    with echo_session(echo_url, echo_tools, task="Echo x.") as session:
        rollout = MCPHarnessAdapter().run_white_box(model, session, limits)
    assert rollout.messages[1] == {"role": "user", "content": "Echo x."}
    assert rollout.messages[0]["content"] == "Echo environment ready!"
    assert not any(m.get("content") == "smuggled in" for m in rollout.messages)
    assert model.seen[1][0]["content"] == "Echo environment ready!"  # the next turn got a fresh copy
    assert seen_sampling == [{"temperature": 0.5}, {"temperature": 0.5}] and limits.sampling == {"temperature": 0.5}


def test_calls_past_max_tool_calls_per_turn_are_answered_not_run(echo_url: str, echo_tools: List[Tool]) -> None:
    calls = [("echo_message", {"message": m}) for m in ("a", "bb", "ccc")]
    model = Scripted([reply(None, *calls), reply("ok")])
    with echo_session(echo_url, echo_tools) as session:
        rollout = MCPHarnessAdapter().run_white_box(model, session, HarnessRunLimits(max_tool_calls_per_turn=1))
        assert session.step_count == 1
    assert [e.arguments["message"] for e in rollout.tool_trace] == ["a"]
    assert answered_ids(rollout.messages) == called_ids(rollout.messages)  # all three answered
    skipped = [m["content"] for m in rollout.messages if m["role"] == "tool"][1:]
    assert all("max_tool_calls_per_turn" in c for c in skipped)
    assert rollout.metrics["skipped_tool_calls"] == 2 and rollout.done
    assert [e.type for e in rollout.events].count("tool_call_skipped") == 2


def test_max_total_tool_calls_truncates_and_answers_the_rest(echo_url: str, echo_tools: List[Tool]) -> None:
    model = Scripted([reply(None, ("echo_message", {"message": "a"}), ("echo_message", {"message": "b"}))] * 5)
    with echo_session(echo_url, echo_tools) as session:
        rollout = MCPHarnessAdapter().run_white_box(model, session, HarnessRunLimits(max_total_tool_calls=3))
        assert session.step_count == 3
    assert rollout.metrics["truncated"] is True and rollout.metrics["stop_reason"] == "max_total_tool_calls"
    assert rollout.metrics["turns"] == 2 and not rollout.done
    assert answered_ids(rollout.messages) == called_ids(rollout.messages)
    assert "max_total_tool_calls" in rollout.messages[-1]["content"]


def test_max_turns_bounds_a_model_that_never_stops(echo_url: str, echo_tools: List[Tool]) -> None:
    model = Scripted([reply(None, ("echo_message", {"message": "again"}))])
    with echo_session(echo_url, echo_tools) as session:
        rollout = MCPHarnessAdapter().run_white_box(model, session, HarnessRunLimits(max_turns=3))
    assert len(model.seen) == 3 and not rollout.done
    assert rollout.metrics == {"turns": 3, "tool_calls": 3, "stop_reason": "max_turns"}
    assert rollout.messages[-1]["role"] == "tool"  # the last turn's call answered too


def test_a_failing_tool_is_an_error_the_model_reads(echo_url: str, echo_tools: List[Tool]) -> None:
    model = Scripted(
        [reply(None, ("bash", {"command": "ls"})), reply(None, ("echo_message", {"message": "ok"})), reply("done")]
    )
    with echo_session(echo_url, echo_tools) as session:
        rollout = MCPHarnessAdapter().run_white_box(model, session)
    assert rollout.done and rollout.metrics["tool_errors"] == 1
    assert rollout.tool_trace[0].result.error == "KeyError: Unknown tool: bash"
    assert model.seen[1][-1] == {
        "role": "tool",
        "tool_call_id": "call_0_bash",
        "name": "bash",
        "content": "Error: KeyError: Unknown tool: bash",
    }
    assert rollout.tool_trace[1].result.error is None  # the rollout went on


def test_a_tool_that_ends_the_episode_ends_the_rollout(spiel_url: str) -> None:
    model = Scripted([reply(None, ("play", {"action_id": STAND}), ("play", {"action_id": HIT})), reply("never asked")])
    with spiel_session(spiel_url) as session:
        rollout = MCPHarnessAdapter().run_white_box(model, session)
        verdict = session.verify(rollout.messages)
    assert rollout.done and rollout.metrics["stop_reason"] == "env_done" and len(model.seen) == 1
    assert len(rollout.tool_trace) == 1
    assert answered_ids(rollout.messages) == called_ids(rollout.messages)
    assert "episode ended" in rollout.messages[-1]["content"]
    assert _resolve_env_reward(rollout, verdict) == verdict.env_reward == rollout.tool_trace[0].result.data["reward"]


def test_adapters_refuse_the_mode_they_do_not_run(echo_url: str, echo_tools: List[Tool]) -> None:
    with echo_session(echo_url, echo_tools) as session:
        with pytest.raises(NotImplementedError):
            MCPHarnessAdapter().run_black_box(session)
        with pytest.raises(NotImplementedError):
            CLIHarnessAdapter(lambda bridge, s, limits: HarnessRolloutResult()).run_white_box(Scripted([]), session)
        with pytest.raises(TypeError, match="HarnessRolloutResult"):
            CLIHarnessAdapter(lambda bridge, s, limits: {"messages": []}).run_black_box(session)


def test_black_box_agent_reaches_the_tools_through_the_bridge(echo_url: str, echo_tools: List[Tool]) -> None:
    def agent(
        bridge: SessionMCPBridge, session: ResourceSession, limits: Optional[HarnessRunLimits]
    ) -> HarnessRolloutResult:
        """A tiny agent with its own loop: it echoes each word of the task through JSON-RPC."""
        tools = bridge.handle_request({"jsonrpc": "2.0", "id": 0, "method": "tools/list"})["result"]["tools"]
        assert "echo_message" in [t["name"] for t in tools]
        result = HarnessRolloutResult(messages=session.initial_messages())
        for i, word in enumerate(result.messages[-1]["content"].split()[: limits.max_turns]):
            answer = bridge.handle_request(
                {
                    "jsonrpc": "2.0",
                    "id": i + 1,
                    "method": "tools/call",
                    "params": {"name": "echo_message", "arguments": {"message": word}},
                }
            )["result"]
            result.tool_trace.append(ToolTraceEntry("echo_message", {"message": word}, ToolResult(**answer)))
        result.done = True
        return result

    with echo_session(echo_url, echo_tools, task="one three") as session:
        rollout = CLIHarnessAdapter(agent).run_black_box(session, HarnessRunLimits(max_turns=5))
        verdict = session.verify(rollout.messages)
    assert [e.result.data["observation"]["result"] for e in rollout.tool_trace] == ["one", "three"]
    assert verdict.env_reward == _resolve_env_reward(rollout, verdict) == pytest.approx(0.5)


def test_a_plain_subclass_of_the_abstract_adapter_runs_the_mode_it_implements() -> None:
    class Only(HarnessAdapter):
        def run_black_box(self, session: Any, limits: Any = None) -> HarnessRolloutResult:
            return HarnessRolloutResult(done=True)

    assert Only().run_black_box(None).done
    with pytest.raises(NotImplementedError):
        Only().run_white_box(Scripted([]), None)


# --- rewards -----------------------------------------------------------------------------------------


def test_verify_must_forward_the_environments_reward(echo_url: str, echo_tools: List[Tool]) -> None:
    made_up = VerifyResult(env_reward=1.0)
    with echo_session(echo_url, echo_tools, verify_builder=lambda transcript, final, last, state: made_up) as session:
        rollout = MCPHarnessAdapter().run_white_box(
            Scripted([reply(None, ("echo_message", {"message": "hey"})), reply("ok")]), session
        )
        verdict = session.verify(rollout.messages)
    with pytest.raises(ValueError, match=r"verify\.env_reward must forward the environment reward from the rollout"):
        _resolve_env_reward(rollout, verdict)
    assert _resolve_env_reward(rollout, VerifyResult(env_reward=0.3 + 1e-9)) == pytest.approx(0.3)
    assert _resolve_env_reward(rollout, VerifyResult()) == pytest.approx(0.3)  # the trace's, when verify has none
    assert _resolve_env_reward(HarnessRolloutResult(), VerifyResult(env_reward=0.25)) == 0.25
    with pytest.raises(ValueError, match="did not produce an environment reward"):
        _resolve_env_reward(HarnessRolloutResult(), VerifyResult())


# --- build_harness_rollout_func ------------------------------------------------------------------------


class EchoSessions(ResourceSessionFactory[StepEnvSessionAdapter]):
    """Echo sessions, one per rollout; keeps what it was asked for."""

    def __init__(self, url: str, tools: List[Tool], verify_builder: Optional[Callable] = None) -> None:
        self.url, self.tools, self.verify_builder = url, tools, verify_builder
        self.created: List[Tuple[Any, Optional[int], Optional[str]]] = []
        self.sessions: List[StepEnvSessionAdapter] = []
        self._lock = threading.Lock()

    def create(self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None) -> StepEnvSessionAdapter:
        session = echo_session(
            self.url, self.tools, task=task, seed=seed, episode_id=episode_id, verify_builder=self.verify_builder
        )
        with self._lock:
            self.created.append((task, seed, episode_id))
            self.sessions.append(session)
        return session


def echo_word_step(trainer: Any, session: StepEnvSessionAdapter) -> Scripted:
    """The model step of one session: echo the prompt's last word, then stop."""
    word = session.initial_messages()[-1]["content"].split()[-1]
    return Scripted([reply(None, ("echo_message", {"message": word})), reply("done")])


def chat(text: str) -> List[Dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_rollout_func_returns_trls_shape_with_seeds_and_episode_ids(echo_url: str, echo_tools: List[Tool]) -> None:
    factory = EchoSessions(echo_url, echo_tools)
    rollout_func = build_harness_rollout_func(
        session_factory=factory, harness_adapter=MCPHarnessAdapter(), model_step_builder=echo_word_step
    )
    prompts = [chat("Echo ab"), chat("Echo ab"), chat("Echo abcd"), chat("Echo abcd")]  # 2 prompts x 2 generations
    out = rollout_func(prompts, object())
    assert sorted(out) == ["completion_ids", "env_reward", "logprobs", "prompt_ids", "verify_metrics"]
    assert all(len(v) == 4 for v in out.values())
    assert out["env_reward"] == pytest.approx([0.2, 0.2, 0.4, 0.4])
    assert out["prompt_ids"][0] == [0, 0, 0, 1, 1, 1] and out["completion_ids"][0] == [100, 101]
    assert out["logprobs"][0] == [-0.5, -0.5]
    assert out["verify_metrics"] == [{"step_count": 1}] * 4
    seeds = {json.dumps(task): set() for task, _, _ in factory.created}
    for task, seed, _ in factory.created:
        seeds[json.dumps(task)].add(seed)
    assert all(len(s) == 1 for s in seeds.values()) and len({s.pop() for s in seeds.values()}) == 2
    episode_ids = [e for _, _, e in factory.created]
    assert len(set(episode_ids)) == 4 and all(re.fullmatch(r"[0-9a-f]{32}", e) for e in episode_ids)
    assert all(s.closed for s in factory.sessions)


def test_rollout_func_runs_its_prompts_at_once(echo_url: str, echo_tools: List[Tool]) -> None:
    barrier = threading.Barrier(4, timeout=20)

    def waiting_step(trainer: Any, session: StepEnvSessionAdapter) -> Scripted:
        step = echo_word_step(trainer, session)
        step.hook = lambda turn, *args: barrier.wait() if turn == 0 else None  # passes only with 4 rollouts in flight
        return step

    rollout_func = build_harness_rollout_func(
        session_factory=EchoSessions(echo_url, echo_tools),
        harness_adapter=MCPHarnessAdapter(),
        model_step_builder=waiting_step,
        max_concurrency=4,
    )
    out = rollout_func([chat(f"Echo {'x' * n}") for n in range(1, 5)], None)
    assert out["env_reward"] == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_rollout_func_records_a_failed_prompt_and_keeps_the_batch(echo_url: str, echo_tools: List[Tool]) -> None:
    def verify(transcript: Any, final_state: Any, last: Any, state: Any) -> VerifyResult:
        if "fabricate" in transcript[0]["content"]:
            return VerifyResult(env_reward=1.0)  # not the environment's reward: refused
        return VerifyResult(env_reward=last.reward)

    def step(trainer: Any, session: StepEnvSessionAdapter) -> Scripted:
        if "unreachable" in session.initial_messages()[0]["content"]:
            raise ConnectionError("the engine is unreachable")
        return echo_word_step(trainer, session)

    factory = EchoSessions(echo_url, echo_tools, verify_builder=verify)
    rollout_func = build_harness_rollout_func(
        session_factory=factory, harness_adapter=MCPHarnessAdapter(), model_step_builder=step, reward_key="reward"
    )
    out = rollout_func([chat("Echo abc"), chat("fabricate x"), chat("unreachable y")], None)
    assert out["reward"][0] == pytest.approx(0.3) and out["reward"][1:] == [None, None]
    assert out["verify_metrics"][1]["error"].startswith("ValueError: verify.env_reward must forward")
    assert out["verify_metrics"][2] == {"error": "ConnectionError: the engine is unreachable"}
    assert out["prompt_ids"][1:] == [[], []] and out["completion_ids"][1:] == [[], []]
    assert all(s.closed for s in factory.sessions)
    with pytest.raises(ConnectionError, match="unreachable"):  # every prompt failed: the error propagates
        rollout_func([chat("unreachable a"), chat("unreachable b")], None)


# --- resolve_tool_conflicts --------------------------------------------------------------------------


def test_resolve_tool_conflicts_renames_the_environments_copy(echo_tools: List[Tool]) -> None:
    before = [t.model_dump() for t in echo_tools]
    resolved = resolve_tool_conflicts(echo_tools, ["echo_message", "bash"])
    assert [t.name for t in resolved] == ["env_echo_message", "echo_with_length"]
    assert resolved[0].input_schema == echo_tools[0].input_schema and resolved[1] is echo_tools[1]
    assert [t.model_dump() for t in echo_tools] == before
    assert [
        t.name
        for t in resolve_tool_conflicts(
            echo_tools, [Tool(name="echo_with_length", description="", input_schema={})], prefix="x_"
        )
    ] == [
        "echo_message",
        "x_echo_with_length",
    ]
    with pytest.raises(ValueError, match="reserved"):
        resolve_tool_conflicts([*echo_tools, PLAY.model_copy(update={"name": "reset"})], [])
    with pytest.raises(ValueError, match="Duplicate environment tool name"):
        resolve_tool_conflicts([echo_tools[0], echo_tools[0]], [])
    with pytest.raises(ValueError, match="taken"):
        resolve_tool_conflicts(echo_tools, ["echo_message", "env_echo_message"])


# --- the tiny engine as the model step ------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_server() -> Iterator[Any]:
    pytest.importorskip("torch", reason="the tiny engine needs torch")
    pytest.importorskip("transformers", reason="the tiny engine needs transformers")
    from openenv.testing.tiny_engine import TinyEngine

    engine = TinyEngine.build(tool_name="run_command")  # shell_env's tool; trained once, then cached
    with engine.serve() as server:
        yield server


@pytest.fixture(scope="module")
def shell_url() -> Iterator[str]:
    pytest.importorskip("shell_env", reason="shell_env is not installed (pip install -e envs/shell_env)")
    from shell_env.server.app import app

    from openenv.core.containers.runtime.isolation import find_bwrap

    if find_bwrap() is None:
        pytest.skip("shell_env runs commands in bubblewrap, which is not installed")
    with BackgroundServer(app) as server:
        yield server.base_url


class EngineStep:
    """A ModelStep that asks the tiny engine (vLLM's chat-completions API) for each turn and returns
    the engine's own prompt ids, sampled ids and logprobs (``return_token_ids``, ``logprobs``)."""

    def __init__(self, server: Any) -> None:
        import httpx

        self.http = httpx.Client(base_url=server.base_url, timeout=120)
        self.model = server.model
        self.requests: List[Dict[str, Any]] = []

    def __call__(self, messages: List[Dict[str, Any]], tools: List[Tool], sampling: Dict[str, Any]) -> ModelStepResult:
        body = {
            "model": self.model,
            "messages": messages,
            "tools": [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
                }
                for t in tools
            ],
            "logprobs": True,
            "return_token_ids": True,
            **sampling,
        }
        self.requests.append(body)
        answer = self.http.post("/chat/completions", json=body)
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


def shell_session(
    url: str, task: Any = None, seed: Optional[int] = 0, episode_id: Optional[str] = None
) -> StepEnvSessionAdapter:
    from shell_env import ShellEnv

    with ShellEnv(base_url=url).sync() as lister:
        tools = [t for t in lister.list_tools() if t.name == "run_command"]

    def opening(reset: Any, task: Any) -> List[Dict[str, Any]]:
        return [{"role": "user", "content": reset.observation.instruction}]

    return StepEnvSessionAdapter(
        ShellEnv(base_url=url),
        task=task,
        seed=seed,
        episode_id=episode_id,
        tool_specs=tools,
        action_builder=call_tool_action,
        initial_messages_builder=opening,
    )


def test_tiny_engine_white_box_over_shell_env(engine_server: Any, shell_url: str) -> None:
    model = EngineStep(engine_server)
    limits = HarnessRunLimits(max_turns=3, sampling={"temperature": 0.0, "max_tokens": 48})
    with shell_session(shell_url) as session:
        rollout = MCPHarnessAdapter().run_white_box(model, session, limits)
        verdict = session.verify(rollout.messages)
    assert 1 <= len(rollout.steps) == rollout.metrics["turns"] <= 3
    assert answered_ids(rollout.messages) == called_ids(rollout.messages)
    # greedy, the tiny engine calls the tool it was trained on whenever tools are declared
    assert rollout.tool_trace, rollout.messages
    assert (
        rollout.tool_trace[0].tool_name == "run_command" and rollout.tool_trace[0].result.data["observation"]["result"]
    )
    # each turn's tokens are the engine's, one logprob per sampled token; the flat lists concatenate them
    for step in rollout.steps:
        assert step.prompt_ids and len(step.logprobs) == len(step.completion_ids) > 0
    assert rollout.completion_ids == [i for s in rollout.steps for i in s.completion_ids]
    assert len(rollout.prompt_ids) == sum(len(s.prompt_ids) for s in rollout.steps)
    # Each next prompt is the last prompt, the tokens sampled, then the tool results: the messages the
    # harness appended render back to exactly what the engine sampled, so a trainer can chain turns.
    assert len(rollout.steps) >= 2 and model.requests[1]["messages"][-1]["role"] == "tool"
    for before, after in zip(rollout.steps[:-1], rollout.steps[1:], strict=True):
        seen = before.prompt_ids + before.completion_ids
        assert after.prompt_ids[: len(seen)] == seen and len(after.prompt_ids) > len(seen)
    trace = rollout.training_trace()  # validated: ids, finite logprobs <= 0, masks
    assert [len(t.completion_token_ids) for t in trace.turns] == [len(s.completion_ids) for s in rollout.steps]
    assert verdict.env_reward == 0.0 and _resolve_env_reward(rollout, verdict) == 0.0  # no submit: the env's 0.0


def test_tiny_engine_rollout_func_over_shell_env(engine_server: Any, shell_url: str) -> None:
    class ShellSessions(ResourceSessionFactory[StepEnvSessionAdapter]):
        def create(
            self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None
        ) -> StepEnvSessionAdapter:
            return shell_session(shell_url, task, seed=seed, episode_id=episode_id)

    rollout_func = build_harness_rollout_func(
        session_factory=ShellSessions(),
        harness_adapter=MCPHarnessAdapter(),
        model_step_builder=lambda trainer, session: EngineStep(engine_server),
        limits=HarnessRunLimits(max_turns=2, sampling={"temperature": 0.0, "max_tokens": 48}),
        max_concurrency=2,
        seed_fn=lambda prompt: 0,  # shell_env's task 0, on which the greedy tiny engine calls its tool
    )
    out = rollout_func([chat("Solve the task."), chat("Solve the task.")], None)
    assert out["env_reward"] == [0.0, 0.0]
    for prompt_ids, completion_ids, logprobs in zip(
        out["prompt_ids"], out["completion_ids"], out["logprobs"], strict=True
    ):
        assert prompt_ids and completion_ids and len(logprobs) == len(completion_ids)
        assert all(isinstance(i, int) for i in completion_ids) and all(x <= 0 for x in logprobs)
