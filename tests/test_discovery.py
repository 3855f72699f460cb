"""How discovery finds a package's client class (the manifest's ``client``, else ``<Key>Env`` in
any case), what a name that finds nothing is told, and ``AutoEnv.from_env(skip_install=True)``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from openenv.auto.discovery import EnvInfo
from openenv.core.manifest import EnvManifest


@pytest.fixture
def package(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    name = f"pkg_{request.node.name[-20:].replace('[', '_').replace(']', '_').replace('-', '_')}"
    directory = tmp_path / name
    directory.mkdir()
    (directory / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    yield directory
    sys.path.remove(str(tmp_path))
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def info_for(directory: Path, key: str, manifest: str) -> EnvInfo:
    (directory / "openenv.yaml").write_text(manifest)
    return EnvInfo(key, directory.name, None, None, directory, EnvManifest.load(directory))


def test_upstream_spellings_of_the_client_class_are_found_case_insensitively(package: Path) -> None:
    (package / "client.py").write_text("class FinQAEnv:\n    pass\n")
    info = info_for(package, "finqa", "name: finqa_env\n")
    assert info.client_class_name == "FinqaEnv"
    assert info.client_class().__name__ == "FinQAEnv"


def test_the_manifest_can_name_the_client_class(package: Path) -> None:
    (package / "client.py").write_text("class Player:\n    pass\n\nclass GameEnv:\n    pass\n")
    info = info_for(package, "game", "name: game_env\nclient: Player\n")
    assert info.client_class().__name__ == "Player"


def test_two_classes_differing_only_in_case_are_ambiguous_and_not_guessed(package: Path) -> None:
    (package / "client.py").write_text("class REPLEnv:\n    pass\n\nclass ReplENV:\n    pass\n")
    info = info_for(package, "repl", "name: repl_env\n")
    with pytest.raises(ImportError, match="ReplEnv not found"):
        info.client_class()


# --- what a name that finds nothing is told -------------------------------------------------------


def _refusal(name: str) -> str:
    from openenv import AutoEnv

    with pytest.raises(ValueError) as refused:
        AutoEnv.from_env(name)
    return str(refused.value)


def test_a_near_miss_gets_a_did_you_mean_for_an_installed_environment() -> None:
    assert "did you mean 'echo'?" in _refusal("ech")


def test_an_unknown_name_is_not_told_to_install_a_directory_that_does_not_exist() -> None:
    text = _refusal("atari")
    assert "envs/atari_env" not in text and "pip install -e" not in text, text
    assert "Installed: " in text and "echo" in text and "`openenv list`" in text


def test_a_catalogue_environment_is_suggested_by_its_real_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    from openenv.core import discovery

    installed = discovery.discover_environments()
    monkeypatch.setattr(discovery, "discover_environments", lambda: {k: v for k, v in installed.items() if k != "maze"})
    text = _refusal("maze")
    directory = Path(__file__).resolve().parents[1] / "envs" / "maze_env"
    assert f"pip install -e {directory}" in text and directory.is_dir(), text


def test_a_hub_ids_classes_are_told_plainly_that_they_need_its_package() -> None:
    from openenv import AutoAction

    with pytest.raises(ValueError) as refused:
        AutoAction.from_env("meta-pytorch/absent_env")  # its action class is the Space's code
    text = str(refused.value)
    assert "Hugging Face Space id" in text and "AutoEnv.from_env('meta-pytorch/absent_env')" in text, text
    assert "envs/absent" not in text
    assert AutoAction.from_env("meta-pytorch/echo_env").__name__ == "CallToolAction"  # installed here: its class
    assert "pip install git+https://huggingface.co/spaces/meta-pytorch/absent_env" in text


# --- AutoEnv with skip_install: no package code, a GenericEnvClient -------------------------------


def test_skip_install_for_a_local_environment_without_an_image_is_a_value_error() -> None:
    from openenv import AutoEnv

    with pytest.raises(ValueError) as refused:
        AutoEnv.from_env("echo", skip_install=True)
    text = str(refused.value)
    assert text.startswith("Cannot use skip_install=True for local environment 'echo' without providing"), text
    assert "base_url" in text and "docker_image" in text


class _Container:
    """What the Docker SDK's container object answers, for a container whose server is a real
    one (``BackgroundServer``) on 127.0.0.1."""

    def __init__(self, server: Any, name: str) -> None:
        self.server, self.name, self.id = server, name, name
        self.status = "running"
        self.attrs: Dict[str, Any] = {}

    def reload(self) -> None:
        ports = {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(self.server.port)}]}
        self.attrs = {"NetworkSettings": {"Ports": ports}, "State": {"Status": self.status, "ExitCode": 0}}

    def logs(self, **options: Any) -> Iterator[bytes]:
        return iter(())

    def stop(self, timeout: int = 10) -> None:
        self.server.stop()
        self.status = "exited"

    def remove(self, force: bool = False) -> None:
        self.status = "removed"


class _DockerEngine:
    """Stands in for the Docker engine (``docker.DockerClient``), which cannot run where this suite
    must pass: ``containers.run`` starts the image's server for real, on 127.0.0.1. Everything else
    (the provider, the client, the server) is the real thing."""

    def __init__(self, images: Dict[str, Any]) -> None:
        self.images = images
        self.runs: List[Tuple[str, Dict[str, Any]]] = []
        self.started: Dict[str, _Container] = {}
        self.containers = self

    def run(self, image: str, **options: Any) -> _Container:
        from openenv.core.env_server.serving.runner import BackgroundServer

        self.runs.append((image, options))
        container = _Container(BackgroundServer(self.images[image]).start(), options["name"])
        self.started[container.id] = container
        return container

    def get(self, key: str) -> _Container:
        return self.started[key]

    def close(self) -> None:
        pass


async def test_skip_install_with_a_docker_image_gives_a_generic_client_of_that_container() -> None:
    pytest.importorskip("docker", reason="the docker SDK is not installed: pip install 'openenv[docker]'")
    from echo_env.server.app import app

    from openenv import AutoEnv
    from openenv.core.containers.runtime.docker import LocalDockerProvider
    from openenv.core.generic_client import GenericEnvClient

    engine = _DockerEngine({"echo-env:latest": app})
    provider = LocalDockerProvider(client=engine)
    env = AutoEnv.from_env("echo", skip_install=True, docker_image="echo-env:latest", container_provider=provider)
    assert type(env) is GenericEnvClient
    assert engine.runs == []  # the container starts when the client connects
    async with env:
        await env.reset()
        step = await env.step({"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}})
        assert step.observation["result"]["data"] == "hi"  # plain dicts: no package class was used
    ((image, options),) = engine.runs
    assert image == "echo-env:latest" and options["ports"] == {"8000/tcp": ("127.0.0.1", None)}
    assert [c.status for c in engine.started.values()] == ["removed"]  # stopped with the client
