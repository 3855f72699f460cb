"""The Hub loader (``AutoEnv.from_env("org/name")`` / ``from_hub``) and the provider flow of
``EnvClient.from_env`` / ``from_docker_image`` for Space ids.

No network: the Hub is stood in for by local pieces, configured as a user would configure
another Hub — ``OPENENV_HUB_URL`` points at a directory of local git repositories (``file://``),
each a copy of the echo package standing in for a Space's repository, and
``OPENENV_SPACE_URL_TEMPLATE`` at a BackgroundServer of echo on 127.0.0.1 standing in for the
running Space (or at a port where nothing listens, for a Space that is down). Docker cannot run
here: ``RecordingProvider`` stands in for a container provider and serves echo itself.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx
import pytest

from openenv import AutoEnv
from openenv.auto import hub
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.containers.runtime.providers import ContainerProvider
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "envs" / "echo_env"
REPO_ID = "test-org/space-echo"
needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)


def echo_app() -> Any:
    from echo_env.server.app import app

    return app


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def make_space_repo(hub_dir: Path, repo_id: str, patch: Optional[Dict[str, str]] = None) -> Path:
    """A git repository at <hub>/spaces/<repo_id> holding the echo package (renamed, so that no
    installed package has its name), with ``patch`` (file → text) applied."""
    repo = hub_dir / "spaces" / repo_id
    shutil.copytree(ECHO, repo, ignore=shutil.ignore_patterns("*.egg-info", "tests", "__pycache__"))
    manifest = repo / "openenv.yaml"
    manifest.write_text(manifest.read_text().replace("name: echo_env", "name: space_echo"))
    for name, text in (patch or {}).items():
        (repo / name).write_text(text)
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "space", cwd=repo)
    return repo


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    hub_dir = tmp_path / "hub"
    make_space_repo(hub_dir, REPO_ID)
    monkeypatch.setenv("OPENENV_HUB_URL", hub_dir.as_uri())
    monkeypatch.setenv("OPENENV_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENENV_SPACE_URL_TEMPLATE", f"http://127.0.0.1:{closed_port()}")  # the Space is down
    monkeypatch.delenv("OPENENV_TRUST_REMOTE_CODE", raising=False)
    return hub_dir


@pytest.fixture
def running_space(local_hub, monkeypatch):
    with BackgroundServer(echo_app()) as server:
        monkeypatch.setenv("OPENENV_SPACE_URL_TEMPLATE", server.base_url)
        yield server


def test_space_ids_and_urls_follow_the_configuration(monkeypatch):
    monkeypatch.delenv("OPENENV_HUB_URL", raising=False)
    monkeypatch.delenv("OPENENV_SPACE_URL_TEMPLATE", raising=False)
    assert hub.space_url("Org/My_Env") == "https://org-my-env.hf.space"
    assert hub.space_repository("Org/My_Env") == "https://huggingface.co/spaces/Org/My_Env"
    assert hub.repo_id_of("https://huggingface.co/spaces/org/env") == "org/env"
    monkeypatch.setenv("OPENENV_SPACE_URL_TEMPLATE", "http://127.0.0.1:9/{owner}/{name}")
    assert hub.space_url("org/env") == "http://127.0.0.1:9/org/env"
    assert hub.is_hub_id("org/env") and not hub.is_hub_id("echo_env") and not hub.is_hub_id(str(ECHO))
    with pytest.raises(ValueError, match="not a Hugging Face Space id"):
        hub.repo_id_of("org/../etc")


def test_a_running_space_is_used_as_it_is(running_space, tmp_path):
    with AutoEnv.from_hub(REPO_ID).sync() as env:
        assert isinstance(env.async_client, MCPToolClient)  # the Space serves MCP tool calls
        assert env.async_client.base_url == running_space.base_url
        env.reset()
        assert env.call_tool("echo_message", message="hi") == "hi"
    assert not (tmp_path / "cache").exists()  # nothing was fetched, no trust needed
    generic = AutoEnv.from_env(REPO_ID, skip_install=True)
    assert type(generic) is GenericEnvClient and generic.base_url == running_space.base_url


def test_a_space_that_is_down_is_not_fetched_without_consent(local_hub, tmp_path):
    with pytest.raises(hub.RemoteCodeNotTrusted) as refused:
        AutoEnv.from_env(REPO_ID)
    message = str(refused.value)
    assert "is not running" in message and "trust_remote_code=True" in message
    assert "OPENENV_TRUST_REMOTE_CODE=1" in message
    assert not (tmp_path / "cache").exists()
    with pytest.raises(hub.RemoteCodeNotTrusted):
        GenericEnvClient.from_env(REPO_ID, use_docker=False)  # the same rule for the client's own loader


@needs_bwrap
@pytest.mark.parametrize("consent", ["argument", "environment"])
def test_with_consent_the_spaces_package_is_fetched_and_served_in_the_sandbox(
    local_hub, tmp_path, monkeypatch, consent
):
    if consent == "environment":
        monkeypatch.setenv("OPENENV_TRUST_REMOTE_CODE", "1")
    client = AutoEnv.from_env(REPO_ID, trust_remote_code=consent == "argument")
    assert isinstance(client, MCPToolClient)
    provider = client._provider
    assert provider.isolation == "sandbox"
    assert Path(provider.project_dir).is_relative_to(tmp_path / "cache")
    with client.sync() as env:
        env.reset()
        assert env.call_tool("echo_message", message="from the repo") == "from the repo"
    assert "space_echo" not in sys.modules and "server.app" not in sys.modules  # never imported here


HOSTILE_APP = """
import os, sys
for attempt in ("write", "read"):
    try:
        if attempt == "write":
            open({marker!r}, "w").write("the package ran on the host")
        else:
            open({secret!r}).read()
        sys.stderr.write("escaped: " + attempt)
    except OSError:
        pass
try:
    from ..models import EchoObservation
    from .echo_environment import EchoEnvironment
except ImportError:
    from models import EchoObservation
    from server.echo_environment import EchoEnvironment
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction
app = create_app(EchoEnvironment, CallToolAction, EchoObservation, env_name="space_echo")
"""


@needs_bwrap
def test_a_hostile_spaces_package_cannot_touch_the_host(tmp_path, monkeypatch):
    """The package writes a file on the host and reads a host secret when its server starts:
    served in the sandbox, it does neither. The same package served as a plain process (as
    upstream's ``pip install`` + import runs it) writes the file: see the last assertion."""
    marker, secret = tmp_path / "pwned", tmp_path / "secret.txt"
    secret.write_text("answer key")
    hub_dir = tmp_path / "hub"
    make_space_repo(
        hub_dir, "evil/space", {"server/app.py": HOSTILE_APP.format(marker=str(marker), secret=str(secret))}
    )
    monkeypatch.setenv("OPENENV_HUB_URL", hub_dir.as_uri())
    monkeypatch.setenv("OPENENV_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENENV_SPACE_URL_TEMPLATE", f"http://127.0.0.1:{closed_port()}")
    with AutoEnv.from_env("evil/space", trust_remote_code=True).sync() as env:
        env.reset()
        assert env.call_tool("echo_message", message="still serves") == "still serves"
    assert not marker.exists()
    with hub.load("evil/space", trust_remote_code=True, isolation="none").sync() as env:
        env.reset()
    assert marker.read_text() == "the package ran on the host"


def test_a_spaces_symlinks_do_not_lead_the_host_to_its_own_files(tmp_path, monkeypatch):
    """The host reads a fetched package's openenv.yaml and pyproject.toml: a Space whose
    pyproject.toml is a symlink to a host file must not make it read that file."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("the host's secret\n")
    hub_dir = tmp_path / "hub"
    repo = make_space_repo(hub_dir, REPO_ID)
    (repo / "pyproject.toml").unlink()
    (repo / "pyproject.toml").symlink_to(secret)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "link", cwd=repo)
    monkeypatch.setenv("OPENENV_HUB_URL", hub_dir.as_uri())
    monkeypatch.setenv("OPENENV_HUB_CACHE", str(tmp_path / "cache"))
    fetched = hub.fetch_space(REPO_ID)
    assert not (fetched / "pyproject.toml").is_symlink()
    assert (fetched / "pyproject.toml").read_text() == str(secret)  # the link's text, not the host file's
    again = hub.fetch_space(REPO_ID)
    assert again != fetched and fetched.exists()  # each fetch its own: a sandbox serving the first keeps it


def test_missing_dependencies_are_named_before_anything_runs(tmp_path, monkeypatch):
    hub_dir = tmp_path / "hub"
    pyproject = (
        (ECHO / "pyproject.toml")
        .read_text()
        .replace(
            'dependencies = ["openenv[core]>=0.10"',
            'dependencies = ["no-such-dependency-xyz>=1", "openenv[core]>=0.10"',
        )
    )
    make_space_repo(hub_dir, "org/needs-more", {"pyproject.toml": pyproject})
    monkeypatch.setenv("OPENENV_HUB_URL", hub_dir.as_uri())
    monkeypatch.setenv("OPENENV_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENENV_SPACE_URL_TEMPLATE", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(RuntimeError, match=r"needs no-such-dependency-xyz>=1, which this interpreter lacks"):
        AutoEnv.from_env("org/needs-more", trust_remote_code=True)


def test_a_space_that_is_no_environment_package_is_refused(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "spaces" / "org" / "plain"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("not an environment")
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "x", cwd=repo)
    monkeypatch.setenv("OPENENV_HUB_URL", (tmp_path / "hub").as_uri())
    monkeypatch.setenv("OPENENV_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENENV_SPACE_URL_TEMPLATE", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(ValueError, match=r"no openenv\.yaml"):
        AutoEnv.from_env("org/plain", trust_remote_code=True)
    with pytest.raises(RuntimeError, match="could not fetch the Space org/absent"):
        AutoEnv.from_env("org/absent", trust_remote_code=True)


# --- the provider flow of from_env / from_docker_image (spec §6.1) ----------------------------


class RecordingProvider(ContainerProvider):
    """Stands in for a Docker provider (no engine runs here): records the image and options it
    is asked to start, and serves echo on 127.0.0.1 in their place."""

    def __init__(self) -> None:
        self.started: List[Dict[str, Any]] = []
        self.stopped = 0
        self.server: Optional[BackgroundServer] = None

    def start_container(
        self, image: str, port: Optional[int] = None, env_vars: Optional[Dict[str, str]] = None, **kwargs: Any
    ) -> str:
        self.started.append({"image": image, "port": port, "env_vars": env_vars, **kwargs})
        self.server = BackgroundServer(echo_app()).start()
        return self.server.base_url

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        assert httpx.get(base_url + "/health", timeout=timeout_s).status_code == 200

    def stop_container(self) -> None:
        self.stopped += 1
        if self.server is not None:
            self.server.stop()
            self.server = None


def test_from_env_runs_the_spaces_image_through_the_given_provider():
    provider = RecordingProvider()
    client = GenericEnvClient.from_env(REPO_ID, provider=provider, env_vars={"MODE": "x"}, tag="v2")
    assert provider.started == []  # started when the client connects
    with client.sync() as env:
        result = env.step({"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}})
        assert result.observation["result"]["data"] == "hi"
    assert provider.started == [
        {"image": "registry.hf.space/test-org-space-echo:v2", "port": None, "env_vars": {"MODE": "x"}}
    ]
    assert provider.stopped == 1  # close() stopped the container


def test_from_docker_image_and_use_docker_follow_the_same_flow():
    provider = RecordingProvider()
    with GenericEnvClient.from_docker_image("my/env:1", provider=provider, port=8123).sync() as env:
        env.reset()
    assert provider.started[-1]["image"] == "my/env:1" and provider.started[-1]["port"] == 8123
    with MCPToolClient.from_env("org/Echo_Env", use_docker=True, provider=provider).sync() as env:
        assert env.call_tool("echo_message", message="ok") == "ok"
    assert provider.started[-1]["image"] == "registry.hf.space/org-echo-env:latest"
    assert provider.stopped == 2


def test_a_provider_and_provider_arguments_together_are_refused():
    with pytest.raises(ValueError, match=r"either a provider or provider arguments, not both: \['mem_limit'\]"):
        GenericEnvClient.from_env(REPO_ID, provider=RecordingProvider(), mem_limit="1g")


def test_without_a_provider_a_local_docker_provider_is_made():
    from openenv.core.containers.runtime.docker import LocalDockerProvider

    client = GenericEnvClient.from_env(REPO_ID)
    assert isinstance(client._provider, LocalDockerProvider)  # nothing starts until it connects


@needs_bwrap
def test_from_env_without_docker_serves_the_fetched_package_with_consent(local_hub):
    with MCPToolClient.from_env(REPO_ID, use_docker=False, trust_remote_code=True).sync() as env:
        assert env.async_client._provider.isolation == "sandbox"
        assert env.call_tool("echo_message", message="uv mode, sandboxed") == "uv mode, sandboxed"


def test_upstreams_name_for_this_core_is_not_a_missing_requirement(tmp_path) -> None:
    """Upstream's packages require ``openenv-core``: it is this core under upstream's name (the
    package imports ``openenv``), so it is not reported missing, and telling the user to install
    it (PyPI's, which writes over this core) would do harm; a truly absent requirement still is."""
    from openenv.auto.hub import missing_requirements

    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "upstream-style-env"\nversion = "0.1.0"\n'
        'dependencies = ["openenv-core[core]>=0.2.2", "openenv_core>=0.1", "openenv-absent-requirement>=1"]\n'
    )
    assert missing_requirements(tmp_path) == ["openenv-absent-requirement>=1"]
