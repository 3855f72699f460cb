"""LLM clients (spec §6.5), driven against a real scripted OpenAI/Anthropic-style server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from dataclasses import dataclass
from typing import Any, Deque, Dict, Iterator, List, Optional

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.llm_client import (
    AnthropicClient,
    LLMClient,
    LLMError,
    LLMResponse,
    OpenAIClient,
    ToolCall,
    clean_schema,
    create_llm_client,
    to_anthropic_messages,
)
from openenv.core.rubrics import LLMJudge


@dataclass
class Scripted:
    """A raw answer: ``body`` (JSON unless ``text``) with ``status``, after ``delay_s``."""

    body: Any = None
    status: int = 200
    delay_s: float = 0.0
    text: Optional[str] = None


class FakeLLM:
    """A scripted LLM server: each request is answered with the next queued reply.

    A ``str`` reply is the assistant's text, a ``dict`` is the whole OpenAI ``message`` (or, on
    ``/v1/messages``, a ``list`` is Anthropic's content blocks), a :class:`Scripted` is sent as is.
    Every request is recorded as ``(path, headers, body)``.
    """

    def __init__(self) -> None:
        self.replies: Deque[Any] = collections.deque()
        self.requests: List[Dict[str, Any]] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._chat)
        self.app.post("/v1/messages")(self._messages)
        self.base_url = ""

    def script(self, *replies: Any) -> None:
        self.replies.extend(replies)

    @property
    def last_body(self) -> Dict[str, Any]:
        return self.requests[-1]["body"]

    async def _next(self, request: Request) -> Any:
        self.requests.append({"path": request.url.path, "headers": dict(request.headers), "body": await request.json()})
        if not self.replies:
            return Scripted(body={"error": "no reply scripted"}, status=500)
        return self.replies.popleft()

    async def _raw(self, reply: Scripted) -> Response:
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.text is not None:
            return PlainTextResponse(reply.text, status_code=reply.status)
        return JSONResponse(reply.body, status_code=reply.status)

    async def _chat(self, request: Request) -> Response:
        reply = await self._next(request)
        if isinstance(reply, Scripted):
            return await self._raw(reply)
        message = reply if isinstance(reply, dict) else {"role": "assistant", "content": reply}
        return JSONResponse(
            {"id": "cmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}
        )

    async def _messages(self, request: Request) -> Response:
        reply = await self._next(request)
        if isinstance(reply, Scripted):
            return await self._raw(reply)
        content = reply if isinstance(reply, list) else [{"type": "text", "text": reply}]
        return JSONResponse({"id": "msg_1", "type": "message", "role": "assistant", "content": content})


@contextlib.contextmanager
def fake_llm_server() -> Iterator[FakeLLM]:
    fake = FakeLLM()
    with BackgroundServer(fake.app) as server:
        fake.base_url = server.base_url
        yield fake


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with fake_llm_server() as fake:
        yield fake


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- endpoint URLs ---------------------------------------------------------------------------------


def test_base_url_appends_the_port_and_drops_a_trailing_slash() -> None:
    assert OpenAIClient("http://127.0.0.1/", 8000, "m").base_url == "http://127.0.0.1:8000"
    assert OpenAIClient("https://host.example:8443/v1/", None, "m").base_url == "https://host.example:8443/v1"
    assert OpenAIClient("http://host:9000", 9000, "m").base_url == "http://host:9000"


@pytest.mark.parametrize(
    ("endpoint", "port", "complaint"),
    [
        ("ftp://host", None, "http(s) URL"),
        ("host:8000", None, "http(s) URL"),
        ("http://", 80, "no host"),
        ("http://user:secret@host", None, "credentials"),
        ("http://host/v1?key=1", None, "query or fragment"),
        ("http://host", 70000, "1-65535"),
        ("http://host:8000", 9000, "port 8000 but port=9000"),
    ],
)
def test_bad_endpoints_are_rejected_with_the_reason_when_a_request_needs_them(
    endpoint: str, port: Optional[int], complaint: str
) -> None:
    client = OpenAIClient(endpoint, port, "m")  # construction accepts it (upstream's test doubles do this)
    with pytest.raises(ValueError, match=complaint.replace("(", r"\(").replace(")", r"\)")):
        asyncio.run(client.complete("hi"))


def test_a_test_double_with_a_placeholder_endpoint_is_built_and_answers() -> None:
    class Canned(LLMClient):
        async def complete(self, prompt: str, **kwargs: Any) -> str:
            return "0.75"

    judge = LLMJudge("Rate {action}", Canned("http://mock", 0))
    assert asyncio.run(judge("an answer", None)) == 0.75


def test_api_url_adds_v1_only_when_the_endpoint_has_no_path() -> None:
    assert OpenAIClient("http://h", 1, "m").api_url == "http://h:1/v1"
    assert OpenAIClient("http://h:1/openai/v1", None, "m").api_url == "http://h:1/openai/v1"


def test_llm_client_is_abstract_and_tools_are_optional() -> None:
    with pytest.raises(TypeError):
        LLMClient("http://h", 1)  # type: ignore[abstract]

    class TextOnly(LLMClient):
        async def complete(self, prompt: str, **kwargs: Any) -> str:
            return prompt

    with pytest.raises(NotImplementedError, match="TextOnly does not support tool calls"):
        asyncio.run(TextOnly("http://h", 1).complete_with_tools([], []))


# --- OpenAI-compatible ------------------------------------------------------------------------------


async def test_openai_complete_sends_a_chat_request_and_returns_the_text(llm: FakeLLM) -> None:
    llm.script("The answer is 4.")
    client = OpenAIClient(llm.base_url, None, "judge-7b", api_key="k3y", system_prompt="Be terse.", max_tokens=32)
    assert await client.complete("2+2?") == "The answer is 4."
    request = llm.requests[-1]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer k3y"
    assert request["body"] == {
        "model": "judge-7b",
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
        "max_tokens": 32,
        "temperature": 0.0,
    }


async def test_openai_without_api_key_sends_a_placeholder_and_kwargs_override(llm: FakeLLM) -> None:
    llm.script("ok")
    await OpenAIClient(llm.base_url, None, "m").complete("hi", max_tokens=5, temperature=0.7, top_p=0.9)
    assert llm.requests[-1]["headers"]["authorization"] == "Bearer not-needed"
    assert llm.last_body["messages"] == [{"role": "user", "content": "hi"}]
    assert (llm.last_body["max_tokens"], llm.last_body["temperature"], llm.last_body["top_p"]) == (5, 0.7, 0.9)


async def test_max_completion_tokens_mode_omits_temperature(llm: FakeLLM) -> None:
    llm.script("ok")
    await OpenAIClient(llm.base_url, None, "o3-mini", max_tokens=64, use_max_completion_tokens=True).complete("hi")
    assert llm.last_body["max_completion_tokens"] == 64
    assert "max_tokens" not in llm.last_body and "temperature" not in llm.last_body


async def test_openai_content_given_as_parts_is_joined(llm: FakeLLM) -> None:
    llm.script({"role": "assistant", "content": [{"type": "text", "text": "Score: "}, {"type": "text", "text": "9"}]})
    assert await OpenAIClient(llm.base_url, None, "m").complete("x") == "Score: 9"


async def test_openai_tools_are_sent_as_functions_and_tool_calls_parsed(llm: FakeLLM) -> None:
    llm.script(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        }
    )
    tools = [{"name": "add", "description": "Add.", "inputSchema": {"properties": {"a": {"type": "integer"}}}}]
    messages = [{"role": "user", "content": "add 1 and 2"}]
    response = await OpenAIClient(llm.base_url, None, "m").complete_with_tools(messages, tools)
    assert response == LLMResponse(content=None, tool_calls=[ToolCall(id="call_1", name="add", args={"a": 1, "b": 2})])
    assert llm.last_body["messages"] == messages
    assert llm.last_body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add.",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
            },
        }
    ]


async def test_tool_call_arguments_that_are_not_json_raise(llm: FakeLLM) -> None:
    llm.script({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "add", "arguments": "{a: 1"}}]})
    with pytest.raises(LLMError, match="'add' has arguments that are not JSON"):
        await OpenAIClient(llm.base_url, None, "m").complete_with_tools([{"role": "user", "content": "x"}], [])


async def test_http_errors_carry_the_status_and_body(llm: FakeLLM) -> None:
    llm.script(Scripted(body={"error": {"message": "model 'm' not found"}}, status=404))
    with pytest.raises(LLMError, match=r"HTTP 404: .*model 'm' not found"):
        await OpenAIClient(llm.base_url, None, "m").complete("x")


async def test_a_reply_that_is_not_json_raises(llm: FakeLLM) -> None:
    llm.script(Scripted(text="<html>gateway</html>"))
    with pytest.raises(LLMError, match="not JSON"):
        await OpenAIClient(llm.base_url, None, "m").complete("x")


async def test_a_reply_without_choices_raises(llm: FakeLLM) -> None:
    llm.script(Scripted(body={"choices": []}))
    with pytest.raises(LLMError, match=r"no choices\[0\].message"):
        await OpenAIClient(llm.base_url, None, "m").complete("x")


async def test_a_slow_endpoint_times_out(llm: FakeLLM) -> None:
    llm.script(Scripted(body={}, delay_s=2.0))
    with pytest.raises(LLMError, match=r"did not answer within 0\.2 s"):
        await OpenAIClient(llm.base_url, None, "m", timeout_s=0.2).complete("x")


async def test_an_unreachable_endpoint_raises() -> None:
    with pytest.raises(LLMError, match=r"cannot reach http://127\.0\.0\.1"):
        await OpenAIClient("http://127.0.0.1", closed_port(), "m", timeout_s=5).complete("x")


# --- Anthropic-style --------------------------------------------------------------------------------


async def test_anthropic_complete_uses_the_messages_api(llm: FakeLLM) -> None:
    llm.script([{"type": "text", "text": "Score: "}, {"type": "text", "text": "0.5"}])
    client = AnthropicClient(llm.base_url, None, model="claude-x", api_key="sk-a", system_prompt="Judge.")
    assert await client.complete("rate this") == "Score: 0.5"
    request = llm.requests[-1]
    assert request["path"] == "/v1/messages"
    assert (request["headers"]["x-api-key"], request["headers"]["anthropic-version"]) == ("sk-a", "2023-06-01")
    assert request["body"] == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": "rate this"}],
        "max_tokens": 256,
        "temperature": 0.0,
        "system": "Judge.",
    }


async def test_anthropic_tools_convert_the_conversation_and_parse_tool_use(llm: FakeLLM) -> None:
    llm.script(
        [
            {"type": "text", "text": "Adding again."},
            {"type": "tool_use", "id": "tu_2", "name": "add", "input": {"a": 3, "b": 4}},
        ]
    )
    conversation = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "add 1 2, then 3 4"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "tu_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "tu_1", "content": "3"},
    ]
    tools = [{"name": "add", "description": "Add.", "input_schema": {"type": "object", "properties": {}}}]
    response = await AnthropicClient(llm.base_url, None, model="c").complete_with_tools(conversation, tools)
    assert response.content == "Adding again."
    assert response.tool_calls == [ToolCall(id="tu_2", name="add", args={"a": 3, "b": 4})]
    body = llm.last_body
    assert body["system"] == "Use tools."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "add 1 2, then 3 4"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "tu_1", "name": "add", "input": {"a": 1, "b": 2}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "3"}]},
    ]
    assert body["tools"] == [
        {"name": "add", "description": "Add.", "input_schema": {"type": "object", "properties": {}}}
    ]


def test_consecutive_tool_results_and_user_text_merge_into_one_user_turn() -> None:
    system, messages = to_anthropic_messages(
        [
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "tool", "tool_call_id": "b", "content": {"ok": True}},
            {"role": "user", "content": "and now?"},
        ]
    )
    assert system is None
    assert messages == [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                {"type": "tool_result", "tool_use_id": "b", "content": '{"ok": true}'},
                {"type": "text", "text": "and now?"},
            ],
        }
    ]


# --- shared pieces ----------------------------------------------------------------------------------


def test_llm_response_becomes_an_openai_assistant_message() -> None:
    response = LLMResponse(content="thinking", tool_calls=[ToolCall(id="c1", name="add", args={"a": 1})])
    assert response.to_message_dict() == {
        "role": "assistant",
        "content": "thinking",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}],
    }
    assert LLMResponse(content="hi").to_message_dict() == {"role": "assistant", "content": "hi"}


def test_clean_schema_picks_the_object_option_and_merges_all_of() -> None:
    assert clean_schema(None) == {"type": "object", "properties": {}}
    any_of = {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"q": {"type": "string"}}}]}
    assert clean_schema(any_of) == {"type": "object", "properties": {"q": {"type": "string"}}}
    all_of = {
        "allOf": [
            {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer"}}, "required": ["a", "b"]},
        ]
    }
    assert clean_schema(all_of) == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }


def test_create_llm_client_targets_the_hosted_apis() -> None:
    openai = create_llm_client("openai", "gpt-4o", "sk-1")
    assert isinstance(openai, OpenAIClient)
    assert (openai.api_url, openai.max_tokens, openai.use_max_completion_tokens) == (
        "https://api.openai.com:443/v1",
        4096,
        False,
    )
    for reasoning_model in ("o3-mini", "o1", "o4-mini", "gpt-5-mini"):
        assert create_llm_client("openai", reasoning_model, "k").use_max_completion_tokens is True
    anthropic = create_llm_client("anthropic", "claude-x", "sk-2", system_prompt="s", temperature=0.3)
    assert isinstance(anthropic, AnthropicClient)
    assert (anthropic.base_url, anthropic.system_prompt, anthropic.temperature) == (
        "https://api.anthropic.com:443",
        "s",
        0.3,
    )
    with pytest.raises(ValueError, match="unknown LLM provider 'mistral'"):
        create_llm_client("mistral", "m", "k")
