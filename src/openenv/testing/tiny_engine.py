"""A real inference engine, tiny enough for CPU tests: a model made on the spot, served like vLLM.

Tests of what sits between an agent and its inference engine (the capture proxy of
:mod:`openenv.core.harness.capture`, a training loop) need an engine whose tokens come from a model's
own sampling, with the token ids, logprobs and tool calls a real engine returns. Nothing can be
downloaded in CI, so the model is made here: a character-level tokenizer (printable ASCII; any other
character one token per UTF-8 byte; single tokens for the chat template's markers and a few JSON
pieces of a tool call) with a Jinja chat template in the Hermes/Qwen style, and a two-layer Qwen2
trained for a few seconds so that, given a prompt that declares tools, it calls one
(``<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>``) most of the time, and
otherwise answers a short text. The model is cached on disk, keyed by :data:`RECIPE_VERSION`::

    from openenv.testing.tiny_engine import TinyEngine

    engine = TinyEngine.build()                 # trains once (about 15 s on 2 cores), then loads
    with engine.serve() as server:              # a child process: python -m openenv.testing.tiny_engine
        client = openai.OpenAI(base_url=server.base_url, api_key="none")
        reply = client.chat.completions.create(model=server.model, messages=[...], tools=[...])

The server answers like vLLM's OpenAI-compatible server: ``POST /v1/chat/completions``,
``GET /v1/models``, ``GET /health``, with vLLM's extensions (``return_token_ids``: the prompt's ids
at the top of the answer and each choice's ``token_ids``; ``return_tokens_as_token_ids``;
``top_k``, ``min_p``, ``stop_token_ids``, ``ignore_eos``), streaming token by token, tool calls
parsed from the text as vLLM's ``hermes`` parser does, and vLLM's error shape (a prompt past the
context window is a 400 whose message says "This model's maximum context length is ...").
Logprobs are vLLM's default ``raw_logprobs``: the model's own distribution, before temperature,
top-k, top-p or min-p (``logprobs_mode="processed_logprobs"`` gives those of the distribution
sampled from; at temperature 1 with those filters off the two agree).

Where it differs from vLLM: a stream sends a tool call whole (name and arguments) with the answer's
last token rather than argument by argument, so that streamed and whole answers always agree;
``tool_choice`` "required" or a named function are parsed like "auto" (nothing forces the call);
several choices (``n``) are sampled one after the other; requests share the model step by step.

torch and transformers are not in the core install: they are imported only when a model is built
or loaded (``pip install 'openenv[train]' 'transformers>=5.2'``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import secrets
import selectors
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from starlette.requests import Request  # a core dependency; FastAPI reads route annotations by name

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_MAX_MODEL_LEN",
    "DEFAULT_MODEL_NAME",
    "RECIPE_VERSION",
    "WINDOW",
    "ChatCall",
    "Completion",
    "EngineServer",
    "RequestError",
    "SamplingParams",
    "Step",
    "TinyEngine",
    "build_model",
    "build_tokenizer",
    "chat_completion",
    "chat_completion_chunks",
    "create_app",
    "default_cache_dir",
    "main",
    "model_dir",
    "parse_tool_calls",
    "prepare_chat",
]

DEFAULT_MODEL_NAME = "openenv/tiny-engine"
DEFAULT_MAX_MODEL_LEN = 32768
"""Prompt and answer together (vLLM's ``--max-model-len``). Agents' system prompts run to tens of
thousands of characters, and this tokenizer spends a token on each."""
DEFAULT_MAX_NEW_TOKENS = 512
"""The most a request that names no ``max_tokens`` generates (vLLM takes it from the model's
generation config, as here), so that an answer that never ends cannot hold the engine."""
MAX_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs
_INSTALL_HINT = "pip install 'openenv[train]' 'transformers>=5.2'"
_CACHE_ENV = "OPENENV_TINY_ENGINE_CACHE"

# Special tokens (Qwen's names): the role markers are special, so a decode that skips special tokens
# drops them; the tool tags stay in the text, where the tool parser finds them.
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
_TAG_TOKENS = (TOOL_CALL_START, TOOL_CALL_END, "<tool_response>", "</tool_response>", "<tools>", "</tools>")
# A few multi-character tokens for a tool call's JSON, as a BPE vocabulary would merge them: a call
# is then a dozen tokens rather than sixty, which the model learns in far fewer steps.
_JSON_TOKENS = ('{"name": "', '", "arguments": ', '{"command": "', '"}}')

# The chat template (Jinja, as transformers and vLLM render it). One line per construct, newlines
# written as {{ nl }} so that no whitespace control can eat them. Content may be a string or a list
# of {"type": "text", "text": ...} parts (joined with newlines, as vLLM joins them); a tool call's
# arguments may be a JSON string (OpenAI's wire form) or an object.
CHAT_TEMPLATE = "".join(
    [
        "{%- set nl = '\\n' -%}",
        "{%- macro text(content) -%}",
        "{%- if content is string -%}{{ content }}",
        "{%- elif content is iterable and content is not mapping -%}",
        "{%- for part in content -%}{%- if not loop.first %}{{ nl }}{% endif -%}",
        "{%- if part is string %}{{ part }}{% elif part.type == 'text' %}{{ part.text }}{% endif -%}",
        "{%- endfor -%}",
        "{%- endif -%}",
        "{%- endmacro -%}",
        "{%- set has_system = messages and messages[0].role == 'system' -%}",
        "{%- if tools -%}",
        "<|im_start|>system{{ nl }}{% if has_system %}{{ text(messages[0].content) }}{{ nl }}{% endif %}<tools>",
        "{%- for tool in tools %}{{ nl }}{{ (tool.function if tool.function is defined else tool) | tojson }}",
        "{%- endfor %}{{ nl }}</tools><|im_end|>{{ nl }}",
        "{%- elif has_system -%}",
        "<|im_start|>system{{ nl }}{{ text(messages[0].content) }}<|im_end|>{{ nl }}",
        "{%- endif -%}",
        "{%- for message in messages -%}",
        "{%- if loop.first and has_system -%}",
        "{%- elif message.role == 'assistant' -%}",
        "<|im_start|>assistant{{ nl }}{{ text(message.content) }}",
        "{%- for call in message.tool_calls or [] -%}",
        "{%- set f = call.function if call.function is defined else call -%}",
        '<tool_call>{"name": {{ f.name | tojson }}, "arguments": ',
        "{%- if f.arguments is string %} {{ f.arguments }}{% else %} {{ (f.arguments or {}) | tojson }}{% endif -%}",
        "}</tool_call>",
        "{%- endfor -%}",
        "<|im_end|>{{ nl }}",
        "{%- elif message.role == 'tool' -%}",
        "<|im_start|>tool{{ nl }}<tool_response>{{ text(message.content) }}</tool_response><|im_end|>{{ nl }}",
        "{%- else -%}",
        "<|im_start|>{{ message.role }}{{ nl }}{{ text(message.content) }}<|im_end|>{{ nl }}",
        "{%- endif -%}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt %}<|im_start|>assistant{{ nl }}{% endif -%}",
    ]
)

# What the model is trained on. Any change here changes the cache key, which hashes it all.
_MODEL_SHAPE = {"hidden_size": 96, "intermediate_size": 256, "layers": 2, "heads": 4, "kv_heads": 2}
_TRAINING = {"steps": 160, "batch": 8, "lr": 6e-3, "examples": 1600, "seed": 0}
_WORDS = (
    "the a file list show me what is in this folder please run check find files code test build fix bug error "
    "output print read write open directory project python script line value name data first last next can you "
    "help with my task now then it and or of to for on from how why where which all some good new here there "
    "status version date time user system The Please I README.md src/app.py tests/test_x.py Error: TypeError "
    "main() --help 42 3.11 foo_bar `ls` ok? yes, no. (see below) https://example.com"
).split()
_COMMANDS = ("ls", "pwd", "cat README.md", "git status", "echo hello")
_ANSWERS = ("Done.", "OK.", "All good.", "I found it.")
_TOOL_OUTPUTS = ("README.md\nsrc\ntests", "hello", "/home/user", "On branch main", "", "ok")
_OTHER_TOOLS = (
    ("read_file", "Read a file.", {"path": {"type": "string"}}),
    ("write_file", "Write a file.", {"path": {"type": "string"}, "content": {"type": "string"}}),
    ("search", "Search the code.", {"query": {"type": "string"}}),
    ("python", "Run Python code.", {"code": {"type": "string"}}),
)
WINDOW = 1024
"""Each token attends to the last WINDOW tokens and to every marker token (role markers, tool tags)
before them. Training sequences are no longer, so there this is plain causal attention; on an
agent's long prompt the model sees what it was trained on (the conversation's skeleton and the
recent text) and prefill costs O(length) rather than O(length^2)."""
_ATTENTION = "openenv_tiny_engine"
_RECIPE = [2, WINDOW, CHAT_TEMPLATE, _SPECIAL_TOKENS, _TAG_TOKENS, _JSON_TOKENS, _MODEL_SHAPE, _TRAINING]
_RECIPE += [_WORDS, _COMMANDS, _ANSWERS, _TOOL_OUTPUTS, _OTHER_TOOLS]
RECIPE_VERSION = "2-" + hashlib.sha256(json.dumps(_RECIPE).encode()).hexdigest()[:10]
"""Names the tokenizer, template, model shape and training recipe: the cache is keyed by it (bump
the leading number when the training code changes)."""


def _require() -> Any:
    """torch (transformers too), or an error that says how to install them."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the tiny engine needs torch and transformers, which the core install leaves out: {_INSTALL_HINT} ({exc})"
        ) from exc
    return torch


def default_cache_dir() -> Path:
    """Where built models are kept: ``$OPENENV_TINY_ENGINE_CACHE``, else
    ``$XDG_CACHE_HOME/openenv/tiny-engine`` (``~/.cache/openenv/tiny-engine``)."""
    if os.environ.get(_CACHE_ENV):
        return Path(os.environ[_CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "openenv" / "tiny-engine"


# --------------------------------------------------------------------------------------------------
# The tokenizer


def build_tokenizer() -> Any:
    """The tiny engine's tokenizer (a ``PreTrainedTokenizerFast``) with :data:`CHAT_TEMPLATE` set.

    Printable ASCII characters are one token each and any other character one token per UTF-8 byte
    (byte fallback), so every text round-trips; the template's markers and a few JSON pieces of a
    tool call are single tokens. Text the model samples tokenizes back to the ids it sampled (unless
    it spells one of those multi-character tokens out character by character).
    """
    _require()
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    characters = [c for c in string.printable if c not in "\x0b\x0c\r"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    vocab = [*_SPECIAL_TOKENS, *_TAG_TOKENS, *_JSON_TOKENS, *characters, *byte_tokens]
    core = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=[], byte_fallback=True))
    core.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*_TAG_TOKENS, *_JSON_TOKENS)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=IM_END, pad_token=ENDOFTEXT, padding_side="left", model_max_length=10**9
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# --------------------------------------------------------------------------------------------------
# Training: what the model learns to answer


def _tool(name: str, description: str, properties: Dict[str, Any]) -> Dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def _conversation(rng: random.Random, tool_name: str) -> Tuple[List[Dict[str, Any]], Optional[List[Dict[str, Any]]]]:
    """A training conversation and its tools; the model learns every assistant turn in it.

    With tools, a user's message is answered by a call, a tool's result by another call (60%) or a
    short text that ends the conversation; without tools, by short texts. Mostly short, because
    training time grows with the length; a few long ones teach the model to find the tools far back.
    """

    def words(most: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, most)))

    long = rng.random() < 0.06
    messages: List[Dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": words(120 if long else 10)})
    messages.append({"role": "user", "content": words(120 if long else 12)})
    if rng.random() < 0.2:
        messages.append({"role": "assistant", "content": rng.choice(_ANSWERS)})
        if rng.random() < 0.3:
            messages += [{"role": "user", "content": words(8)}, {"role": "assistant", "content": rng.choice(_ANSWERS)}]
        return messages, None
    # Mostly the bare name: the model must see that there are tools, and each token costs time.
    if rng.random() < 0.6:
        tools = [{"type": "function", "function": {"name": tool_name}}]
    else:
        tools = [_tool(tool_name, "Run a command.", {"command": {"type": "string"}})]
        if rng.random() < 0.4:
            tools.append(_tool(*rng.choice(_OTHER_TOOLS)))
            rng.shuffle(tools)
    for turn in range(4):
        if turn > 0 and rng.random() < 0.4:
            messages.append({"role": "assistant", "content": rng.choice(_ANSWERS)})
            break
        arguments = json.dumps({"command": rng.choice(_COMMANDS)})
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": tool_name, "arguments": arguments}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        if turn == 3 or rng.random() < 0.5:
            break
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": rng.choice(_TOOL_OUTPUTS)})
    return messages, tools


def _examples(tokenizer: Any, tool_name: str, count: int, seed: int) -> List[Tuple[List[int], List[int]]]:
    """(token ids, labels) of ``count`` conversations: labels hold the ids of the assistant turns
    (their text and closing ``<|im_end|>``) and -100 elsewhere."""
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        messages, tools = _conversation(rng, tool_name)
        ids: List[int] = []
        labels: List[int] = []
        for end, message in enumerate(messages, start=1):
            if message["role"] != "assistant":
                continue
            render = tokenizer.apply_chat_template
            prompt = render(messages[: end - 1], tools=tools, add_generation_prompt=True, tokenize=False)
            full = render(messages[:end], tools=tools, tokenize=False)
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
            answer_ids = tokenizer.encode(full[len(prompt) :].rstrip("\n"), add_special_tokens=False)
            labels += [-100] * (len(prompt_ids) - len(ids)) + answer_ids
            ids = prompt_ids + answer_ids
        examples.append((ids, labels))
    return examples


def _train(directory: Path, tool_name: str) -> float:
    """Make, train and save the model and its tokenizer in ``directory``; the final loss."""
    torch = _require()
    from transformers import AutoModelForCausalLM, Qwen2Config

    tokenizer = build_tokenizer()
    shape, plan = _MODEL_SHAPE, _TRAINING
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=DEFAULT_MAX_MODEL_LEN,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=[tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)],
    )
    examples = [e for e in _examples(tokenizer, tool_name, plan["examples"], plan["seed"]) if len(e[0]) <= WINDOW]
    # batches of similar lengths, or padding costs as much as the text
    examples.sort(key=lambda example: len(example[0]))
    batches = [examples[i : i + plan["batch"]] for i in range(0, len(examples), plan["batch"])]
    rng = random.Random(plan["seed"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tensors are tiny: more threads mostly wait on each other
    try:
        torch.manual_seed(plan["seed"])
        model = AutoModelForCausalLM.from_config(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=plan["lr"], weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, plan["lr"], total_steps=plan["steps"], pct_start=0.1)
        model.train()
        for _ in range(plan["steps"]):
            batch = rng.choice(batches)
            width = max(len(ids) for ids, _ in batch)
            input_ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
            labels = torch.full((len(batch), width), -100, dtype=torch.long)
            for row, (ids, targets) in enumerate(batch):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                labels[row, : len(ids)] = torch.tensor(targets)
            # right padding needs no attention mask: a causal model never looks ahead at it
            loss = model(input_ids=input_ids, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.generation_config.max_new_tokens = DEFAULT_MAX_NEW_TOKENS
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    final_loss = float(loss.detach())
    info = {
        "recipe": RECIPE_VERSION,
        "tool_name": tool_name,
        "max_model_len": DEFAULT_MAX_MODEL_LEN,
        "loss": final_loss,
    }
    (directory / "tiny_engine.json").write_text(json.dumps(info))
    return final_loss


def model_dir(cache_dir: str | os.PathLike[str] | None = None, tool_name: str = "bash") -> Path:
    """Where the model trained to call ``tool_name`` is (or will be) cached."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", tool_name):
        raise ValueError(f"a tool name is 1 to 64 letters, digits, '_', '.' or '-', not {tool_name!r}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"{RECIPE_VERSION}-{tool_name}"


def build_model(
    cache_dir: str | os.PathLike[str] | None = None, tool_name: str = "bash", *, force: bool = False
) -> Path:
    """The directory of the model trained to call ``tool_name``, trained now (a few seconds) if the
    cache lacks it. Processes that ask at once wait for the one that trains."""
    import fcntl
    import shutil

    target = model_dir(cache_dir, tool_name)
    if (target / "tiny_engine.json").exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (target / "tiny_engine.json").exists() and not force:
            return target
        scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
        try:
            _train(scratch, tool_name)
            if target.exists():
                shutil.rmtree(target)
            os.rename(scratch, target)  # whole or absent, never half-written
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


# --------------------------------------------------------------------------------------------------
# Generation


@dataclass
class SamplingParams:
    """What a request asks of the sampler (vLLM's names and meanings)."""

    temperature: float = 1.0  # below 1e-5: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: Optional[int] = None
    max_tokens: int = 16
    stop: Tuple[str, ...] = ()
    stop_token_ids: Tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: Optional[int] = None
    """None: no logprobs; k: the sampled token's logprob and k top ones (vLLM's order: the sampled
    token first, then the likeliest others)."""


@dataclass
class Step:
    """One sampled token: its id, logprob and top logprobs (when asked), the answer's text so far
    (cut at a stop string), and why the answer ends here, if it does."""

    token_id: int
    logprob: Optional[float]
    top: List[Tuple[int, float]]
    text: str
    finish_reason: Optional[str] = None
    stop_reason: Optional[Any] = None


@dataclass
class Completion:
    """A whole answer: every step, the final text, and why it ended."""

    steps: List[Step] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    stop_reason: Optional[Any] = None

    @property
    def token_ids(self) -> List[int]:
        return [step.token_id for step in self.steps]


def _register_attention(torch: Any) -> None:
    """Register the model's attention with transformers under its own name (see :data:`WINDOW`);
    registering again replaces it with the same."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(
        module: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        *,
        tiny_engine_markers: Any = None,
        **kwargs: Any,
    ) -> Tuple[Any, None]:
        # query: (batch, heads, queries, dim), the queries being the last of the keys' positions
        first = key.shape[2] - query.shape[2]
        start = max(0, first - WINDOW + 1)  # no query here sees a key before this one, but for markers
        if start == 0 or tiny_engine_markers is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        markers = tiny_engine_markers
        keep = torch.cat([markers[markers < start], torch.arange(start, key.shape[2])])
        positions = torch.arange(first, key.shape[2])[:, None]
        allowed = (keep <= positions) & ((positions - keep < WINDOW) | torch.isin(keep, markers))
        groups = query.shape[1] // key.shape[1]
        keys = key[:, :, keep].repeat_interleave(groups, dim=1)
        values = value[:, :, keep].repeat_interleave(groups, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, keys, values, attn_mask=allowed, scale=kwargs.get("scaling")
        )
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(_ATTENTION, attention)
    AttentionMaskInterface.register(_ATTENTION, sdpa_mask)


class TinyEngine:
    """The tiny model and its tokenizer, loaded from a directory :func:`build_model` made.

    ``tokenizer`` is a transformers tokenizer with the chat template set, for tests that compare
    token ids; ``model`` the Qwen2 model, its attention that of :data:`WINDOW` (a plain
    ``AutoModelForCausalLM.from_pretrained`` of the directory computes the same on sequences of up
    to ``WINDOW`` tokens). :meth:`render` and :meth:`generate` are what the server runs; :meth:`serve`
    serves the engine. Requests may run on several threads: the model takes one step of one at a time.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_model_len: Optional[int] = None,
        logprobs_mode: str = "raw_logprobs",
        threads: Optional[int] = None,
    ) -> None:
        torch = _require()
        from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedTokenizerFast

        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"logprobs_mode is raw_logprobs or processed_logprobs, not {logprobs_mode!r}")
        self.path = Path(path)
        info = json.loads((self.path / "tiny_engine.json").read_text())
        self.tool_name: str = info["tool_name"]
        """The tool the model was trained to call."""
        self.max_model_len = int(max_model_len or info["max_model_len"])
        """Prompt and answer together hold at most this many tokens."""
        self.logprobs_mode = logprobs_mode
        if threads is not None:
            torch.set_num_threads(threads)  # for the whole process: torch has no other kind
        self.tokenizer: Any = PreTrainedTokenizerFast.from_pretrained(self.path)
        _register_attention(torch)
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            self.path, dtype=torch.float32, attn_implementation=_ATTENTION
        ).eval()
        self.marker_ids = frozenset(self.tokenizer.convert_tokens_to_ids([*_SPECIAL_TOKENS, *_TAG_TOKENS]))
        eos = self.model.generation_config.eos_token_id
        self.eos_token_ids = frozenset(eos if isinstance(eos, list) else [eos])
        self.max_new_tokens = int(self.model.generation_config.max_new_tokens or DEFAULT_MAX_NEW_TOKENS)
        # each token's text alone, as vLLM shows it in logprobs (special tokens included)
        self.token_texts = [self.tokenizer.decode([i], skip_special_tokens=False) for i in range(len(self.tokenizer))]
        self._torch, self._new_cache = torch, DynamicCache
        self._lock = threading.Lock()

    @classmethod
    def build(
        cls,
        cache_dir: str | os.PathLike[str] | None = None,
        tool_name: str = "bash",
        *,
        max_model_len: Optional[int] = None,
        logprobs_mode: str = "raw_logprobs",
    ) -> TinyEngine:
        """The engine trained to call ``tool_name``, trained first if the cache (``cache_dir``, else
        :func:`default_cache_dir`) lacks it."""
        return cls(build_model(cache_dir, tool_name), max_model_len=max_model_len, logprobs_mode=logprobs_mode)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Optional[Mapping[str, Any]] = None,
    ) -> List[int]:
        """The prompt's token ids: what ``tokenizer.apply_chat_template(messages, tools=tools,
        add_generation_prompt=True)`` gives."""
        text = self.tokenizer.apply_chat_template(
            [dict(message) for message in messages],
            tools=[dict(tool) for tool in tools] if tools else None,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            tokenize=False,
            **dict(chat_template_kwargs or {}),
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, generator: Any = None) -> Iterator[Step]:
        """Sample an answer to ``prompt_ids`` token by token with a KV cache, yielding each step.

        The caller keeps ``len(prompt_ids) + params.max_tokens`` within :attr:`max_model_len`.
        ``generator`` (a ``torch.Generator``) is seeded from ``params.seed`` when not given.
        """
        torch = self._torch
        if generator is None:
            generator = torch.Generator().manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        stops = [s for s in params.stop if s]
        longest_stop = max((len(s) for s in stops), default=0)
        cache = self._new_cache(config=self.model.config)
        markers = [at for at, token in enumerate(prompt_ids) if token in self.marker_ids]
        logits = self._forward(list(prompt_ids), cache, markers)
        tokens: List[int] = []
        text = ""
        while True:
            with self._lock, torch.inference_mode():
                token, logprob, top = self._sample(logits, params, generator)
            tokens.append(token)
            finish: Optional[str] = None
            stop_reason: Optional[Any] = None
            if token in self.eos_token_ids and not params.ignore_eos:
                finish = "stop"
            elif token in params.stop_token_ids:
                finish, stop_reason = "stop", token
            searched_to = max(0, len(text) - longest_stop)
            text = self.tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens)
            if stops and finish is None:
                found = [(text.find(s, searched_to), s) for s in stops]
                found = [(at, s) for at, s in found if at >= 0]
                if found:
                    at, stop = min(found)
                    text = text[: at + len(stop)] if params.include_stop_str_in_output else text[:at]
                    finish, stop_reason = "stop", stop
            if finish is None and len(tokens) >= params.max_tokens:
                finish = "length"
            yield Step(token, logprob, top, text, finish, stop_reason)
            if finish is not None:
                return
            if token in self.marker_ids:
                markers.append(len(prompt_ids) + len(tokens) - 1)
            logits = self._forward([token], cache, markers)

    def complete(self, prompt_ids: Sequence[int], params: SamplingParams, generator: Any = None) -> Completion:
        """:meth:`generate` to the end."""
        done = Completion()
        for step in self.generate(prompt_ids, params, generator):
            done.steps.append(step)
        last = done.steps[-1]
        done.text, done.finish_reason, done.stop_reason = last.text, last.finish_reason or "length", last.stop_reason
        return done

    def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        uds: Optional[str] = None,
        in_process: bool = False,
        served_model_name: str = DEFAULT_MODEL_NAME,
        **options: Any,
    ) -> EngineServer:
        """This engine behind vLLM's OpenAI-compatible routes, as an :class:`EngineServer` to start
        (``with engine.serve() as server:``). By default in a child process
        (``python -m openenv.testing.tiny_engine``), which keeps torch's threads out of the caller;
        ``in_process=True`` serves this very engine on a thread."""
        return EngineServer(
            model_dir=self.path,
            host=host,
            port=port,
            uds=uds,
            served_model_name=served_model_name,
            max_model_len=self.max_model_len,
            logprobs_mode=self.logprobs_mode,
            engine=self if in_process else None,
            **options,
        )

    def _forward(self, ids: List[int], cache: Any, markers: List[int]) -> Any:
        """The next token's logits after ``ids``, the cache extended by them; a long prompt goes
        through in pieces of :data:`WINDOW` tokens."""
        torch = self._torch
        marker_positions = torch.tensor(markers, dtype=torch.long)
        for at in range(0, len(ids), WINDOW):
            with self._lock, torch.inference_mode():
                # the cache goes by position: transformers renamed that argument (past_key_values, cache)
                out = self.model(
                    torch.tensor([ids[at : at + WINDOW]]),
                    None,
                    None,
                    cache,
                    use_cache=True,
                    logits_to_keep=1,
                    tiny_engine_markers=marker_positions,
                )
        return out.logits[0, -1].float()

    def _sample(
        self, logits: Any, params: SamplingParams, generator: Any
    ) -> Tuple[int, Optional[float], List[Tuple[int, float]]]:
        """The next token, processed in vLLM's order (temperature, min-p, top-k, top-p), its logprob
        and the top ones."""
        torch = self._torch
        raw = torch.log_softmax(logits, dim=-1)
        if params.temperature < 1e-5:  # vLLM reads this as greedy
            token, processed = int(torch.argmax(logits)), raw
        else:
            x = logits / params.temperature
            if params.min_p > 0:
                probs = torch.softmax(x, dim=-1)
                x = x.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
            if 0 < params.top_k < x.numel():
                x = x.masked_fill(x < torch.topk(x, params.top_k).values[-1], float("-inf"))
            if params.top_p < 1.0:
                ordered, order = torch.sort(x, descending=True)
                probs = torch.softmax(ordered, dim=-1)
                beyond = (torch.cumsum(probs, dim=-1) - probs) > params.top_p  # the likeliest always stays
                x = x.index_fill(0, order[beyond], float("-inf"))
            processed = torch.log_softmax(x, dim=-1)
            token = int(torch.multinomial(processed.exp(), 1, generator=generator))
        if params.logprobs is None:
            return token, None, []
        chosen = raw if self.logprobs_mode == "raw_logprobs" else processed
        top: List[Tuple[int, float]] = []
        if params.logprobs:
            count = chosen.numel() if params.logprobs < 0 else min(params.logprobs, chosen.numel())
            values, ids = torch.topk(chosen, count)
            others = [(i, v) for i, v in zip(ids.tolist(), values.tolist(), strict=True) if i != token]
            top = [(token, float(chosen[token])), *others][:count]
        return token, float(chosen[token]), top


# --------------------------------------------------------------------------------------------------
# vLLM's chat completions: requests, answers, streams


class RequestError(Exception):
    """A request the engine refuses; :meth:`body` is vLLM's error JSON."""

    def __init__(self, message: str, *, status: int = 400, type: str = "BadRequestError", param: Optional[str] = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param = message, status, type, param

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def parse_tool_calls(text: str) -> Optional[Tuple[Optional[str], List[Dict[str, Any]]]]:
    """The tool calls in a generated text, read as vLLM's ``hermes`` parser reads them:
    ``(content, calls)``, content being the text before the first ``<tool_call>`` (None if empty)
    and each call ``{"id": "chatcmpl-tool-<hex>", "type": "function", "function": {"name",
    "arguments"}}`` with the arguments re-serialised as a JSON string. None when the text calls no
    tool, or when any call is not JSON with a name and arguments (vLLM then keeps the whole text as
    the content)."""
    if TOOL_CALL_START not in text:
        return None
    calls = []
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1) if match.group(1) else match.group(2))
            name, arguments = call["name"], call["arguments"]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(name, str):
            return None
        function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
        calls.append({"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function", "function": function})
    return text[: text.index(TOOL_CALL_START)] or None, calls


@dataclass
class ChatCall:
    """A chat-completions request, checked and rendered: what :func:`chat_completion` and
    :func:`chat_completion_chunks` answer."""

    prompt_ids: List[int]
    params: SamplingParams
    model: str
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: bool = False
    return_token_ids: bool = False
    tokens_as_ids: bool = False
    parse_tools: bool = False


def _field(body: Mapping[str, Any], key: str, default: Any, kind: Any, rule: str, test: Any = None) -> Any:
    """``body[key]`` checked (absent or null: ``default``), or a 400 that says what it must be."""
    value = body.get(key)
    if value is None:
        return default
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind) or (test and not test(value)):
        raise RequestError(f"{key} must be {rule}, not {json.dumps(value)}", param=key)
    return value


def prepare_chat(engine: TinyEngine, body: Any, served_names: Sequence[str] = (DEFAULT_MODEL_NAME,)) -> ChatCall:
    """Check a chat-completions request as vLLM does and render its prompt; raises
    :class:`RequestError`. Fields vLLM does not know, or this engine does not use, are ignored."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model not in served_names:
        raise RequestError(f"The model `{model}` does not exist.", status=404, type="NotFoundError", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise RequestError("each message must be an object with a role", param="messages")
    tools = _field(body, "tools", None, list, "a list of tools")
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError('each tool must be {"type": "function", "function": {"name": ...}}', param="tools")
    tool_choice = body.get("tool_choice")
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if tool_choice not in ("none", "auto", "required") and not isinstance(tool_choice, dict):
        raise RequestError(
            f"tool_choice must be none, auto, required or a function, not {tool_choice!r}", param="tool_choice"
        )

    logprobs = _field(body, "logprobs", False, bool, "true or false")
    top_logprobs = _field(
        body, "top_logprobs", 0, int, f"-1 or 0 to {MAX_TOP_LOGPROBS}", lambda v: -1 <= v <= MAX_TOP_LOGPROBS
    )
    if top_logprobs and not logprobs:
        raise RequestError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    stream = _field(body, "stream", False, bool, "true or false")
    stream_options = _field(body, "stream_options", None, dict, "an object")
    if stream_options is not None and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.", param="stream_options")
    stop = _field(body, "stop", [], (str, list), "a string or a list of strings")
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stop):
        raise RequestError("stop must be a string or a list of strings", param="stop")
    stop_token_ids = _field(body, "stop_token_ids", [], list, "a list of token ids")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in stop_token_ids):
        raise RequestError("stop_token_ids must be a list of token ids", param="stop_token_ids")
    max_tokens = body.get("max_completion_tokens")
    key = "max_completion_tokens" if max_tokens is not None else "max_tokens"
    max_tokens = _field(body, key, None, int, "an integer of at least 1", lambda v: v >= 1)
    params = SamplingParams(
        temperature=float(_field(body, "temperature", 1.0, (int, float), "a number of at least 0", lambda v: v >= 0)),
        top_p=float(_field(body, "top_p", 1.0, (int, float), "a number in (0, 1]", lambda v: 0 < v <= 1)),
        top_k=_field(body, "top_k", 0, int, "-1, 0 or a positive integer", lambda v: v >= -1),
        min_p=float(_field(body, "min_p", 0.0, (int, float), "a number in [0, 1]", lambda v: 0 <= v <= 1)),
        seed=_field(body, "seed", None, int, "an integer"),
        stop=tuple(stop),
        stop_token_ids=tuple(stop_token_ids),
        ignore_eos=_field(body, "ignore_eos", False, bool, "true or false"),
        include_stop_str_in_output=_field(body, "include_stop_str_in_output", False, bool, "true or false"),
        skip_special_tokens=_field(body, "skip_special_tokens", True, bool, "true or false"),
        logprobs=top_logprobs if logprobs else None,
    )
    n = _field(body, "n", 1, int, "an integer from 1 to 16", lambda v: 1 <= v <= 16)
    add_generation_prompt = _field(body, "add_generation_prompt", True, bool, "true or false")
    continue_final_message = _field(body, "continue_final_message", False, bool, "true or false")
    template_kwargs = _field(body, "chat_template_kwargs", {}, dict, "an object")
    try:
        prompt_ids = engine.render(
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=template_kwargs,
        )
    except Exception as exc:  # the template's own errors (jinja2's, a bad content) say what is wrong
        raise RequestError(f"the chat template cannot render these messages: {type(exc).__name__}: {exc}") from exc
    size, limit = len(prompt_ids), engine.max_model_len
    if size >= limit:
        raise RequestError(
            f"This model's maximum context length is {limit} tokens. However, your request has {size} input "
            "tokens. Please reduce the length of the input messages."
        )
    if max_tokens is None:
        max_tokens = min(limit - size, engine.max_new_tokens)
    elif size + max_tokens > limit:
        raise RequestError(
            f"'{key}' is too large: {max_tokens}. This model's maximum context length is {limit} tokens and your "
            f"request has {size} input tokens ({max_tokens} > {limit} - {size}).",
            param=key,
        )
    params.max_tokens = max_tokens
    options = stream_options or {}
    return ChatCall(
        prompt_ids=prompt_ids,
        params=params,
        model=model if model is not None else served_names[0],
        n=n,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("include_usage") and options.get("continuous_usage_stats")),
        logprobs=logprobs,
        return_token_ids=_field(body, "return_token_ids", False, bool, "true or false"),
        tokens_as_ids=_field(body, "return_tokens_as_token_ids", False, bool, "true or false"),
        parse_tools=bool(tools) and tool_choice != "none",
    )


def _answer(text: str, parse_tools: bool) -> Tuple[Optional[str], List[Dict[str, Any]]]:
    """An answer's message content and tool calls."""
    parsed = parse_tool_calls(text) if parse_tools else None
    return parsed if parsed is not None else (text, [])


def _logprob_content(engine: TinyEngine, steps: Sequence[Step], as_ids: bool) -> List[Dict[str, Any]]:
    def entry(token_id: int, logprob: float) -> Dict[str, Any]:
        token = f"token_id:{token_id}" if as_ids else engine.token_texts[token_id]
        return {
            "token": token,
            "logprob": max(logprob, -9999.0),
            "bytes": list(token.encode("utf-8", errors="replace")),
        }

    return [{**entry(s.token_id, s.logprob or 0.0), "top_logprobs": [entry(i, lp) for i, lp in s.top]} for s in steps]


def _usage(prompt: int, completion: int) -> Dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


def _generator(engine: TinyEngine, seed: Optional[int]) -> Any:
    """One random stream for a request's choices, from its seed (or fresh randomness)."""
    return engine._torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))


def chat_completion(engine: TinyEngine, call: ChatCall) -> Dict[str, Any]:
    """The answer to ``call`` as vLLM's ``chat.completion`` JSON."""
    generator = _generator(engine, call.params.seed)
    choices = []
    generated = 0
    for index in range(call.n):
        done = engine.complete(call.prompt_ids, call.params, generator)
        generated += len(done.steps)
        content, tool_calls = _answer(done.text, call.parse_tools)
        message: Dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": None}
        message.update(audio=None, function_call=None)
        if tool_calls:  # vLLM leaves the key out when there are none
            message["tool_calls"] = tool_calls
        message["reasoning"] = None
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": {"content": _logprob_content(engine, done.steps, call.tokens_as_ids)}
                if call.logprobs
                else None,
                "finish_reason": "tool_calls" if tool_calls else done.finish_reason,
                "stop_reason": done.stop_reason,
                "token_ids": done.token_ids if call.return_token_ids else None,
            }
        )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {**_usage(len(call.prompt_ids), generated), "prompt_tokens_details": None},
        "prompt_logprobs": None,
        "prompt_token_ids": call.prompt_ids if call.return_token_ids else None,
        "kv_transfer_params": None,
    }


def _held_back(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` may be the start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class _StreamedText:
    """What of an answer's content a stream may show after each token: not a character that may
    still change (an incomplete UTF-8 sequence), not what may be the start of a stop string, nothing
    from a tool call on; at the end, the rest of what the whole answer's content is, and its calls.
    Whatever the tokens, the deltas add up to :func:`chat_completion`'s content."""

    def __init__(self, call: ChatCall) -> None:
        self.parse_tools = call.parse_tools
        self.markers = [s for s in call.params.stop if s] + ([TOOL_CALL_START] if call.parse_tools else [])
        self.shown = 0

    def advance(self, step: Step) -> Tuple[str, List[Dict[str, Any]]]:
        text = step.text
        if step.finish_reason is not None:
            content, calls = _answer(text, self.parse_tools)
            rest = (content or "")[self.shown :]
            self.shown = len(content or "")
            return rest, calls
        end = len(text.rstrip("\ufffd"))
        for marker in self.markers:
            end = min(end, text.find(marker) if marker in text else len(text) - _held_back(text, marker))
        delta = text[self.shown : end]
        self.shown = max(self.shown, end)
        return delta, []


def chat_completion_chunks(engine: TinyEngine, call: ChatCall) -> Iterator[Dict[str, Any]]:
    """The answer to ``call`` as vLLM streams it: a first chunk per choice with the role (and the
    prompt's ids when asked), a chunk per token with its text, logprobs and id as asked, the tool
    calls and finish reason with the last token, a usage chunk when ``stream_options`` asks."""
    request_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    prompt_tokens = len(call.prompt_ids)

    def chunk(choices: List[Dict[str, Any]], generated: Optional[int] = None, **extra: Any) -> Dict[str, Any]:
        body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": call.model}
        body.update(choices=choices, **extra)
        if generated is not None and call.continuous_usage:
            body["usage"] = _usage(prompt_tokens, generated)
        return body

    for index in range(call.n):
        role = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        yield chunk([role], 0, prompt_token_ids=call.prompt_ids if call.return_token_ids else None)
    generator = _generator(engine, call.params.seed)
    total = 0
    for index in range(call.n):
        text = _StreamedText(call)
        generated = 0
        for step in engine.generate(call.prompt_ids, call.params, generator):
            generated += 1
            content, tool_calls = text.advance(step)
            delta: Dict[str, Any] = {}
            if (
                content or not call.parse_tools
            ):  # vLLM sends a text delta per token, "" included, unless it parses tools
                delta["content"] = content
            if tool_calls:
                delta["tool_calls"] = [
                    {"id": c["id"], "type": "function", "index": k, "function": c["function"]}
                    for k, c in enumerate(tool_calls)
                ]
            if not delta and step.finish_reason is None and not call.logprobs and not call.return_token_ids:
                continue  # nothing to say for this token (inside a tool call)
            choice: Dict[str, Any] = {"index": index, "delta": delta}
            choice["logprobs"] = (
                {"content": _logprob_content(engine, [step], call.tokens_as_ids)} if call.logprobs else None
            )
            if step.finish_reason is None:
                choice["finish_reason"] = None
            else:
                choice["finish_reason"] = "tool_calls" if tool_calls else step.finish_reason
                choice["stop_reason"] = step.stop_reason
            choice["token_ids"] = [step.token_id] if call.return_token_ids else None
            yield chunk([choice], generated)
        total += generated
    if call.include_usage:
        yield chunk([], usage=_usage(prompt_tokens, total))


# --------------------------------------------------------------------------------------------------
# The server


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _sse(engine: TinyEngine, call: ChatCall) -> Iterator[str]:
    try:
        for chunk in chat_completion_chunks(engine, call):
            yield f"data: {_json(chunk)}\n\n"
    except Exception as exc:  # vLLM reports a failure mid-stream as an error event, then ends the stream
        error = RequestError(f"{type(exc).__name__}: {exc}", status=500, type="InternalServerError")
        yield f"data: {_json(error.body())}\n\n"
    yield "data: [DONE]\n\n"


def create_app(engine: TinyEngine, *, served_model_name: str | Sequence[str] = DEFAULT_MODEL_NAME) -> Any:
    """A FastAPI app with vLLM's routes over ``engine``: ``GET /health``, ``GET /version``,
    ``GET /v1/models`` and ``POST /v1/chat/completions`` (as vLLM serves with
    ``--enable-auto-tool-choice --tool-call-parser hermes``). ``served_model_name`` is the name (or
    names) a request's ``model`` may give; another is a 404."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name)
    app = FastAPI(title="OpenEnv tiny engine", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> Dict[str, str]:
        return {"version": f"openenv-tiny-engine-{RECIPE_VERSION}"}

    @app.get("/v1/models")
    async def models() -> Dict[str, Any]:
        permission = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": created}
        permission.update(allow_create_engine=False, allow_sampling=True, allow_logprobs=True)
        permission.update(allow_search_indices=False, allow_view=True, allow_fine_tuning=False)
        permission.update(organization="*", group=None, is_blocking=False)
        cards = [
            {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": str(engine.path)}
            | {"parent": None, "max_model_len": engine.max_model_len, "permission": [permission]}
            for name in names
        ]
        return {"object": "list", "data": cards}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
            call = await run_in_threadpool(prepare_chat, engine, body, names)
        except ValueError as exc:  # not JSON (RequestError is not a ValueError)
            error = RequestError(f"the request body is not valid JSON: {exc}")
            return JSONResponse(error.body(), status_code=error.status)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        if call.stream:
            return StreamingResponse(_sse(engine, call), media_type="text/event-stream")
        return JSONResponse(await run_in_threadpool(chat_completion, engine, call))

    return app


class EngineServer:
    """A served tiny engine, started by :meth:`start` or ``with``; a child process
    (``python -m openenv.testing.tiny_engine serve``) unless given an ``engine`` to serve on a thread.

    ``url`` is where it listens (``http://127.0.0.1:PORT``, or ``unix://PATH`` with ``uds``),
    ``base_url`` what an OpenAI SDK takes (``.../v1``; through the socket, ``http://localhost/v1``),
    ``model`` the name to ask for. The child builds the model first if the cache lacks it.
    """

    def __init__(
        self,
        *,
        model_dir: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        tool_name: str = "bash",
        host: str = "127.0.0.1",
        port: int = 0,
        uds: Optional[str] = None,
        served_model_name: str = DEFAULT_MODEL_NAME,
        max_model_len: Optional[int] = None,
        logprobs_mode: str = "raw_logprobs",
        engine: Optional[TinyEngine] = None,
        threads: int = 1,
        start_timeout_s: float = 300.0,
        log_level: str = "warning",
    ) -> None:
        self.model = served_model_name
        self.uds = uds
        self.url: Optional[str] = None
        self.process: Optional[subprocess.Popen[str]] = None
        self._engine = engine
        self._thread_server: Any = None
        self._timeout = start_timeout_s
        self._log_level = log_level
        where = ["--uds", uds] if uds else ["--host", host, "--port", str(port)]
        source = ["--model-dir", str(model_dir)] if model_dir else ["--tool-name", tool_name]
        if cache_dir and not model_dir:
            source += ["--cache-dir", str(cache_dir)]
        self._argv = [*where, *source, "--served-model-name", served_model_name, "--logprobs-mode", logprobs_mode]
        self._argv += ["--threads", str(threads), "--log-level", log_level]
        if max_model_len:
            self._argv += ["--max-model-len", str(max_model_len)]
        self._host, self._port = host, port

    @property
    def base_url(self) -> str:
        if self.url is None:
            raise RuntimeError("the engine server is not started")
        return "http://localhost/v1" if self.uds else f"{self.url}/v1"

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process is not None else None

    def start(self) -> str:
        """Serve, and return :attr:`url` once requests are answered."""
        if self.url is not None:
            return self.url
        if self._engine is not None:
            from openenv.core.env_server.serving.runner import BackgroundServer

            app = create_app(self._engine, served_model_name=self.model)
            server = BackgroundServer(app, host=self._host, port=self._port, uds=self.uds, log_level=self._log_level)
            self._thread_server = server.start()
            self.url = server.base_url
            return self.url
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])  # where `openenv` imports from here
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        command = [sys.executable, "-m", "openenv.testing.tiny_engine", "serve", *self._argv]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env)
        try:
            ready = json.loads(self._ready_line())
        except BaseException:
            self.stop()
            raise
        self.url = ready["url"]
        return self.url

    def _ready_line(self) -> str:
        """The line the child prints once it serves."""
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + self._timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"the tiny engine (pid {self.process.pid}) did not serve within {self._timeout:g} s"
                    )
                if selector.select(timeout=min(left, 1.0)):
                    line = self.process.stdout.readline()
                    if line:
                        return line
                    code = self.process.wait()
                    raise RuntimeError(f"the tiny engine exited with status {code} before it served (its log is above)")

    def stop(self) -> None:
        """Stop serving (the child gets SIGTERM, then SIGKILL after 10 s)."""
        if self._thread_server is not None:
            self._thread_server.stop()
            self._thread_server = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None
        self.url = None

    def __enter__(self) -> EngineServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------------
# The command


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m openenv.testing.tiny_engine [serve] [--host H] [--port P | --uds PATH]
    [--tool-name bash | --model-dir DIR] [--cache-dir DIR] [--served-model-name NAME]
    [--max-model-len N]``: serve the tiny engine (building its model first if the cache lacks it)
    and print one JSON line, ``{"url": ..., "model": ...}``, once it answers.
    ``python -m openenv.testing.tiny_engine build [--tool-name bash] [--cache-dir DIR] [--force]``:
    build the model and print its directory."""
    import argparse

    args_in = list(sys.argv[1:] if argv is None else argv)
    if not args_in or args_in[0] not in ("serve", "build", "-h", "--help"):
        args_in.insert(0, "serve")
    parser = argparse.ArgumentParser(prog="python -m openenv.testing.tiny_engine", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build", help="train the model into the cache (if it is not there) and print its directory"
    )
    serve = commands.add_parser("serve", help="serve vLLM's OpenAI-compatible routes (the default)")
    for sub in (build, serve):
        sub.add_argument("--tool-name", default="bash", help="the tool the model learns to call (default bash)")
        sub.add_argument(
            "--cache-dir", help=f"where models are cached (default ${_CACHE_ENV} or ~/.cache/openenv/tiny-engine)"
        )
    build.add_argument("--force", action="store_true", help="train again even if the cache holds the model")
    serve.add_argument("--model-dir", help="serve the model in this directory (made by `build`)")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port, 0 for any free one (default 8000)")
    serve.add_argument("--uds", metavar="PATH", help="listen on this Unix socket instead")
    serve.add_argument("--served-model-name", default=DEFAULT_MODEL_NAME, help=f"(default {DEFAULT_MODEL_NAME})")
    serve.add_argument(
        "--max-model-len", type=int, help=f"prompt and answer tokens at most (default {DEFAULT_MAX_MODEL_LEN})"
    )
    serve.add_argument("--logprobs-mode", choices=("raw_logprobs", "processed_logprobs"), default="raw_logprobs")
    serve.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the tensors are tiny)")
    serve.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    args = parser.parse_args(args_in)
    _require()
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a progress bar for a 1 MB model is noise in a test's log
    if args.command == "build":
        started = time.monotonic()
        path = build_model(args.cache_dir, args.tool_name, force=args.force)
        print(json.dumps({"model_dir": str(path), "seconds": round(time.monotonic() - started, 1)}), flush=True)
        return
    from openenv.core.env_server.serving.runner import BackgroundServer

    path = Path(args.model_dir) if args.model_dir else build_model(args.cache_dir, args.tool_name)
    engine = TinyEngine(path, max_model_len=args.max_model_len, logprobs_mode=args.logprobs_mode, threads=args.threads)
    app = create_app(engine, served_model_name=args.served_model_name)
    server = BackgroundServer(app, host=args.host, port=args.port, uds=args.uds, log_level=args.log_level)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    server.start(timeout_s=60)
    try:
        ready = {"url": server.base_url, "model": args.served_model_name, "pid": os.getpid()}
        print(json.dumps({**ready, "max_model_len": engine.max_model_len, "tool_name": engine.tool_name}), flush=True)
        while not stopping.wait(1.0):
            pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
