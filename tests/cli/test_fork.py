"""``openenv fork``: the real ``huggingface_hub`` client talks to a stand-in Hub on 127.0.0.1.

The Hugging Face Hub cannot be reached from these tests. Instead of faking ``HfApi``, the command
runs in a subprocess with ``HF_ENDPOINT`` pointing at a small FastAPI app on 127.0.0.1 that answers
the two endpoints a fork uses (``whoami-v2`` and ``spaces/{id}/duplicate``) and records what it got,
so everything up to — and including — the HTTP request is the real code path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from openenv.core.env_server.serving.runner import BackgroundServer

OPENENV = [sys.executable, "-m", "openenv.cli"]
TOKEN = "hf_test_token_not_real_0123456789"


class FakeHub:
    def __init__(self) -> None:
        self.requests: List[Dict[str, Any]] = []
        self.existing = {"openenv/echo_env"}
        self.app = FastAPI()

        @self.app.get("/api/whoami-v2")
        async def whoami(request: Request) -> Any:
            self.requests.append({"path": request.url.path, "auth": request.headers.get("authorization")})
            if request.headers.get("authorization") != f"Bearer {TOKEN}":
                return JSONResponse({"error": "Invalid credentials in Authorization header"}, status_code=401)
            return {"type": "user", "name": "alice", "fullname": "Alice", "orgs": [], "auth": {}}

        @self.app.post("/api/spaces/{org}/{name}/duplicate")
        async def duplicate(org: str, name: str, request: Request) -> Any:
            body = await request.json()
            self.requests.append({"path": request.url.path, "json": body, "auth": request.headers.get("authorization")})
            if f"{org}/{name}" not in self.existing:
                return JSONResponse({"error": "Repository not found"}, status_code=404)
            return {"url": f"https://huggingface.co/spaces/{body['repository']}"}


@pytest.fixture
def hub() -> Iterator[tuple]:
    fake = FakeHub()
    with BackgroundServer(fake.app) as server:
        yield fake, server.base_url


def fork(base_url: str, tmp_path: Path, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env.update(HF_ENDPOINT=base_url, HF_HOME=str(tmp_path / "hf-home"), COLUMNS="1000", HF_HUB_DISABLE_TELEMETRY="1")
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([*OPENENV, "fork", *args], capture_output=True, text=True, env=env, timeout=120)


def duplicate_request(fake: FakeHub) -> Dict[str, Any]:
    (request,) = [r for r in fake.requests if r["path"].endswith("/duplicate")]
    return request


def test_fork_duplicates_the_space_into_the_users_namespace_and_prints_its_url(hub: tuple, tmp_path: Path) -> None:
    fake, url = hub
    result = fork(url, tmp_path, "openenv/echo_env")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{url}/spaces/alice/echo_env"  # the Hub's URL, on its endpoint
    request = duplicate_request(fake)
    assert request["path"] == "/api/spaces/openenv/echo_env/duplicate"
    assert request["auth"] == f"Bearer {TOKEN}"
    assert request["json"]["repository"] == "alice/echo_env"
    assert request["json"]["hardware"] == "cpu-basic"
    assert "Forked openenv/echo_env" in result.stderr


def test_a_space_url_a_target_private_variables_and_secrets_reach_the_hub(hub: tuple, tmp_path: Path) -> None:
    fake, url = hub
    result = fork(
        url,
        tmp_path,
        "https://huggingface.co/spaces/openenv/echo_env",
        "--repo-id",
        "team/my-echo",
        "--private",
        "--set-env",
        "MODE=fast",
        "--set-secret",
        "API_KEY=s3cr3t-value",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{url}/spaces/team/my-echo"
    body = duplicate_request(fake)["json"]
    assert body["repository"] == "team/my-echo"
    assert body.get("visibility") == "private" or body.get("private") is True
    assert body["variables"] == [{"key": "MODE", "value": "fast"}]
    assert body["secrets"] == [{"key": "API_KEY", "value": "s3cr3t-value"}]
    assert "s3cr3t-value" not in result.stderr + result.stdout  # the secret is sent, never printed
    assert "API_KEY" in result.stderr


def test_a_missing_source_space_is_a_clear_error(hub: tuple, tmp_path: Path) -> None:
    _fake, url = hub
    result = fork(url, tmp_path, "nobody/missing")
    assert result.returncode == 1 and result.stdout == ""
    assert "Error: duplicating the Space nobody/missing as alice/missing failed" in " ".join(result.stderr.split())


def test_a_refused_token_is_a_login_hint(hub: tuple, tmp_path: Path) -> None:
    fake, url = hub
    result = fork(url, tmp_path, "openenv/echo_env", token="hf_wrong_token_0000000000")
    assert result.returncode == 1
    text = " ".join(result.stderr.split())
    assert "HTTP 401" in text and "hf auth login" in text
    assert "hf_wrong_token" not in text
    assert not [r for r in fake.requests if r["path"].endswith("/duplicate")]


def test_no_token_stops_before_any_request(hub: tuple, tmp_path: Path) -> None:
    fake, url = hub
    result = fork(url, tmp_path, "openenv/echo_env", token="")
    assert result.returncode == 1
    assert "Error: not logged in to the Hugging Face Hub" in " ".join(result.stderr.split())
    assert fake.requests == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["not-a-space"], "'not-a-space' names no Space: use ORG/NAME"),
        (["a/b", "--set-env", "no-equals"], "--set-env expects KEY=VALUE"),
        (["a/b", "--set-secret", "hf_secretvalue"], "got a value without '='"),
    ],
)
def test_bad_arguments_are_refused_before_any_request(
    hub: tuple, tmp_path: Path, args: List[str], message: str
) -> None:
    fake, url = hub
    result = fork(url, tmp_path, *args)
    assert result.returncode == 1 or result.returncode == 2
    text = " ".join(result.stderr.split())
    assert message in text
    assert "hf_secretvalue" not in text
    assert not [r for r in fake.requests if r["path"].endswith("/duplicate")]
