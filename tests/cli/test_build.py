"""``openenv build``: real sdist and wheel builds of the echo environment, and its image.

The distributions are built for real (pypa ``build``, an isolated environment). No Docker engine
runs where these tests run: the "no engine" path is the real one (``DOCKER_HOST`` points at a
socket nobody listens on), and the image-building path runs against a fake Docker client put in
place of ``openenv.cli.commands.build._docker_client``, the command's one seam to Docker.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from openenv.cli import _common
from openenv.cli.__main__ import main
from openenv.cli.commands import build as build_command
from openenv.core.containers.runtime.docker import dockerfile_template

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "envs" / "echo_env"
OPENENV = [sys.executable, "-m", "openenv.cli"]


def echo_copy(dest: Path, dockerfile: bool = True) -> Path:
    shutil.copytree(ECHO, dest, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "dist", "build"))
    if dockerfile and not (dest / "server" / "Dockerfile").exists() and not (dest / "Dockerfile").exists():
        (dest / "server" / "Dockerfile").write_text(dockerfile_template())
    if not dockerfile:
        for name in ("server/Dockerfile", "Dockerfile"):
            (dest / name).unlink(missing_ok=True)
    return dest


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def _unwrapped_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common.err, "soft_wrap", True)  # long paths stay on one line


def run(capsys: pytest.CaptureFixture, *args: str) -> tuple:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, flat(captured.err)


class Built:
    def __init__(self, package: Path, result: subprocess.CompletedProcess) -> None:
        self.package = package
        self.result = result
        self.files = [Path(line) for line in result.stdout.splitlines()]

    def one(self, suffix: str) -> Path:
        (path,) = [f for f in self.files if f.name.endswith(suffix)]
        return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """``openenv build`` of an echo package with a Dockerfile, on a machine without Docker."""
    tmp = tmp_path_factory.mktemp("build")
    package = echo_copy(tmp / "echo_env")
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp}/no-docker-here.sock", "COLUMNS": "1000"}
    result = subprocess.run([*OPENENV, "build", str(package)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return Built(package, result)


def test_build_writes_an_sdist_and_a_wheel_into_the_package_dist_and_lists_them_on_stdout(built: Built) -> None:
    dist = built.package / "dist"
    assert sorted(f.name for f in built.files) == [
        "openenv_echo_env-0.1.0-py3-none-any.whl",
        "openenv_echo_env-0.1.0.tar.gz",
    ]
    assert all(f.parent == dist and f.is_file() for f in built.files)
    assert "Built 2 distributions in" in flat(built.result.stderr)


def test_the_wheel_carries_the_manifest_and_the_server_and_imports_once_installed(built: Built, tmp_path: Path) -> None:
    wheel = built.one(".whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"echo_env/openenv.yaml", "echo_env/server/app.py", "echo_env/client.py"} <= set(names)
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], check=True
    )
    probe = "import echo_env, echo_env.server.app as app; print(echo_env.__file__); print(type(app.app).__name__)"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path,
        check=True,
    )
    location, app_type = result.stdout.split()
    assert Path(location).is_relative_to(target)  # the installed wheel, not the checkout's editable install
    assert app_type == "FastAPI"


def test_the_sdist_holds_the_sources_the_wheel_is_built_from(built: Built) -> None:
    names = tarfile.open(built.one(".tar.gz")).getnames()
    assert "openenv_echo_env-0.1.0/pyproject.toml" in names
    assert "openenv_echo_env-0.1.0/server/echo_environment.py" in names


def test_without_a_docker_engine_the_image_is_skipped_and_the_message_says_what_was_built_and_how_to_build_it_later(
    built: Built,
) -> None:
    stderr = flat(built.result.stderr)
    assert "Image skipped: no Docker engine reachable" in stderr
    assert f"The distributions are in {built.package / 'dist'}; the image openenv-echo:latest was not built" in stderr
    assert f"build it with: openenv build {built.package}" in stderr
    assert f"docker build -t openenv-echo:latest -f {built.package / 'server' / 'Dockerfile'} {built.package}" in stderr


def test_the_docker_command_it_prints_names_files_that_exist_from_where_build_ran(built: Built) -> None:
    """docker reads ``-f`` from the current directory, not from the build context."""
    (command,) = re.findall(r"\(or: (docker build [^)]*)\)", flat(built.result.stderr))
    args = shlex.split(command)
    dockerfile, context = args[args.index("-f") + 1], args[-1]
    assert (Path.cwd() / dockerfile).is_file() and (Path.cwd() / context).is_dir(), command


def test_the_build_log_lists_what_it_installs_under_its_heading(built: Built) -> None:
    lines = built.result.stderr.splitlines()
    (heading,) = [i for i, line in enumerate(lines) if "Installing packages in isolated environment:" in line][:1]
    assert lines[heading + 1].strip().startswith("- setuptools"), lines[heading : heading + 3]


def test_a_package_without_a_dockerfile_says_the_image_was_skipped_and_how_to_add_one(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    package = echo_copy(tmp_path / "echo_env", dockerfile=False)
    code, out, err = run(capsys, "build", str(package), "--out-dir", str(tmp_path / "out"))
    assert code == 0
    assert [Path(line).parent for line in out.splitlines()] == [tmp_path / "out"] * 2
    assert "Image skipped:" in err and "has no Dockerfile (server/Dockerfile or Dockerfile)" in err
    assert "dockerfile_template" in err


def test_no_docker_builds_the_distributions_only(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    package = echo_copy(tmp_path / "echo_env")
    code, out, err = run(capsys, "build", str(package), "--no-docker")
    assert code == 0 and len(out.splitlines()) == 2
    assert "Image skipped (--no-docker): openenv-echo:latest was not built." in err


class FakeDockerAPI:
    """Stands in for ``docker.APIClient``: records ``build``'s arguments and what the context held."""

    def __init__(self, chunks: List[Dict[str, Any]]) -> None:
        self.chunks = chunks
        self.calls: List[Dict[str, Any]] = []
        self.context_files: List[str] = []

    def build(self, **kwargs: Any) -> Iterator[Dict[str, Any]]:
        self.calls.append(kwargs)
        context = Path(kwargs["path"])
        self.context_files = sorted(p.relative_to(context).as_posix() for p in context.rglob("*") if p.is_file())
        return iter(self.chunks)


class FakeDockerClient:
    def __init__(self, chunks: List[Dict[str, Any]]) -> None:
        self.api = FakeDockerAPI(chunks)
        self.closed = False

    def close(self) -> None:
        self.closed = True


SUCCESS = [
    {"stream": "Step 1/9 : FROM python:3.11-slim\n"},
    {"stream": " ---> 0123456789ab\n"},
    {"aux": {"ID": "sha256:feedfacecafebeef0123456789"}},
    {"stream": "Successfully built feedfacecafe\n"},
]


def test_with_an_engine_the_image_is_built_from_a_clean_copy_of_the_package_and_its_log_streamed(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Docker engine is faked (none runs here): what the command asks of it is checked."""
    package = echo_copy(tmp_path / "echo_env")
    (package / "Dockerfile").write_text("FROM scratch\n")  # server/Dockerfile takes precedence
    (package / ".venv").mkdir()
    (package / ".venv" / "junk").write_text("x")
    (package / ".env").write_text("TOKEN=secret\n")
    client = FakeDockerClient(SUCCESS)
    monkeypatch.setattr(build_command, "_docker_client", lambda: client)

    code, out, err = run(capsys, "build", str(package), "--build-arg", "GREETING=hi")

    assert code == 0, err
    (call,) = client.api.calls
    assert call["tag"] == "openenv-echo:latest"
    assert call["dockerfile"] == "server/Dockerfile"
    assert call["buildargs"] == {"GREETING": "hi"}
    assert call["labels"] == {"openenv.name": "echo_env", "openenv.version": "0.1.0"}
    assert call["decode"] is True and call["nocache"] is False
    assert "server/app.py" in client.api.context_files and "openenv.yaml" in client.api.context_files
    assert not [f for f in client.api.context_files if f.startswith(("dist/", ".venv/", ".env"))]
    assert "Step 1/9 : FROM python:3.11-slim" in err  # the build log, streamed
    assert "Built image openenv-echo:latest (sha256:feedfacecafe" in err
    assert out.splitlines()[-1] == "openenv-echo:latest"
    assert client.closed


def test_a_failed_image_build_exits_1_with_dockers_error_and_keeps_the_distributions(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Docker engine is faked (none runs here); it reports a failing RUN step."""
    package = echo_copy(tmp_path / "echo_env")
    chunks = [
        {"stream": "Step 5/9 : RUN pip install .\n"},
        {"error": "The command '/bin/sh -c pip install .' returned a non-zero code: 1", "errorDetail": {"code": 1}},
    ]
    monkeypatch.setattr(build_command, "_docker_client", lambda: FakeDockerClient(chunks))
    code, _, err = run(capsys, "build", str(package), "--tag", "mine:dev")
    assert code == 1
    assert "docker build of mine:dev failed: The command '/bin/sh -c pip install .' returned a non-zero code: 1" in err
    assert "the distributions are in" in err and "the image was not built" in err
    assert len(list((package / "dist").iterdir())) == 2


BROKEN_BACKEND = """
def get_requires_for_build_sdist(config_settings=None):
    return []

def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError("this backend is broken on purpose")
"""


def test_a_failing_wheel_build_exits_1_and_shows_the_end_of_the_build_log(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    package = tmp_path / "broken_env"
    package.mkdir()
    (package / "openenv.yaml").write_text("name: broken_env\n")
    (package / "backend.py").write_text(BROKEN_BACKEND)
    (package / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = []
            build-backend = "backend"
            backend-path = ["."]
            """
        )
    )
    code, out, err = run(capsys, "build", str(package), "--no-isolation")
    assert code == 1 and out == ""
    assert "The last lines of the build log:" in err
    assert "RuntimeError: this backend is broken on purpose" in err
    assert f"Error: building the sdist and wheel of {package} failed (exit code 1)" in err
    assert not (package / "dist").exists()


def test_no_isolation_names_the_build_requirements_this_environment_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    package = echo_copy(tmp_path / "echo_env")
    pyproject = package / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"wheel"]', '"wheel", "openenv-no-such-build-tool>=1"]'))
    code, _, err = run(capsys, "build", str(package), "--no-isolation", "--no-docker")
    assert code == 1
    assert "openenv-no-such-build-tool>=1" in err
    assert "install the missing build requirements into this environment, or build without --no-build-isolation" in err


def test_a_directory_without_openenv_yaml_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(capsys, "build", str(tmp_path))
    assert code == 1 and "has no openenv.yaml" in err
