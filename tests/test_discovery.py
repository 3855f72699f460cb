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
