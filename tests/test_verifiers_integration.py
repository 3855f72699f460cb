"""Prime Intellect's ``verifiers`` (0.4) plays an episode of a served OpenEnv environment through
its own OpenEnv adapter (``verifiers.v1.tasksets.openenv``), unchanged.

verifiers runs in a venv of its own, ``.venv-verifiers`` (``OPENENV_VERIFIERS_VENV`` elsewhere),
built on first use and reused while pyproject.toml is unchanged, like ``.venv-newest``: verifiers
0.4.0 pins ``mcp==2.0.0``, and installing it into the project's venv would downgrade the MCP SDK
that our FastMCP servers and every other test run on. The venv holds verifiers 0.4.0, ``uv``
(verifiers' harness runs its chat program as a PEP 723 script with it) and this checkout's
``openenv`` (editable). Its ``home/`` is the HOME verifiers runs with, so that uv's cache and
verifiers' own stay there too. Without PyPI (and no venv yet) the test is skipped, saying so.

The drive is verifiers' own command, ``vf-eval``, in a subprocess: its OpenEnv taskset connects
to a real echo_env server on 127.0.0.1 with ``GenericEnvClient``, reads ``/schema``, lists the
tools, resets, and steps the environment with each reply of the model; the episode's reward is
the sum of the step rewards. The model is a stand-in: an OpenAI-compatible chat endpoint on
127.0.0.1 that answers a fixed script (two echo tool calls, then an empty reply, which ends the
episode) and records what verifiers sent it. Everything between (verifiers' interception proxy,
its null harness's chat program) is verifiers' own code, run for real.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

pytest.importorskip("echo_env", reason="echo_env is not installed (pip install -e envs/echo_env)")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from openenv.core.env_server.serving.runner import BackgroundServer

ROOT = Path(__file__).resolve().parents[1]
VERIFIERS = "verifiers==0.4.0"
VENV = Path(os.environ.get("OPENENV_VERIFIERS_VENV") or ROOT / ".venv-verifiers")
INSTALL_TIMEOUT_S = 900
EVAL_TIMEOUT_S = 420

# The model's script: what it answers to each request, in order. echo_env pays 0.1 per echoed
# character: 0.5 for "hello", 0.2 for "hi". An empty reply makes verifiers end the episode.
SCRIPT = [
    json.dumps({"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hello"}}),
    json.dumps({"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}}),
    "",
]


# --- the venv ------------------------------------------------------------------------------------


def _stamp_text() -> str:
    return f"{VERIFIERS} uv openenv@{ROOT}\n"


def _venv_is_current(stamp: Path) -> bool:
    pyproject = ROOT / "pyproject.toml"
    return (
        stamp.is_file()
        and stamp.read_text() == _stamp_text()
        and stamp.stat().st_mtime >= pyproject.stat().st_mtime
        and (VENV / "bin" / "vf-eval").exists()
    )


def _pypi_unreachable() -> str:
    """Why PyPI cannot be reached from here, or "" when it can."""
    import httpx

    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        response = httpx.get(f"{index}/verifiers/", timeout=15, follow_redirects=True)
    except httpx.HTTPError as exc:
        return f"{index} does not answer ({exc!r})"
    return "" if response.status_code == 200 else f"{index}/verifiers/ answered HTTP {response.status_code}"


@pytest.fixture(scope="session")
def verifiers_venv() -> Path:
    """The venv with verifiers 0.4.0, uv and this checkout's openenv: reused, else (re)built."""
    stamp = VENV / ".installed"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{VENV}.lock", "w") as lock:  # another run building it at the same time waits here
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _venv_is_current(stamp):
            return VENV
        reason = _pypi_unreachable()
        if reason:
            pytest.skip(f"PyPI is unreachable, and installing {VERIFIERS} into {VENV} needs it: {reason}")
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=120)
        done = subprocess.run(
            [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", VERIFIERS, "uv", "-e", str(ROOT)],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"},
        )
        assert done.returncode == 0, f"pip install {VERIFIERS} into {VENV} failed:\n{done.stderr[-4000:]}"
        stamp.write_text(_stamp_text())
        return VENV


# --- the model stand-in ------------------------------------------------------------------------


class ScriptedModel:
    """An OpenAI-compatible ``/v1/chat/completions`` that answers ``SCRIPT`` (streamed when asked)
    and keeps every request body it got."""

    def __init__(self, script: List[str]) -> None:
        self.script = list(script)
        self.requests: List[Dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])])

    async def complete(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        text = self.script[min(len(self.requests), len(self.script)) - 1]
        answer_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            return JSONResponse(
                {
                    "id": answer_id,
                    "object": "chat.completion",
                    "created": created,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage,
                }
            )

        def chunk(delta: Dict[str, Any], finish: Any, **extra: Any) -> str:
            event = {
                "id": answer_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": body.get("model"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }
            return f"data: {json.dumps(event)}\n\n"

        def events() -> Iterator[str]:
            yield chunk({"role": "assistant", "content": text}, None)
            yield chunk({}, "stop", usage=usage)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def _user_turns(body: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The JSON payloads verifiers' OpenEnv adapter sent as user turns (observation + schema)."""
    turns = []
    for message in body["messages"]:
        if message["role"] == "user":
            content = message["content"]
            text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content)
            turns.append(json.loads(text))
    return turns


# --- the episode ---------------------------------------------------------------------------------


@pytest.fixture
def echo_server() -> Iterator[BackgroundServer]:
    from echo_env.server.app import app

    with BackgroundServer(app) as server:
        yield server


def test_verifiers_plays_an_echo_env_episode_through_its_openenv_adapter(
    verifiers_venv: Path, echo_server: BackgroundServer, tmp_path: Path
) -> None:
    model = ScriptedModel(SCRIPT)
    with BackgroundServer(model.app) as model_server:
        config = tmp_path / "eval.toml"
        config.write_text(
            "\n".join(
                [
                    'model = "scripted"',
                    "push = false",
                    f'output_dir = "{tmp_path / "runs"}"',
                    "[client]",
                    f'base_url = "{model_server.base_url}/v1"',
                    'api_key_var = "SCRIPTED_MODEL_KEY"',
                    "[env.taskset]",
                    'id = "openenv"',
                    f'base_url = "{echo_server.base_url}"',
                    # verifiers' chat loop, run as a local subprocess (its default is a Prime sandbox)
                    "[env.player.harness]",
                    'id = "null"',
                    "[env.player.runtime]",
                    'type = "subprocess"',
                    "",
                ]
            )
        )
        home = verifiers_venv / "home"
        home.mkdir(exist_ok=True)
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("OPENENV_", "PRIME_", "VIRTUAL_ENV", "PYTHON"))
        }
        env.update(
            {
                "PATH": f"{verifiers_venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                "HOME": str(home),
                "SCRIPTED_MODEL_KEY": "not-a-secret",
            }
        )
        env.pop("XDG_CACHE_HOME", None)
        if "PIP_INDEX_URL" in os.environ:  # uv fetches the chat program's packages from the same index
            env["UV_DEFAULT_INDEX"] = os.environ["PIP_INDEX_URL"]
        done = subprocess.run(
            [str(verifiers_venv / "bin" / "vf-eval"), "@", str(config), "--no-rich"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=EVAL_TIMEOUT_S,
        )
    output = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, output
    [traces_file] = (tmp_path / "runs").glob("*/traces.jsonl")
    [episode] = [json.loads(line) for line in traces_file.read_text().splitlines() if line.strip()]
    assert episode["ok"] and episode["errors"] == [], output
    [trace] = episode["traces"]
    assert trace["errors"] == [] and trace["stop_condition"] == "empty_action"
    # the reward verifiers' adapter summed from the server's step rewards: 0.5 + 0.2
    assert trace["rewards"]["openenv_reward"]["score"] == pytest.approx(0.7)

    # Three model turns: the reset's observation, then each step's, every one with the action
    # schema and the tools the adapter listed from the server.
    assert len(model.requests) == 3
    turns = _user_turns(model.requests[-1])
    assert len(turns) == 3
    assert turns[0]["observation"]["echoed_message"] == "Echo environment ready!"
    tools = {tool["name"] for tool in turns[0]["action_schema"]["available_tools"]}
    assert tools == {"echo_message", "echo_with_length"}
    # each step's observation as the server sent it: the tool's result (FastMCP's CallToolResult)
    assert [turn["observation"]["tool_name"] for turn in turns[1:]] == ["echo_message"] * 2
    assert [turn["observation"]["result"]["data"] for turn in turns[1:]] == ["hello", "hi"]
