"""The tiny engine (openenv.testing.tiny_engine): a real model's own sampling behind vLLM's
OpenAI-compatible chat completions, over real HTTP.

One server (a child process, as tests of the capture proxy use it) serves the module; the model is
built once into the default cache (~/.cache/openenv/tiny-engine, or $OPENENV_TINY_ENGINE_CACHE) and
reused by later runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterator, List

import httpx
import pytest

from openenv.testing.tiny_engine import EngineServer, model_dir, parse_tool_calls

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="the tiny engine needs torch and transformers (pip install 'openenv[train]' transformers)",
)

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the workspace.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
ASK = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "What is in this repo?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[EngineServer]:
    with EngineServer(tool_name="bash") as served:  # builds the model first if the cache lacks it
        yield served


@pytest.fixture(scope="module")
def client(server: EngineServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as http:
        yield http


@pytest.fixture(scope="module")
def tokenizer(server: EngineServer) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(model_dir(tool_name="bash"))


def chat(client: httpx.Client, **body: Any) -> Dict[str, Any]:
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def stream(client: httpx.Client, **body: Any) -> List[Dict[str, Any]]:
    """The chunks of a streamed answer (each event one `data:` line, the last `data: [DONE]`)."""
    payloads = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line:
                assert line.startswith("data: ")
                payloads.append(line[len("data: ") :])
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def reassemble(chunks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One choice's answer put back together from its chunks, as an SDK does."""
    answer: Dict[str, Any] = {"content": "", "tool_calls": {}, "token_ids": [], "logprobs": [], "finish_reason": None}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            answer["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls", []):
                slot = answer["tool_calls"].setdefault(call["index"], {"name": "", "arguments": ""})
                slot["name"] += call["function"].get("name") or ""
                slot["arguments"] += call["function"].get("arguments") or ""
            answer["token_ids"] += choice.get("token_ids") or []
            answer["logprobs"] += (choice.get("logprobs") or {}).get("content") or []
            answer["finish_reason"] = choice["finish_reason"] or answer["finish_reason"]
    return answer


def test_health_and_models(client: httpx.Client, server: EngineServer) -> None:
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in models["data"]] == [(server.model, "model", 32768)]


def test_the_prompt_ids_are_the_chat_templates_own(client: httpx.Client, tokenizer: Any) -> None:
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "README.md\nsetup.py — ünïcode"},
        {"role": "user", "content": [{"type": "text", "text": "and now?"}]},
    ]
    reply = chat(client, messages=messages, tools=[BASH], return_token_ids=True, max_tokens=4)
    expected = tokenizer.apply_chat_template(messages, tools=[BASH], add_generation_prompt=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert reply["prompt_token_ids"] == expected
    assert reply["usage"]["prompt_tokens"] == len(expected)
    text = tokenizer.decode(expected)
    assert text.endswith("<|im_start|>assistant\n")
    assert '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>' in text
    assert "<tool_response>README.md\nsetup.py — ünïcode</tool_response>" in text
    # the template's markers are single tokens, not characters
    assert tokenizer.convert_ids_to_tokens(expected[:2]) == ["<|im_start|>", "s"]


def test_token_ids_decode_to_the_content_and_align_with_logprobs(client: httpx.Client, tokenizer: Any) -> None:
    reply = chat(client, messages=ASK, logprobs=True, top_logprobs=3, return_token_ids=True, seed=3, max_tokens=24)
    choice = reply["choices"][0]
    ids, content = choice["token_ids"], choice["logprobs"]["content"]
    assert ids and len(ids) == len(content) == reply["usage"]["completion_tokens"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    for token_id, entry in zip(ids, content, strict=True):
        assert entry["token"] == tokenizer.decode([token_id])
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] <= 0
        # vLLM's order: the sampled token first, then the likeliest others
        assert len(entry["top_logprobs"]) == 3 and entry["top_logprobs"][0]["token"] == entry["token"]
        assert all(t["logprob"] <= 0 for t in entry["top_logprobs"])
    as_ids = chat(
        client,
        messages=ASK,
        logprobs=True,
        return_token_ids=True,
        return_tokens_as_token_ids=True,
        seed=3,
        max_tokens=24,
    )
    assert [e["token"] for e in as_ids["choices"][0]["logprobs"]["content"]] == [f"token_id:{i}" for i in ids]


def test_greedy_sampling_takes_the_likeliest_token(client: httpx.Client) -> None:
    reply = chat(client, messages=ASK, tools=[BASH], temperature=0, logprobs=True, top_logprobs=5, max_tokens=30)
    for entry in reply["choices"][0]["logprobs"]["content"]:
        assert entry["logprob"] >= max(t["logprob"] for t in entry["top_logprobs"])


def test_a_seed_reproduces_the_answer(client: httpx.Client) -> None:
    body = {"messages": ASK, "temperature": 1.5, "ignore_eos": True, "max_tokens": 24, "return_token_ids": True}
    first = chat(client, **body, seed=11)["choices"][0]["token_ids"]
    assert chat(client, **body, seed=11)["choices"][0]["token_ids"] == first
    others = {tuple(chat(client, **body, seed=seed)["choices"][0]["token_ids"]) for seed in (12, 13, 14)}
    assert len(first) == 24 and others != {tuple(first)}


def test_a_declared_tool_is_called_and_parsed_like_vllms_hermes_parser(client: httpx.Client, tokenizer: Any) -> None:
    good = 0  # calls of the trained tool with its argument (at temperature 1 a name may come out misspelt)
    for seed in range(10):
        reply = chat(client, messages=ASK, tools=[BASH], seed=seed, return_token_ids=True, max_tokens=64)
        choice = reply["choices"][0]
        text = tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
        if not choice["message"].get("tool_calls"):
            assert choice["message"]["content"] == text and choice["finish_reason"] != "tool_calls"
            continue
        (call,) = choice["message"]["tool_calls"]
        assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
        assert choice["finish_reason"] == "tool_calls"
        assert text.startswith("<tool_call>") and choice["message"]["content"] is None
        arguments = json.loads(call["function"]["arguments"])
        good += call["function"]["name"] == "bash" and set(arguments) == {"command"}
    assert good >= 6, f"the model called its tool properly in {good} of 10 answers"
    without_tools = chat(client, messages=ASK, seed=0, max_tokens=64)["choices"][0]
    assert "tool_calls" not in without_tools["message"] and without_tools["finish_reason"] in ("stop", "length")


def test_each_turns_prompt_extends_the_tokens_of_the_turn_before(client: httpx.Client) -> None:
    """What the capture proxy links turns by: the template re-renders an answer, tool calls
    included, as the very tokens the model sampled. Greedy, because a sampled answer may add text
    after its call, which the parser drops (as vLLM's does) and the next prompt then lacks."""
    messages: List[Dict[str, Any]] = list(ASK)
    before: List[int] = []
    for turn in range(4):
        reply = chat(client, messages=messages, tools=[BASH], temperature=0, return_token_ids=True, max_tokens=96)
        choice = reply["choices"][0]
        assert reply["prompt_token_ids"][: len(before)] == before, f"turn {turn}"
        assert choice["finish_reason"] in ("stop", "tool_calls")
        before = reply["prompt_token_ids"] + choice["token_ids"]
        message = {"role": "assistant", "content": choice["message"]["content"]}
        if choice["message"].get("tool_calls"):
            message["tool_calls"] = choice["message"]["tool_calls"]
            messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.txt"}]
        else:
            messages += [message, {"role": "user", "content": "Go on."}]


@pytest.mark.parametrize("tools", [[BASH], None], ids=["tools", "no-tools"])
def test_a_stream_reassembles_to_the_same_answer(client: httpx.Client, tools: Any) -> None:
    for seed in (1, 2, 3):
        body = {"messages": ASK, "tools": tools, "seed": seed, "max_tokens": 48, "return_token_ids": True}
        body.update(logprobs=True, top_logprobs=2)
        whole = chat(client, **body)
        chunks = stream(client, **body, stream_options={"include_usage": True})
        first, last = chunks[0], chunks[-1]
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert first["prompt_token_ids"] == whole["prompt_token_ids"]
        assert last["choices"] == [] and last["usage"] == {k: whole["usage"][k] for k in last["usage"]}
        assert {c["id"] for c in chunks} == {chunks[0]["id"]} and all(
            c["object"] == "chat.completion.chunk" for c in chunks
        )
        streamed, expected = reassemble(chunks), whole["choices"][0]
        assert streamed["content"] == (expected["message"]["content"] or "")
        calls = [c["function"] for c in expected["message"].get("tool_calls", [])]
        assert list(streamed["tool_calls"].values()) == calls
        assert streamed["token_ids"] == expected["token_ids"]
        assert streamed["logprobs"] == expected["logprobs"]["content"]
        assert streamed["finish_reason"] == expected["finish_reason"]


def test_a_plain_stream_sends_one_text_delta_per_token(client: httpx.Client) -> None:
    chunks = stream(client, messages=ASK, seed=5, max_tokens=16)
    deltas = [c["choices"][0] for c in chunks[1:]]
    assert all(set(d["delta"]) == {"content"} and d["token_ids"] is None for d in deltas)
    assert deltas[-1]["finish_reason"] in ("stop", "length") and all(d["finish_reason"] is None for d in deltas[:-1])
    assert chat(client, messages=ASK, seed=5, max_tokens=16)["usage"]["completion_tokens"] == len(deltas)


def test_a_stop_string_ends_the_answer(client: httpx.Client) -> None:
    body = {"messages": ASK, "seed": 7, "temperature": 1.5, "ignore_eos": True, "max_tokens": 24}
    text = chat(client, **body)["choices"][0]["message"]["content"]
    stop = text[5:7]
    choice = chat(client, **body, stop=[stop])["choices"][0]
    assert choice["message"]["content"] == text[: text.index(stop)]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    streamed = reassemble(stream(client, **body, stop=[stop]))
    assert streamed["content"] == text[: text.index(stop)]


def test_a_prompt_past_the_context_window_is_refused_as_vllm_does(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 33000}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert "maximum context length" in error["message"] and (error["type"], error["code"]) == ("BadRequestError", 400)
    too_long = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 32768})
    assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]


def test_bad_requests_get_vllms_error_shape_and_unknown_fields_are_ignored(client: httpx.Client) -> None:
    broken = client.post(
        "/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    assert broken.status_code == 400 and broken.json()["error"]["code"] == 400
    for body in ({"messages": []}, {"messages": ASK, "temperature": -1}, {"messages": ASK, "top_logprobs": 2}):
        assert client.post("/v1/chat/completions", json=body).status_code == 400, body
    missing = client.post("/v1/chat/completions", json={"messages": ASK, "model": "gpt-4o"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    assert chat(client, messages=ASK, max_tokens=2, frobnicate=True, model=None)["usage"]["completion_tokens"] <= 2


def test_the_openai_sdk_reads_answers_and_streams(server: EngineServer) -> None:
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url=server.base_url, api_key="none")
    extra = {"return_token_ids": True}
    reply = sdk.chat.completions.create(
        model=server.model, messages=ASK, tools=[BASH], seed=1, max_tokens=48, extra_body=extra
    )
    events = sdk.chat.completions.create(
        model=server.model, messages=ASK, tools=[BASH], seed=1, max_tokens=48, stream=True, extra_body=extra
    )
    pieces = list(events)
    assert reply.choices[0].model_extra["token_ids"] == [
        i for p in pieces for c in p.choices for i in c.model_extra.get("token_ids") or []
    ]
    if reply.choices[0].message.tool_calls:
        streamed = [t for p in pieces for c in p.choices for t in c.delta.tool_calls or []]
        assert streamed[0].function.name == reply.choices[0].message.tool_calls[0].function.name


def test_logprobs_are_the_models_own_over_a_unix_socket(server: EngineServer) -> None:
    """The served logprobs equal a plain transformers forward pass over prompt and answer (no
    cache, no chunks), the model loaded from its directory as a trainer would load it: the KV
    cache, the sampling and the alignment are right. Past WINDOW tokens the engine's attention
    keeps the last WINDOW tokens and the marker tokens, which the reference then gets as a mask.
    The engine is served in-process this time."""
    import torch
    from transformers import AutoModelForCausalLM

    from openenv.testing.tiny_engine import WINDOW, TinyEngine

    path = model_dir(tool_name="bash")
    engine = TinyEngine(path)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    long_system = {"role": "system", "content": "Work in the repository. " * 80}  # past the window
    with tempfile.TemporaryDirectory() as scratch:
        socket_path = os.path.join(scratch, "engine.sock")
        with engine.serve(uds=socket_path, in_process=True) as served:
            assert served.url == f"unix://{socket_path}"
            with httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://localhost") as http:
                body = {"tools": [BASH], "seed": 4, "max_tokens": 40, "logprobs": True, "return_token_ids": True}
                replies = [chat(http, messages=ASK, **body), chat(http, messages=[long_system, ASK[1]], **body)]
    assert len(replies[0]["prompt_token_ids"]) < WINDOW < len(replies[1]["prompt_token_ids"])
    for reply in replies:
        prompt, answer = reply["prompt_token_ids"], reply["choices"][0]["token_ids"]
        ids = torch.tensor([prompt + answer])
        at = torch.arange(ids.shape[1])
        markers = torch.tensor([i in engine.marker_ids for i in ids[0].tolist()])
        mask = (at[None, :] <= at[:, None]) & ((at[:, None] - at[None, :] < WINDOW) | markers[None, :])
        with torch.inference_mode():
            logits = reference(ids, attention_mask=mask[None, None]).logits[0].float()
        expected = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1].gather(1, torch.tensor(answer)[:, None])[
            :, 0
        ]
        served_logprobs = torch.tensor([e["logprob"] for e in reply["choices"][0]["logprobs"]["content"]])
        assert torch.allclose(served_logprobs, expected, atol=1e-4)


def test_processed_logprobs_are_those_of_the_distribution_sampled_from() -> None:
    from openenv.testing.tiny_engine import TinyEngine, chat_completion, prepare_chat

    body = {"messages": ASK, "seed": 2, "max_tokens": 12, "logprobs": True, "return_token_ids": True, "top_k": 1}
    answers = {}
    for mode in ("raw_logprobs", "processed_logprobs"):
        engine = TinyEngine(model_dir(tool_name="bash"), logprobs_mode=mode)
        answers[mode] = chat_completion(engine, prepare_chat(engine, body))["choices"][0]
    raw, processed = answers["raw_logprobs"], answers["processed_logprobs"]
    assert raw["token_ids"] == processed["token_ids"]
    assert [e["logprob"] for e in processed["logprobs"]["content"]] == [0.0] * len(processed["token_ids"])
    assert any(e["logprob"] < 0 for e in raw["logprobs"]["content"])  # the model's own, before top-k


def test_parse_tool_calls_reads_text_as_vllms_hermes_parser() -> None:
    text = 'Let me look. <tool_call>{"name": "bash", "arguments": {"command": "ls -a"}}</tool_call>'
    content, (call,) = parse_tool_calls(text)
    assert content == "Let me look. " and call["function"] == {"name": "bash", "arguments": '{"command": "ls -a"}'}
    assert parse_tool_calls("no call here") is None
    assert parse_tool_calls('<tool_call>{"name": "bash"}</tool_call>') is None  # no arguments: the text stays content
    assert parse_tool_calls("<tool_call>{nonsense</tool_call>") is None
    two = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {"x": 1}}'
    content, calls = parse_tool_calls(two)  # the last call may lack its closing tag
    assert content is None and [c["function"]["name"] for c in calls] == ["a", "b"]


def test_the_module_imports_without_torch_and_says_how_to_install_it() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import openenv.testing.tiny_engine as engine\n"
        "try:\n    engine.build_tokenizer()\nexcept ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pip install 'openenv[train]'" in done.stdout
