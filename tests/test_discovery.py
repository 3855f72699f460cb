"""How discovery finds a package's client class: the manifest's ``client``, else ``<Key>Env`` in any case."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

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
    from openenv.auto import discovery

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
