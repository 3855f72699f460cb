"""The capture proxy's four wire dialects, checked with the official SDKs as clients.

A small real server on 127.0.0.1 plays the proxy around a fixed engine answer: it detects the
dialect, translates the SDK's request to chat completions (recorded for the test), and replays
the engine's chat completion in the SDK's dialect, as JSON or as SSE. The SDKs (openai,
anthropic, google-genai) must parse every reply and stream, and reassemble the same answer.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Dict, Iterator, List, Optional

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gtypes
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response as OpenAIResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.harness.capture.dialects import (
    APIType,
    DialectError,
    count_tokens_reply,
    detect,
    dialect_for,
    is_count_tokens_path,
)

SERVED = "served-model"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n-not-really-an-image").decode()


# --- the engine's answers (vLLM-shaped, as normalize_response leaves them) ---------------------


def engine_answer(
    text: Optional[str] = "",
    *,
    reasoning: Optional[str] = None,
    calls: List[Dict[str, str]] = (),  # type: ignore[assignment]
    finish: str = "stop",
    stop_reason: Any = None,
) -> Dict[str, Any]:
    message: Dict[str, Any] = {
        "role": "assistant",
        "content": text if text else None,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
            for call in calls
        ],
        "reasoning_content": reasoning,
    }
    return {
        "id": "chatcmpl-0123abcd",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": SERVED,
        "prompt_token_ids": [151644, 872, 198],
        "kv_transfer_params": None,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {
                    "content": [
                        {
                            "token": "token_id:9707",
                            "logprob": -0.25,
                            "bytes": None,
                            "top_logprobs": [],
                            "token_id": 9707,
                        },
                        {
                            "token": "token_id:151645",
                            "logprob": -0.5,
                            "bytes": None,
                            "top_logprobs": [],
                            "token_id": 151645,
                        },
                    ]
                },
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "token_ids": [9707, 151645],
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42},
    }


WEATHER_CALLS = [
    {"id": "chatcmpl-tool-aaa", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"id": "chatcmpl-tool-bbb", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
]
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


# --- the stand-in proxy --------------------------------------------------------------------


class Stage:
    """What the stand-in proxy answers and what it saw."""

    def __init__(self) -> None:
        self.answer: Dict[str, Any] = engine_answer("Hello.")
        self.fail: Optional[int] = None  # an HTTP status to answer with instead
        self.fail_mid_stream = False
        self.bodies: List[Dict[str, Any]] = []
        self.chats: List[Dict[str, Any]] = []
        self.paths: List[str] = []
        self.frames: List[bytes] = []


STAGE = Stage()


async def _call(request: Request) -> Response:
    path = request.url.path
    body = json.loads(await request.body())
    api_type = detect(path, request.headers, body)
    dialect = dialect_for(api_type)
    STAGE.bodies.append(body)
    STAGE.paths.append(path + ("?" + request.url.query if request.url.query else ""))
    counted = count_tokens_reply(api_type, body, path=path)
    if counted is not None:
        return JSONResponse(counted)
    try:
        chat = dialect.to_chat(body, path=path, served_model=SERVED)
    except DialectError as exc:
        return JSONResponse(dialect.error_body(400, str(exc), code="invalid_request_error"), status_code=400)
    STAGE.chats.append(chat)
    stream = dialect.stream_requested(STAGE.paths[-1], body)
    if STAGE.fail is not None and not (stream and STAGE.fail_mid_stream):
        message = f"engine failed with {STAGE.fail}"
        return JSONResponse(dialect.error_body(STAGE.fail, message, code="api_error"), status_code=STAGE.fail)
    if stream:
        if STAGE.fail_mid_stream:
            frames = [dialect.sse_keepalive(), dialect.sse_error("the engine went away", code="server_error")]
        else:
            reply = dialect.from_chat(STAGE.answer, request=body, path=path)
            sse_kwargs = {"request": body} if api_type is APIType.OPENAI_CHAT else {}
            frames = list(dialect.sse(reply, **sse_kwargs))
        STAGE.frames = frames
        return StreamingResponse(iter(frames), media_type="text/event-stream")
    return JSONResponse(dialect.from_chat(STAGE.answer, request=body, path=path))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    app = Starlette(routes=[Route("/{path:path}", _call, methods=["POST"])])
    with BackgroundServer(app) as running:
        yield running.base_url


@pytest.fixture
def stage(server: str) -> Stage:
    STAGE.__init__()  # type: ignore[misc]
    return STAGE


@pytest.fixture
def oai(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="rollout-1", max_retries=0)


@pytest.fixture
def claude(server: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server, api_key="rollout-1", max_retries=0)


@pytest.fixture
def gemini(server: str) -> genai.Client:
    options = gtypes.HttpOptions(base_url=server, retry_options=gtypes.HttpRetryOptions(attempts=1))
    return genai.Client(api_key="rollout-1", http_options=options)


def sse_events(frames: List[bytes]) -> List[Dict[str, Any]]:
    """The ``data:`` payloads of SSE frames (each frame must be one complete event)."""
    events = []
    for frame in frames:
        assert frame.endswith(b"\n\n") and frame.count(b"\n\n") == 1, frame  # one complete event
        for line in frame.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
    return events


# --- detection ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "headers", "body", "expected"),
    [
        ("/v1/messages", {}, {"messages": []}, APIType.ANTHROPIC),
        ("/v1/messages/count_tokens", {}, {}, APIType.ANTHROPIC),
        ("/v1/chat/completions", {"anthropic-version": "2023-06-01"}, {}, APIType.OPENAI_CHAT),
        ("/openai/v1/responses", {}, {"messages": []}, APIType.OPENAI_RESPONSES),
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", {}, {}, APIType.GOOGLE),
        ("/v1beta/models/m:GENERATECONTENT", {}, {}, APIType.GOOGLE),
        ("/v1beta/models/m:countTokens", {}, {}, APIType.GOOGLE),
        ("/proxy", {"Anthropic-Version": "2023-06-01"}, {"contents": []}, APIType.ANTHROPIC),
        ("/proxy", {}, {"contents": []}, APIType.GOOGLE),
        ("/proxy", {}, {"input": "hi", "instructions": "be brief"}, APIType.OPENAI_RESPONSES),
        ("/proxy", {}, {"input": "hi"}, APIType.OPENAI_RESPONSES),
        ("/proxy", {}, {"messages": [], "input": "x"}, APIType.OPENAI_CHAT),
        ("/proxy", {}, {}, APIType.OPENAI_CHAT),
    ],
)
def test_detect_goes_by_route_then_header_then_body(
    path: str, headers: Dict[str, str], body: Dict[str, Any], expected: APIType
) -> None:
    assert detect(path, headers, body) is expected


def test_stream_requested_by_flag_route_or_alt_sse() -> None:
    chat, google = dialect_for(APIType.OPENAI_CHAT), dialect_for(APIType.GOOGLE)
    assert chat.stream_requested("/v1/chat/completions", {"stream": True})
    assert not chat.stream_requested("/v1/chat/completions", {"stream": False})
    assert not chat.stream_requested("/v1/chat/completions", {"stream": "yes"})
    assert google.stream_requested("/v1beta/models/m:streamGenerateContent", {})
    assert google.stream_requested("/v1beta/models/m:generateContent?alt=sse", {})
    assert not google.stream_requested("/v1beta/models/m:generateContent", {})


@pytest.mark.parametrize("api_type", list(APIType))
def test_every_sse_item_is_one_complete_event(api_type: APIType) -> None:
    dialect = dialect_for(api_type)
    path = "/v1beta/models/g:streamGenerateContent" if api_type is APIType.GOOGLE else "/v1/x"
    reply = dialect.from_chat(
        engine_answer("Checking.", reasoning="Hm.", calls=WEATHER_CALLS, finish="tool_calls"),
        request={"model": "m"},
        path=path,
    )
    frames = list(dialect.sse(reply))
    events = sse_events(frames)  # asserts each frame is one event ending in a blank line
    assert events and json.dumps(events).count("Checking.") >= 1
    for frame in frames:
        lines = frame.decode().split("\n")
        if lines[0].startswith("event: "):  # a named event names the type its data carries
            assert json.loads(lines[1][len("data: ") :])["type"] == lines[0][len("event: ") :]
    for message, code in (("boom", "server_error"), ("slow down", "rate_limit_error")):
        assert dialect.sse_error(message, code=code).endswith(b"\n\n")
        assert message in dialect.sse_error(message, code=code).decode()


# --- OpenAI chat completions ---------------------------------------------------------------


def test_chat_request_merges_system_turns_and_drops_stream_flags() -> None:
    body = {
        "model": "gpt-agent",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "Late rule."},
        ],
        "max_completion_tokens": 64,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.5,
    }
    chat = dialect_for(APIType.OPENAI_CHAT).to_chat(body, path="/v1/chat/completions", served_model=SERVED)
    assert chat == {
        "model": SERVED,
        "messages": [
            {"role": "system", "content": "You are terse.\n\nUse tools.\n\nLate rule."},
            {"role": "user", "content": "hi"},
        ],
        "max_completion_tokens": 64,
        "max_tokens": 64,
        "temperature": 0.5,
    }
    assert body["messages"][1]["role"] == "developer"  # the agent's body is left as sent


def test_chat_request_without_messages_is_a_dialect_error() -> None:
    with pytest.raises(DialectError, match="messages"):
        dialect_for(APIType.OPENAI_CHAT).to_chat({"model": "m"}, path="/v1/chat/completions", served_model=SERVED)


def test_chat_reply_hides_engine_token_fields() -> None:
    reply = dialect_for(APIType.OPENAI_CHAT).from_chat(
        engine_answer("Hi."), request={"model": "gpt-agent"}, path="/v1/chat/completions"
    )
    text = json.dumps(reply)
    for engine_only in ("prompt_token_ids", "token_ids", "kv_transfer_params", "token_id"):
        assert engine_only not in text
    assert reply["choices"][0]["logprobs"] is None
    parsed = ChatCompletion.model_validate(reply)
    assert parsed.model == "gpt-agent" and parsed.choices[0].message.content == "Hi."


def test_chat_reply_keeps_logprobs_the_agent_asked_for_without_token_ids() -> None:
    reply = dialect_for(APIType.OPENAI_CHAT).from_chat(
        engine_answer("Hi."), request={"model": "m", "logprobs": True}, path="/v1/chat/completions"
    )
    entries = reply["choices"][0]["logprobs"]["content"]
    assert [entry["logprob"] for entry in entries] == [-0.25, -0.5]
    assert all(set(entry) == {"token", "logprob", "bytes", "top_logprobs"} for entry in entries)
    ChatCompletion.model_validate(reply)


def test_chat_sdk_conversation_with_tool_results_reaches_the_engine_unchanged(stage: Stage, oai: openai.OpenAI) -> None:
    stage.answer = engine_answer(calls=WEATHER_CALLS, finish="tool_calls")
    messages = [
        {"role": "developer", "content": "Answer with the weather."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    completion = oai.chat.completions.create(model="gpt-agent", messages=messages, tools=tools)  # type: ignore[arg-type]
    assert stage.chats[-1]["messages"] == [
        {"role": "system", "content": "Answer with the weather."},
        *messages[1:],
    ]
    assert stage.chats[-1]["tools"] == tools and stage.chats[-1]["model"] == SERVED
    calls = completion.choices[0].message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        (c["id"], c["name"], c["arguments"]) for c in WEATHER_CALLS
    ]
    assert completion.choices[0].finish_reason == "tool_calls"


def test_chat_stream_reassembles_the_same_answer(stage: Stage, oai: openai.OpenAI) -> None:
    stage.answer = engine_answer("Checking.", reasoning="Two cities.", calls=WEATHER_CALLS, finish="tool_calls")
    with oai.chat.completions.stream(
        model="gpt-agent", messages=[{"role": "user", "content": "weather?"}], stream_options={"include_usage": True}
    ) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Checking."
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        (c["id"], c["name"], c["arguments"]) for c in WEATHER_CALLS
    ]
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage is not None and final.usage.total_tokens == 42
    assert stage.frames[-1] == b"data: [DONE]\n\n"
    assert "prompt_token_ids" not in b"".join(stage.frames).decode()


def test_chat_stream_without_include_usage_has_one_chunk(stage: Stage, oai: openai.OpenAI) -> None:
    stage.answer = engine_answer("Hi there.")
    chunks = list(oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert len(chunks) == 1
    assert chunks[0].choices[0].delta.content == "Hi there." and chunks[0].choices[0].finish_reason == "stop"


def test_chat_sse_without_the_request_carries_usage_on_its_one_chunk() -> None:
    dialect = dialect_for(APIType.OPENAI_CHAT)
    reply = dialect.from_chat(engine_answer("Hi."), request={"model": "m"}, path="/v1/chat/completions")
    frames = list(dialect.sse(reply))
    assert len(frames) == 2 and frames[-1] == b"data: [DONE]\n\n"
    chunk = ChatCompletionChunk.model_validate(sse_events(frames)[0])
    assert chunk.usage is not None and chunk.usage.total_tokens == 42
    assert chunk.choices[0].delta.content == "Hi."


def test_chat_error_body_is_raised_by_the_sdk(stage: Stage, oai: openai.OpenAI) -> None:
    stage.fail = 429
    with pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.message.endswith("engine failed with 429")
    assert caught.value.type == "rate_limit_error"


def test_chat_stream_error_event_is_raised_by_the_sdk(stage: Stage, oai: openai.OpenAI) -> None:
    stage.fail, stage.fail_mid_stream = 502, True
    with pytest.raises(openai.APIError, match="the engine went away"):
        list(oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))


# --- OpenAI Responses ------------------------------------------------------------------------


RESPONSES_TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": False},
    {"type": "web_search"},
]


def test_responses_sdk_input_items_fold_into_chat_turns(stage: Stage, oai: openai.OpenAI) -> None:
    stage.answer = engine_answer("Done.")
    oai.responses.create(
        model="gpt-agent",
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "Need two calls."}],
            },
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [
                    {"type": "input_text", "text": "9C"},
                    {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "low"},
                ],
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris 18C."}]},
            {"role": "user", "content": "Thanks"},
        ],
        tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
        tool_choice="auto",
        max_output_tokens=200,
        reasoning={"effort": "low"},
        stream=False,
    )
    chat = stage.chats[-1]
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}][0]["text"]},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need two calls.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "tool", "tool_call_id": "c2", "content": "9C"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low"}}],
        },
        {"role": "assistant", "content": "Paris 18C."},
        {"role": "user", "content": "Thanks"},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": False}}
    ]
    assert chat["tool_choice"] == "auto" and chat["max_tokens"] == 200 and chat["reasoning_effort"] == "low"
    assert "stream" not in chat and chat["model"] == SERVED


def test_responses_reply_parses_and_its_reasoning_round_trips_exactly(stage: Stage, oai: openai.OpenAI) -> None:
    reasoning = "Paris first,\n  then Oslo."
    stage.answer = engine_answer("Checking.", reasoning=reasoning, calls=WEATHER_CALLS, finish="tool_calls")
    response = oai.responses.create(
        model="gpt-agent",
        input="Weather?",
        tools=RESPONSES_TOOLS,
        include=["reasoning.encrypted_content"],  # type: ignore[arg-type]
    )
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call", "function_call"]
    assert response.output_text == "Checking." and response.status == "completed"
    assert response.usage is not None and response.usage.total_tokens == 42
    # The agent sends its output back with the tool results: the engine sees its own turn again.
    follow_up = [
        {"role": "user", "content": "Weather?"},
        *[item.model_dump(exclude_none=True) for item in response.output],
    ]
    follow_up += [{"type": "function_call_output", "call_id": c["id"], "output": "ok"} for c in WEATHER_CALLS]
    oai.responses.create(model="gpt-agent", input=follow_up, tools=RESPONSES_TOOLS)  # type: ignore[arg-type]
    assistant = stage.chats[-1]["messages"][1]
    assert assistant == {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": reasoning,
        "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in WEATHER_CALLS
        ],
    }


def test_responses_length_finish_is_an_incomplete_response() -> None:
    reply = dialect_for(APIType.OPENAI_RESPONSES).from_chat(
        engine_answer("Cut", finish="length"), request={"model": "m", "input": "x"}, path="/v1/responses"
    )
    parsed = OpenAIResponse.model_validate(reply)
    assert parsed.status == "incomplete" and parsed.incomplete_details is not None
    assert parsed.incomplete_details.reason == "max_output_tokens"


def test_responses_stream_reassembles_the_same_answer(stage: Stage, oai: openai.OpenAI) -> None:
    stage.answer = engine_answer("Checking.", reasoning="Two cities.", calls=WEATHER_CALLS, finish="tool_calls")
    with oai.responses.stream(
        model="gpt-agent",
        input="Weather?",
        tools=RESPONSES_TOOLS,
        reasoning={"summary": "auto"},  # type: ignore[arg-type]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.reasoning_summary_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    assert final.output_text == "Checking."
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        (c["id"], c["name"], c["arguments"]) for c in WEATHER_CALLS
    ]
    numbers = [event["sequence_number"] for event in sse_events(stage.frames)]
    assert numbers == list(range(len(numbers)))


def test_responses_custom_and_local_shell_tools_round_trip(stage: Stage, oai: openai.OpenAI) -> None:
    tools = [{"type": "custom", "name": "apply_patch", "description": "Patch files."}, {"type": "local_shell"}]
    stage.answer = engine_answer(
        calls=[
            {"id": "t1", "name": "apply_patch", "arguments": '{"input": "*** Begin Patch"}'},
            {"id": "t2", "name": "shell", "arguments": '{"command": ["ls", "-a"], "workdir": "/w"}'},
        ],
        finish="tool_calls",
    )
    response = oai.responses.create(model="codex", input="fix it", tools=tools)  # type: ignore[arg-type]
    assert [tool["function"]["name"] for tool in stage.chats[-1]["tools"]] == ["apply_patch", "shell"]
    patch, shell = response.output
    assert patch.type == "custom_tool_call" and patch.input == "*** Begin Patch"
    assert shell.type == "local_shell_call" and shell.action.command == ["ls", "-a"]
    assert shell.action.working_directory == "/w"
    follow_up: List[Any] = [
        {"role": "user", "content": "fix it"},
        *[i.model_dump(exclude_none=True) for i in response.output],
    ]
    follow_up += [
        {"type": "custom_tool_call_output", "call_id": "t1", "output": "patched"},
        {"type": "local_shell_call_output", "id": "t2", "output": "a b"},
    ]
    oai.responses.create(model="codex", input=follow_up, tools=tools)  # type: ignore[arg-type]
    assert stage.chats[-1]["messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": '{"input": "*** Begin Patch"}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command": ["ls", "-a"], "workdir": "/w"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "patched"},
        {"role": "tool", "tool_call_id": "t2", "content": "a b"},
    ]


def test_responses_previous_response_id_is_refused_in_the_dialect(stage: Stage, oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="previous_response_id is not supported"):
        oai.responses.create(model="m", input="more", previous_response_id="resp_1")
    assert stage.chats == []


def test_responses_stream_error_event_reaches_the_sdk(stage: Stage, oai: openai.OpenAI) -> None:
    stage.fail, stage.fail_mid_stream = 502, True
    with oai.responses.stream(model="m", input="hi") as stream:
        events = list(stream)
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()
    assert [event.type for event in events] == ["response.created", "error", "response.failed"]
    assert events[1].message == "the engine went away" and events[1].code == "server_error"
    assert events[2].response.error is not None and events[2].response.error.message == "the engine went away"


# --- Anthropic Messages ------------------------------------------------------------------------


ANTHROPIC_TOOLS: List[Any] = [
    {"name": "get_weather", "description": "Weather of a city.", "input_schema": WEATHER_SCHEMA},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
]


def test_anthropic_sdk_conversation_translates_to_chat(stage: Stage, claude: anthropic.Anthropic) -> None:
    stage.answer = engine_answer("Done.")
    claude.messages.create(
        model="claude-agent",
        max_tokens=300,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0; cch=abc\nYou are Claude Code."},
            {"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Two calls.", "signature": "sg_oe_x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "is_error": True,
                        "content": [
                            {"type": "text", "text": "no station"},
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                        ],
                    },
                    {"type": "text", "text": "Summarise."},
                ],
            },
        ],
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 1024},
        stop_sequences=["END"],
    )
    chat = stage.chats[-1]
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\n\nBe terse."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two calls.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "[Tool Error] no station"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                {"type": "text", "text": "Summarise."},
            ],
        },
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": WEATHER_SCHEMA},
        }
    ]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["chat_template_kwargs"] == {"enable_thinking": True}
    assert chat["stop"] == ["END"] and chat["max_tokens"] == 300 and chat["model"] == SERVED


def test_anthropic_max_tokens_defaults_and_named_tool_choice() -> None:
    body = {
        "model": "c",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": ANTHROPIC_TOOLS[:1],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    chat = dialect_for(APIType.ANTHROPIC).to_chat(body, path="/v1/messages", served_model=SERVED)
    assert chat["max_tokens"] == 4096
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_anthropic_reply_is_a_message_with_thinking_text_and_tool_use(
    stage: Stage, claude: anthropic.Anthropic
) -> None:
    stage.answer = engine_answer("Checking.", reasoning="Two cities.", calls=WEATHER_CALLS, finish="tool_calls")
    message = claude.messages.create(
        model="claude-agent", max_tokens=100, messages=[{"role": "user", "content": "weather?"}], tools=ANTHROPIC_TOOLS
    )
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    thinking, text, first, second = message.content
    assert thinking.thinking == "Two cities." and thinking.signature.startswith("sg_oe_")  # type: ignore[union-attr]
    assert text.text == "Checking."  # type: ignore[union-attr]
    assert (first.id, first.name, first.input) == ("chatcmpl-tool-aaa", "get_weather", {"city": "Paris"})  # type: ignore[union-attr]
    assert second.input == {"city": "Oslo"}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use" and message.model == "claude-agent"
    assert message.usage.input_tokens == 30 and message.usage.output_tokens == 12


@pytest.mark.parametrize(
    ("finish", "calls", "stop_reason", "expected"),
    [
        ("stop", [], None, "end_turn"),
        ("length", [], None, "max_tokens"),
        ("tool_calls", WEATHER_CALLS[:1], None, "tool_use"),
        ("stop", WEATHER_CALLS[:1], None, "tool_use"),
        ("content_filter", [], None, "refusal"),
        ("stop", [], "END", "stop_sequence"),
        ("stop", [], 151645, "end_turn"),
    ],
)
def test_anthropic_stop_reasons(finish: str, calls: List[Dict[str, str]], stop_reason: Any, expected: str) -> None:
    chat = engine_answer("x", calls=calls, finish=finish, stop_reason=stop_reason)
    request = {"model": "c", "stop_sequences": ["END"]}
    reply = dialect_for(APIType.ANTHROPIC).from_chat(chat, request=request, path="/v1/messages")
    message = anthropic.types.Message.model_validate(reply)
    assert message.stop_reason == expected
    assert message.stop_sequence == ("END" if expected == "stop_sequence" else None)


def test_anthropic_stream_reassembles_the_same_message(stage: Stage, claude: anthropic.Anthropic) -> None:
    stage.answer = engine_answer("Checking.", reasoning="Two cities.", calls=WEATHER_CALLS, finish="tool_calls")
    request: Dict[str, Any] = {
        "model": "claude-agent",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "w?"}],
    }
    with claude.messages.stream(**request, tools=ANTHROPIC_TOOLS) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    whole = claude.messages.create(**request, tools=ANTHROPIC_TOOLS)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    assert streamed.stop_reason == "tool_use" and streamed.usage.output_tokens == 12
    assert streamed.usage.input_tokens == 30


def test_anthropic_errors_are_raised_by_the_sdk(stage: Stage, claude: anthropic.Anthropic) -> None:
    stage.fail = 401
    with pytest.raises(anthropic.AuthenticationError) as caught:
        claude.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "engine failed with 401"},
    }


def test_anthropic_dialect_error_is_a_400_in_the_dialect(stage: Stage, claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="not supported"):
        claude.messages.create(
            model="c",
            max_tokens=5,
            messages=[{"role": "user", "content": [{"type": "document", "source": {"type": "file", "file_id": "f"}}]}],
        )


def test_anthropic_stream_error_event_is_raised_by_the_sdk(stage: Stage, claude: anthropic.Anthropic) -> None:
    stage.fail, stage.fail_mid_stream = 502, True
    with pytest.raises(anthropic.APIStatusError, match="the engine went away"):
        with claude.messages.stream(model="c", max_tokens=5, messages=[{"role": "user", "content": "hi"}]) as stream:
            stream.get_final_message()


def test_anthropic_count_tokens_is_answered_without_the_engine(stage: Stage, claude: anthropic.Anthropic) -> None:
    counted = claude.messages.count_tokens(model="c", messages=[{"role": "user", "content": "x" * 400}])
    assert counted.input_tokens >= 100 and stage.chats == []


# --- Google generateContent ------------------------------------------------------------------


def weather_declaration() -> gtypes.Tool:
    schema = gtypes.Schema(type="OBJECT", properties={"city": gtypes.Schema(type="STRING")}, required=["city"])
    return gtypes.Tool(function_declarations=[gtypes.FunctionDeclaration(name="get_weather", parameters=schema)])


def test_google_sdk_conversation_matches_responses_to_calls_by_name_and_order(
    stage: Stage, gemini: genai.Client
) -> None:
    stage.answer = engine_answer("Done.")
    contents = [
        gtypes.Content(role="user", parts=[gtypes.Part(text="Weather in Paris and Oslo?")]),
        gtypes.Content(
            role="model",
            parts=[
                gtypes.Part(text="Two calls.", thought=True),
                gtypes.Part(function_call=gtypes.FunctionCall(name="get_weather", args={"city": "Paris"})),
                gtypes.Part(function_call=gtypes.FunctionCall(name="get_weather", args={"city": "Oslo"})),
            ],
        ),
        gtypes.Content(
            role="user",
            parts=[
                gtypes.Part(function_response=gtypes.FunctionResponse(name="get_weather", response={"output": "18C"})),
                gtypes.Part(function_response=gtypes.FunctionResponse(name="get_weather", response={"output": "9C"})),
                gtypes.Part(inline_data=gtypes.Blob(mime_type="image/png", data=base64.b64decode(PNG))),
            ],
        ),
    ]
    config = gtypes.GenerateContentConfig(
        system_instruction="Be brief.",
        tools=[weather_declaration(), gtypes.Tool(google_search=gtypes.GoogleSearch())],
        tool_config=gtypes.ToolConfig(
            function_calling_config=gtypes.FunctionCallingConfig(mode="ANY", allowed_function_names=["get_weather"])
        ),
        max_output_tokens=256,
        temperature=0.7,
        stop_sequences=["END"],
        thinking_config=gtypes.ThinkingConfig(include_thoughts=True),
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True),
    )
    gemini.models.generate_content(model="gemini-agent", contents=contents, config=config)
    assert stage.paths[-1].endswith("/models/gemini-agent:generateContent")
    chat = stage.chats[-1]
    system, user, assistant, paris, oslo, image = chat["messages"]
    assert system == {"role": "system", "content": "Be brief."}
    assert user == {"role": "user", "content": "Weather in Paris and Oslo?"}
    ids = [call["id"] for call in assistant["tool_calls"]]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    assert assistant == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Two calls.",
        "tool_calls": [
            {"id": ids[0], "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": ids[1], "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        ],
    }
    assert paris == {"role": "tool", "tool_call_id": ids[0], "content": '{"output":"18C"}'}
    assert oslo == {"role": "tool", "tool_call_id": ids[1], "content": '{"output":"9C"}'}
    assert image == {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}],
    }
    assert chat["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["max_tokens"] == 256 and chat["temperature"] == 0.7 and chat["stop"] == ["END"]
    assert chat["chat_template_kwargs"] == {"enable_thinking": True} and chat["model"] == SERVED
    # The same history sent again gets the same ids: they may be part of the prompt the engine renders.
    gemini.models.generate_content(model="gemini-agent", contents=contents, config=config)
    assert [call["id"] for call in stage.chats[-1]["messages"][2]["tool_calls"]] == ids


def test_google_reply_gives_calls_real_ids_that_come_back(stage: Stage, gemini: genai.Client) -> None:
    stage.answer = engine_answer("Checking.", reasoning="Two cities.", calls=WEATHER_CALLS, finish="tool_calls")
    config = gtypes.GenerateContentConfig(
        tools=[weather_declaration()], automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True)
    )
    response = gemini.models.generate_content(model="gemini-agent", contents="Weather?", config=config)
    calls = response.function_calls or []
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("chatcmpl-tool-aaa", "get_weather", {"city": "Paris"}),
        ("chatcmpl-tool-bbb", "get_weather", {"city": "Oslo"}),
    ]
    assert response.text == "Checking."
    candidate = (response.candidates or [])[0]
    assert candidate.finish_reason == gtypes.FinishReason.STOP
    assert candidate.content is not None and candidate.content.parts is not None
    assert candidate.content.parts[0].thought is True and candidate.content.parts[0].thought_signature
    assert response.usage_metadata is not None and response.usage_metadata.total_token_count == 42
    # Gemini CLI answers with the call ids: the Oslo result reaches the Oslo call even out of order.
    history = [
        gtypes.Content(role="user", parts=[gtypes.Part(text="Weather?")]),
        candidate.content,
        gtypes.Content(
            role="user",
            parts=[
                gtypes.Part(
                    function_response=gtypes.FunctionResponse(id=c.id, name=c.name, response={"output": c.args["city"]})  # type: ignore[index]
                )
                for c in reversed(calls)
            ],
        ),
    ]
    gemini.models.generate_content(model="gemini-agent", contents=history, config=config)
    tool_messages = [m for m in stage.chats[-1]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages] == [
        ("chatcmpl-tool-bbb", '{"output":"Oslo"}'),
        ("chatcmpl-tool-aaa", '{"output":"Paris"}'),
    ]


def test_google_response_without_a_matching_call_is_refused(stage: Stage, gemini: genai.Client) -> None:
    contents = [
        gtypes.Content(role="user", parts=[gtypes.Part(text="hi")]),
        gtypes.Content(
            role="user", parts=[gtypes.Part(function_response=gtypes.FunctionResponse(name="ghost", response={}))]
        ),
    ]
    with pytest.raises(genai_errors.ClientError) as caught:
        gemini.models.generate_content(model="gemini-agent", contents=contents)
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    assert "answers no functionCall" in (caught.value.message or "")


def test_google_stream_puts_thoughts_in_their_own_frame(stage: Stage, gemini: genai.Client) -> None:
    stage.answer = engine_answer("Checking.", reasoning="Two cities.", calls=WEATHER_CALLS, finish="tool_calls")
    config = gtypes.GenerateContentConfig(
        tools=[weather_declaration()], automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True)
    )
    chunks = list(gemini.models.generate_content_stream(model="gemini-agent", contents="Weather?", config=config))
    assert stage.paths[-1].endswith("/models/gemini-agent:streamGenerateContent?alt=sse")
    first_parts = [((c.candidates or [])[0].content.parts or []) for c in chunks]  # type: ignore[union-attr]
    assert [[bool(p.thought) for p in parts] for parts in first_parts] == [[True], [False, False, False]]
    assert "".join(c.text or "" for c in chunks) == "Checking."
    calls = [call for c in chunks for call in c.function_calls or []]
    assert [(c.id, c.args) for c in calls] == [
        ("chatcmpl-tool-aaa", {"city": "Paris"}),
        ("chatcmpl-tool-bbb", {"city": "Oslo"}),
    ]
    assert chunks[-1].usage_metadata is not None and chunks[-1].usage_metadata.total_token_count == 42


def test_google_length_finish_is_max_tokens() -> None:
    reply = dialect_for(APIType.GOOGLE).from_chat(
        engine_answer("Cut", finish="length"), request={}, path="/v1beta/models/g:generateContent"
    )
    parsed = gtypes.GenerateContentResponse.model_validate(reply)
    assert (parsed.candidates or [])[0].finish_reason == gtypes.FinishReason.MAX_TOKENS
    assert parsed.model_version == "g"


def test_google_errors_are_raised_by_the_sdk(stage: Stage, gemini: genai.Client) -> None:
    stage.fail = 503
    with pytest.raises(genai_errors.ServerError) as caught:
        gemini.models.generate_content(model="gemini-agent", contents="hi")
    assert caught.value.code == 503 and caught.value.status == "UNAVAILABLE"
    assert caught.value.message == "engine failed with 503"


def test_google_stream_error_frame_is_raised_by_the_sdk(stage: Stage, gemini: genai.Client) -> None:
    stage.fail, stage.fail_mid_stream = 502, True
    with pytest.raises(genai_errors.APIError, match="the engine went away"):
        list(gemini.models.generate_content_stream(model="gemini-agent", contents="hi"))


def test_google_count_tokens_is_answered_without_the_engine(stage: Stage, gemini: genai.Client) -> None:
    counted = gemini.models.count_tokens(model="gemini-agent", contents="x" * 400)
    assert counted.total_tokens is not None and counted.total_tokens >= 100
    assert stage.chats == [] and stage.paths[-1].endswith(":countTokens")


def test_google_openapi_schemas_become_json_schema() -> None:
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": [
            {
                "function_declarations": [
                    {
                        "name": "f",
                        "parameters": {
                            "type": "OBJECT",
                            "properties": {
                                "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
                                "note": {"type": "STRING", "nullable": True},
                            },
                            "propertyOrdering": ["tags", "note"],
                        },
                    }
                ]
            }
        ],
        "generation_config": {"max_output_tokens": 9, "response_mime_type": "application/json"},
    }
    chat = dialect_for(APIType.GOOGLE).to_chat(body, path="/v1beta/models/g:generateContent", served_model="")
    assert chat["model"] == "g" and chat["max_tokens"] == 9
    assert chat["response_format"] == {"type": "json_object"}
    assert chat["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}, "note": {"type": ["string", "null"]}},
    }


# --- token counts -----------------------------------------------------------------------------


def test_count_tokens_reply_shapes_and_routes() -> None:
    body = {"messages": [{"role": "user", "content": "a" * 40}]}
    assert count_tokens_reply(APIType.ANTHROPIC, body) == {"input_tokens": 11}  # 44 characters of text
    google = count_tokens_reply(APIType.GOOGLE, {"contents": [{"parts": [{"text": "a" * 8}]}]})
    assert google == {
        "totalTokens": 2,
        "totalBillableCharacters": 8,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 2}],
    }
    assert count_tokens_reply(APIType.ANTHROPIC, {}) == {"input_tokens": 1}
    assert count_tokens_reply(APIType.OPENAI_CHAT, body) is None
    assert count_tokens_reply(APIType.ANTHROPIC, body, path="/v1/messages") is None
    assert is_count_tokens_path("/v1/messages/count_tokens") and is_count_tokens_path("/v1beta/models/g:countTokens")
