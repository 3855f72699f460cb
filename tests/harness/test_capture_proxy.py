"""The capture proxy with real parts: the vendors' own SDKs as agents, the tiny real engine of
``openenv.testing.tiny_engine`` (a model made on the spot, sampling its own tokens, served like
vLLM) behind it, real HTTP on 127.0.0.1.

What a trainer needs from it: every turn's prompt and completion ids are the engine's own (a
local render of the same messages gives the same ids: re-tokenisation skew 0), each turn's prompt
extends the previous turn's tokens, loss masks cover exactly the sampled tokens, and what the
agent gets back is valid in its own dialect, streamed or not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from openenv.core.harness.capture import CaptureServer  # noqa: E402
from openenv.core.harness.capture.export import export_session, measure_retokenization_skew  # noqa: E402
from openenv.testing.tiny_engine import TinyEngine  # noqa: E402

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
SYSTEM = "You are a careful agent. Use the tools."


@pytest.fixture(scope="module")
def engine() -> Any:
    return TinyEngine.build()


@pytest.fixture(scope="module")
def engine_server(engine: Any) -> Iterator[Any]:
    with engine.serve() as server:
        yield server


@pytest.fixture
def proxy(engine_server: Any, tmp_path: Path) -> Iterator[CaptureServer]:
    with CaptureServer(
        llm_url=engine_server.base_url, model=engine_server.model, port=0, journal_dir=str(tmp_path / "journal")
    ) as server:
        yield server


def check_trace(proxy: CaptureServer, session_id: str, engine: Any, turns: int) -> Dict[str, Any]:
    """The trainer's view of a rollout, checked: exact ids, prefix-extending prompts, masks.

    A turn's prompt extends the last turn's tokens whenever the agent sent back what the model
    sampled. A small model sometimes samples text after its tool call that the tool-call parser
    drops (vLLM's does the same); the agent cannot send that text back, so its next prompt starts
    a new branch of the rollout graph, and the graph must say so."""
    trace = proxy.training_trace(session_id)
    assert len(trace.turns) == turns
    for turn in trace.turns:
        n_prompt, n_completion = len(turn.prompt_token_ids), len(turn.completion_token_ids)
        assert n_completion > 0 and len(turn.per_token_logps) == n_completion
        assert turn.loss_mask == [0] * n_prompt + [1] * n_completion
        assert all(lp <= 0 for lp in turn.per_token_logps)
    session = proxy.registry.get(session_id)
    nodes = list(session.graph.nodes.values())
    extended = 0
    for before, after, node in zip(trace.turns, trace.turns[1:], nodes[1:], strict=False):
        seen = before.prompt_token_ids + before.completion_token_ids
        if after.prompt_token_ids[: len(seen)] == seen:
            extended += 1
            assert node.parent_id == before.node_id
            continue
        # Not extended: the prompt part matched, the difference is in what the agent sent back.
        assert after.prompt_token_ids[: len(before.prompt_token_ids)] == before.prompt_token_ids
        assert rendered_reply(engine, before) != engine.tokenizer.decode(before.completion_token_ids)
        assert node.parent_id != before.node_id
    document = export_session(session, include_messages=True)
    skew = measure_retokenization_skew(session.graph, document, engine.tokenizer)
    assert skew["n_turns"] == turns and skew["n_errors"] == 0
    assert skew["exact_match_frac"] == 1.0 and skew["max_abs_delta"] == 0, skew
    rollout = proxy.rollout(session_id)
    assert rollout["stats"]["n_roots"] == turns - extended and rollout["trainable"]
    return {"trace": trace, "skew": skew, "rollout": rollout, "extended": extended}


def rendered_reply(engine: Any, turn: Any) -> str:
    """The model's reply as the chat template renders it back into the next prompt."""
    messages, tools = turn.request["messages"], turn.request.get("tools")
    reply = turn.response["choices"][0]["message"]
    template = engine.tokenizer.apply_chat_template
    before = template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    after = template([*messages, reply], tools=tools, tokenize=False)
    assert after.startswith(before)
    return after[len(before) :].rstrip("\n")


def tool_result(call_id: str) -> Dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "README.md\nsetup.py"}


# --- OpenAI chat completions ---------------------------------------------------------------------


def chat_turns(client: Any, model: str, turns: int, *, stream: bool = False) -> List[Any]:
    messages: List[Dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "List the files."},
    ]
    answers = []
    for turn in range(turns):
        kwargs = dict(model=model, messages=messages, tools=[BASH], max_tokens=48, temperature=1.0, seed=turn)
        if stream:
            with client.chat.completions.stream(**kwargs) as events:
                message = events.get_final_completion().choices[0].message
        else:
            message = client.chat.completions.create(**kwargs).choices[0].message
        answers.append(message)
        messages.append(message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"}))
        if message.tool_calls:
            messages += [tool_result(call.id) for call in message.tool_calls]
        else:
            messages.append({"role": "user", "content": "Go on."})
    return answers


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_chat_multi_turn_capture_is_the_engines_own_tokens(proxy, engine, engine_server, stream):
    session = proxy.create_session(sampling={"temperature": 0.7})
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=session["api_key"], max_retries=0)
    answers = chat_turns(client, engine_server.model, 3, stream=stream)
    assert any(answer.tool_calls for answer in answers), "the tiny model calls its tool most of the time"
    found = check_trace(proxy, session["session_id"], engine, 3)
    entries = proxy.trace_entries(session["session_id"])
    for answer, entry in zip(answers, entries, strict=True):  # what the agent got is what was recorded
        recorded = entry["response"]["choices"][0]["message"]
        assert (recorded.get("content") or None) == (answer.content or None)
        assert [c["function"]["name"] for c in recorded.get("tool_calls") or []] == [
            c.function.name for c in answer.tool_calls or []
        ]
    assert found["skew"]["n_turns"] == 3


def test_the_agent_gets_no_engine_only_fields(proxy, engine_server):
    session = proxy.create_session(sampling={"temperature": 0.7})
    import httpx

    reply = httpx.post(
        proxy.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {session['api_key']}"},
        json={"model": "whatever-the-agent-says", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        timeout=60,
    ).json()
    assert reply["model"] == "whatever-the-agent-says"
    assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]
    assert reply["choices"][0].get("logprobs") is None


# --- Anthropic Messages --------------------------------------------------------------------------


ANTHROPIC_BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "input_schema": BASH["function"]["parameters"],
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_anthropic_messages_multi_turn_capture(proxy, engine, engine_server, stream):
    session = proxy.create_session(sampling={"temperature": 0.7})
    client = anthropic.Anthropic(base_url=proxy.url, api_key=session["api_key"], max_retries=0)
    messages: List[Dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    for _ in range(2):
        kwargs = dict(
            model=engine_server.model, system=SYSTEM, max_tokens=48, messages=messages, tools=[ANTHROPIC_BASH]
        )
        if stream:
            with client.messages.stream(**kwargs) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(**kwargs)
        assert message.role == "assistant" and message.stop_reason in ("end_turn", "tool_use", "max_tokens")
        messages.append(
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]}
        )
        uses = [block for block in message.content if block.type == "tool_use"]
        if uses:
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "README.md"} for u in uses],
                }
            )
        else:
            messages.append({"role": "user", "content": "Go on."})
    check_trace(proxy, session["session_id"], engine, 2)


# --- OpenAI Responses ----------------------------------------------------------------------------

RESPONSES_BASH = {"type": "function", "name": "bash", "description": "Run a shell command.",
                  "parameters": BASH["function"]["parameters"]}  # fmt: skip


def test_openai_responses_multi_turn_capture(proxy, engine, engine_server):
    session = proxy.create_session(sampling={"temperature": 0.7})
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=session["api_key"], max_retries=0)
    items: List[Any] = [{"role": "user", "content": "List the files."}]
    for _ in range(2):
        response = client.responses.create(
            model=engine_server.model, instructions=SYSTEM, input=items, tools=[RESPONSES_BASH], max_output_tokens=48
        )
        assert response.status in ("completed", "incomplete")
        for item in response.output:
            items.append(item.model_dump(exclude_none=True))
            if item.type == "function_call":
                items.append({"type": "function_call_output", "call_id": item.call_id, "output": "README.md"})
        if not any(item.type == "function_call" for item in response.output):
            items.append({"role": "user", "content": "Go on."})
    check_trace(proxy, session["session_id"], engine, 2)


# --- Google generateContent ----------------------------------------------------------------------


def test_google_genai_multi_turn_capture(proxy, engine, engine_server):
    genai = pytest.importorskip("google.genai")
    types = genai.types
    session = proxy.create_session(sampling={"temperature": 0.7})
    client = genai.Client(api_key=session["api_key"], http_options=types.HttpOptions(base_url=proxy.url))
    tool = types.Tool(
        function_declarations=[
            types.FunctionDeclaration(
                name="bash",
                description="Run a shell command.",
                parameters_json_schema=BASH["function"]["parameters"],
            )
        ]
    )
    config = types.GenerateContentConfig(
        system_instruction=SYSTEM,
        tools=[tool],
        max_output_tokens=48,
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    contents: List[Any] = [types.Content(role="user", parts=[types.Part(text="List the files.")])]
    for _ in range(2):
        response = client.models.generate_content(model=engine_server.model, contents=contents, config=config)
        content = response.candidates[0].content
        contents.append(content)
        calls = [part.function_call for part in content.parts or [] if part.function_call]
        if calls:
            contents.append(
                types.Content(
                    role="user",
                    parts=[
                        types.Part(
                            function_response=types.FunctionResponse(
                                id=c.id, name=c.name, response={"output": "README.md"}
                            )
                        )
                        for c in calls
                    ],
                )
            )
        else:
            contents.append(types.Content(role="user", parts=[types.Part(text="Go on.")]))
    check_trace(proxy, session["session_id"], engine, 2)


def test_the_rollout_document_and_trace_entries_are_upstreams_shapes(proxy, engine_server):
    session = proxy.create_session(sampling={"temperature": 0.7})
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=session["api_key"], max_retries=0)
    chat_turns(client, engine_server.model, 2)
    document = proxy.rollout(session["session_id"], include_messages=True)
    assert {"session_id", "metadata", "budget_stop_count", "turns", "stats", "sequences", "validation", "trainable",
            "capture_level", "rollout_type"} <= set(document)  # fmt: skip
    assert document["capture_level"] == "tokens" and document["rollout_type"] == "train"
    (sequence,) = document["sequences"]
    assert sequence["role"] == "agent" and sequence["n_turns"] == 2
    assert len(sequence["input_ids"]) == len(sequence["loss_mask"]) == len(sequence["logprobs"])
    entries = proxy.trace_entries(session["session_id"])
    assert [sorted(entry) for entry in entries] == [
        sorted(
            [
                "request",
                "response",
                "prompt_token_ids",
                "completion_token_ids",
                "per_token_logps",
                "loss_mask",
                "metadata",
            ]
        )
    ] * 2
    json.dumps(document)


# --- what an engine can give -----------------------------------------------------------------------


def test_validate_llm_finds_a_trainable_engine(engine_server):
    from openenv.core.harness.capture import require_llm, validate_llm

    report = validate_llm(engine_server.base_url, engine_server.model)
    assert report.ok and report.reachable and report.capture_level == "tokens" and report.trainable
    assert report.n_prompt_ids > 0 and report.n_completion_ids > 0
    assert engine_server.model in report.served_models and report.tool_support is True
    assert require_llm(engine_server.base_url, engine_server.model, require_tokens=True).rollout_type == "train"


def test_require_llm_names_an_engine_that_is_not_there():
    import socket

    from openenv.core.harness.capture import require_llm, validate_llm

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    report = validate_llm(f"http://127.0.0.1:{port}", "m", timeout=5)
    assert not report.ok and not report.reachable and report.findings[0].startswith("[FATAL] unreachable")
    with pytest.raises(RuntimeError, match=f"no engine answers at http://127.0.0.1:{port}/v1"):
        require_llm(f"http://127.0.0.1:{port}", "m", timeout=5)
