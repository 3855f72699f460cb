"""``openenv init``: the packages it creates install, lint clean, serve, and pass their own tests."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import yaml

from openenv.cli.__main__ import main
from openenv.cli.commands import init as init_command

REPO = Path(__file__).resolve().parents[2]
NAME = "my_game_env"  # a trailing _env is dropped from class names: MyGameEnv, MyGameAction
PREFIX = "MyGame"

COMMON_FILES = {
    ".dockerignore",
    "README.md",
    "__init__.py",
    "client.py",
    "models.py",
    "openenv.yaml",
    "pyproject.toml",
    "server/Dockerfile",
    "server/__init__.py",
    "server/app.py",
    f"server/{NAME}_environment.py",
    "tests/conftest.py",
    f"tests/test_{NAME}.py",
}
EXPORTS = {
    "typed": {f"{PREFIX}Env", f"{PREFIX}Action", f"{PREFIX}Observation"},
    "mcp": {f"{PREFIX}Env", "CallToolAction", "ListToolsAction"},
}


def files_under(directory: Path) -> set:
    """Relative paths of the files under ``directory``, leaving out what installing and running
    the package adds (``*.egg-info``, ``__pycache__``)."""
    return {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and not any(part.endswith(".egg-info") or part == "__pycache__" for part in p.parts)
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> Dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=2) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def serving(command: List[str], cwd: Path, port: int) -> Iterator[str]:
    """Run a server command; yield its URL once ``/health`` answers."""
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise AssertionError(f"{command} exited with {process.returncode}:\n{process.stdout.read()}")
            try:
                if get_json(f"{url}/health").get("status") == "healthy":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{command} did not answer /health within 30 s")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


def run(command: List[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


# --- the generated package, installed (editable, without dependencies) in a throwaway venv ---------


@dataclass
class Generated:
    template: str
    package: Path
    python: Path  # the throwaway venv's interpreter: sees our .venv's packages and the new package


def throwaway_venv(path: Path) -> Path:
    """A venv that sees the packages of the one running the tests, and installs into its own.

    (``--system-site-packages`` would show the base interpreter's packages, not this venv's.)
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    python = path / "bin" / "python"
    site_packages = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 30)
    ours = sysconfig.get_paths()["purelib"]
    Path(site_packages.stdout.strip(), "_openenv_tests.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


@pytest.fixture(scope="module", params=["typed", "mcp"])
def generated(request, tmp_path_factory) -> Generated:
    root = tmp_path_factory.mktemp(f"init-{request.param}")
    assert main(["init", NAME, "--template", request.param, "--output-dir", str(root)]) == 0
    python = throwaway_venv(root / "venv")
    install = run([str(python), "-m", "pip", "install", "--no-deps", "-q", "-e", str(root / NAME)], 300)
    assert install.returncode == 0, install.stdout + install.stderr
    return Generated(request.param, root / NAME, python)


def test_every_template_file_is_rendered(generated):
    assert files_under(generated.package) == COMMON_FILES
    for relative in COMMON_FILES:
        text = (generated.package / relative).read_text(encoding="utf-8")
        assert "{{" not in text and "}}" not in text, f"placeholder left in {relative}"


def test_the_package_exports_its_client_and_actions(generated):
    tree = ast.parse((generated.package / "__init__.py").read_text())
    exported = next(
        node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "__all__"
    )
    names = set(ast.literal_eval(exported))
    assert EXPORTS[generated.template] <= names
    imported = run([str(generated.python), "-c", f"import {NAME}; print(sorted({NAME}.__all__))"], 60, cwd="/")
    assert set(ast.literal_eval(imported.stdout.strip())) == names


def test_the_manifest_says_what_to_serve(generated):
    manifest = yaml.safe_load((generated.package / "openenv.yaml").read_text())
    assert {k: manifest[k] for k in ("spec_version", "name", "version", "type", "runtime", "app", "port")} == {
        "spec_version": 1,
        "name": NAME,
        "version": "0.1.0",
        "type": "space",
        "runtime": "fastapi",
        "app": "server.app:app",
        "port": 8000,
    }
    assert manifest["description"]


def test_the_pyproject_makes_an_installable_discoverable_package(generated):
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((generated.package / "pyproject.toml").read_text())
    assert project["project"]["name"] == "openenv-my-game-env"
    dependencies = project["project"]["dependencies"]
    # upstream OpenEnv 0.10 (PyPI) or this one: the templates use only API the two share
    assert dependencies[0] == "openenv>=0.10"
    assert dependencies[1:] == ([] if generated.template == "typed" else ["fastmcp>=3.3,<5"])
    dev = " ".join(project["project"]["optional-dependencies"]["dev"])
    assert "pytest>=" in dev and "pytest-asyncio>=" in dev
    assert project["project"]["scripts"] == {"server": f"{NAME}.server.app:main"}
    assert project["tool"]["setuptools"]["package-dir"] == {NAME: ".", f"{NAME}.server": "server"}
    assert "openenv.yaml" in project["tool"]["setuptools"]["package-data"][NAME]


def test_the_installed_package_is_found_by_discovery(generated):
    script = (
        "from openenv.auto.discovery import resolve_environment\n"
        f"info = resolve_environment({NAME!r})\n"
        "print(info.module, info.client_class().__name__, info.action_class().__name__)\n"
    )
    found = run([str(generated.python), "-c", script], 60, cwd="/")
    assert found.returncode == 0, found.stderr
    action = f"{PREFIX}Action" if generated.template == "typed" else "CallToolAction"
    assert found.stdout.split() == [NAME, f"{PREFIX}Env", action]


def test_the_readme_is_a_space_card(generated):
    text = (generated.package / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    card = yaml.safe_load(text.split("---\n")[1])
    assert card["sdk"] == "docker"
    assert card["app_port"] == 8000
    assert card["pinned"] is False
    assert card["tags"] == ["openenv"]
    assert card["title"] and card["emoji"]
    colors = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
    assert card["colorFrom"] in colors and card["colorTo"] in colors
    assert "pip install -e" in text and f"{PREFIX}Env" in text


# What the generated code may import from OpenEnv: names that upstream OpenEnv 0.10.0 (PyPI) has
# as well, so that the package's `openenv>=0.10` holds. scripts/template-interop.sh runs the
# generated tests on upstream 0.10.0 and on ours; a name joins this list once it passes there.
SHARED_WITH_UPSTREAM_0_10 = {
    "openenv.core.client_types": {"StepResult"},
    "openenv.core.env_client": {"EnvClient"},
    "openenv.core.env_server.http_server": {"create_app"},
    "openenv.core.env_server.interfaces": {"Environment"},
    "openenv.core.env_server.mcp_environment": {"MCPEnvironment"},
    "openenv.core.env_server.mcp_types": {"CallToolAction", "CallToolObservation", "ListToolsAction"},
    "openenv.core.env_server.types": {"Action", "EnvironmentMetadata", "Observation", "State"},
    "openenv.core.mcp_client": {"MCPToolClient"},
    "openenv.core.utils": {"run_async_safely"},
}


def test_the_generated_code_imports_only_what_upstream_0_10_has_too(generated):
    imported = set()
    for path in generated.package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported |= {(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "openenv"}
            elif (
                isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "openenv"
            ):
                imported |= {(node.module, alias.name) for alias in node.names}
    assert imported, "the generated code imports nothing from openenv"
    unshared = sorted(
        f"{module}.{name}" for module, name in imported if name not in SHARED_WITH_UPSTREAM_0_10.get(module, ())
    )
    assert not unshared, f"not known to be in upstream OpenEnv 0.10 (run scripts/template-interop.sh): {unshared}"


def test_the_generated_code_passes_ruff_with_our_config(generated):
    config = str(REPO / "pyproject.toml")
    lint = run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", config, str(generated.package)], 60, cwd=REPO
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    style = run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "--config", config, str(generated.package)],
        60,
        cwd=REPO,
    )
    assert style.returncode == 0, style.stdout + style.stderr


def test_the_generated_tests_pass(generated):
    tests = run(
        [str(generated.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], 300, cwd=generated.package
    )
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout


def test_the_server_command_serves_on_localhost(generated):
    port = free_port()
    with serving([str(generated.python.parent / "server"), "--port", str(port)], cwd=Path("/"), port=port) as url:
        assert get_json(f"{url}/metadata")["name"] == NAME


def test_the_dockerfile_command_serves_the_app_from_the_package_directory(generated):
    """The container runs the Dockerfile's CMD in the package directory; so does this test."""
    dockerfile = (generated.package / "server" / "Dockerfile").read_text()
    cmd_line = next(line for line in reversed(dockerfile.splitlines()) if line.startswith("CMD "))
    command = json.loads(cmd_line[len("CMD ") :])
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--port") + 1] == "8000"
    port = free_port()
    command[0] = str(generated.python)
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    with serving(command, cwd=generated.package, port=port) as url:
        assert get_json(f"{url}/metadata")["name"] == NAME
        schema = get_json(f"{url}/schema")
    assert schema["action"]["title"] == (f"{PREFIX}Action" if generated.template == "typed" else "CallToolAction")


# --- refusals and clean-up ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "the environment name is empty"),
        ("  ", "the environment name is empty"),
        ("1env", "starting with a letter"),
        ("my-env", "lowercase letters, digits and underscores"),
        ("MyEnv", "lowercase letters, digits and underscores"),
        ("my env", "lowercase letters, digits and underscores"),
        ("class", "keyword"),
        ("json", "standard library"),
        ("test", "standard library"),
        ("openenv", "clash"),
        ("server", "clash"),
    ],
)
def test_a_bad_name_is_refused_before_anything_is_written(tmp_path, capsys, name, reason):
    assert main(["init", name, "--output-dir", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert "Error:" in error and reason in error
    assert list(tmp_path.iterdir()) == []


def test_the_refusal_suggests_a_name_that_works(tmp_path, capsys):
    assert main(["init", "My-Game", "--output-dir", str(tmp_path)]) == 1
    suggestion = capsys.readouterr().err.split("e.g. ")[1].split(")")[0]
    assert main(["init", suggestion, "--output-dir", str(tmp_path)]) == 0
    assert (tmp_path / suggestion / "openenv.yaml").is_file()


def test_a_non_empty_target_directory_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / NAME).mkdir()
    (tmp_path / NAME / "notes.txt").write_text("mine")
    assert main(["init", NAME, "--output-dir", str(tmp_path)]) == 1
    assert "already exists and is not empty" in capsys.readouterr().err
    assert files_under(tmp_path) == {f"{NAME}/notes.txt"}


def test_a_file_in_the_way_is_refused(tmp_path, capsys):
    (tmp_path / NAME).write_text("a file")
    assert main(["init", NAME, "--output-dir", str(tmp_path)]) == 1
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("below", ["", "sub/dir"])
def test_an_output_dir_that_is_a_file_is_refused(tmp_path, capsys, below):
    (tmp_path / "notes.txt").write_text("a file")
    output = tmp_path / "notes.txt" / below if below else tmp_path / "notes.txt"
    assert main(["init", NAME, "--output-dir", str(output)]) == 1
    error = capsys.readouterr().err
    assert f"{tmp_path / 'notes.txt'} exists and is not a directory" in error and "--output-dir" in error
    assert files_under(tmp_path) == {"notes.txt"}


def test_an_empty_target_directory_is_filled(tmp_path):
    (tmp_path / NAME).mkdir()
    assert main(["init", NAME, "--output-dir", str(tmp_path)]) == 0
    assert files_under(tmp_path / NAME) == COMMON_FILES


def test_the_package_goes_into_the_working_directory_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", NAME]) == 0
    assert files_under(tmp_path / NAME) == COMMON_FILES
    report = capsys.readouterr().err
    for step in (
        f"pip install -e '{NAME}[dev]'",
        f"pytest {NAME}/tests",
        f"openenv serve {NAME}",
        f"openenv validate {NAME}",
    ):
        assert step in report


def failing_after(count: int):
    written = []

    def write(path: Path, content: str) -> None:
        if len(written) == count:
            raise OSError(28, "No space left on device")
        written.append(path)
        path.write_text(content, encoding="utf-8")

    return write


def test_a_failure_midway_removes_the_directories_it_created(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(init_command, "_write", failing_after(4))
    output = tmp_path / "projects" / "envs"
    assert main(["init", NAME, "--output-dir", str(output)]) == 1
    error = capsys.readouterr().err
    assert "No space left on device" in error and "nothing was left behind" in error
    assert list(tmp_path.iterdir()) == []


def test_a_failure_midway_empties_a_directory_that_was_there_before(tmp_path, monkeypatch):
    monkeypatch.setattr(init_command, "_write", failing_after(4))
    (tmp_path / NAME).mkdir()
    assert main(["init", NAME, "--output-dir", str(tmp_path)]) == 1
    assert list((tmp_path / NAME).iterdir()) == []


def test_help_describes_the_options(capsys):
    assert main(["init", "--help"]) == 0
    text = capsys.readouterr().out
    for expected in ("NAME", "--template", "typed", "mcp", "--output-dir"):
        assert expected in text


def test_an_unknown_template_is_refused_with_the_choices(tmp_path, capsys):
    assert main(["init", NAME, "--template", "gym", "--output-dir", str(tmp_path)]) != 0
    error = capsys.readouterr().err
    assert "'gym' is not one of 'typed', 'mcp'" in error
    assert list(tmp_path.iterdir()) == []


# --- the acceptance criterion, end to end ------------------------------------------------------


def test_a_fresh_venv_with_only_openenv_can_create_install_and_test_a_package(tmp_path):
    """``pip install openenv; openenv init my_env; pip install -e my_env[dev]; pytest my_env/tests``."""
    source = tmp_path / "openenv-src"  # a copy, so that building it writes nothing into the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=120)
    bin_dir = tmp_path / "venv" / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    work = tmp_path / "work"
    work.mkdir()
    for command in (
        [str(bin_dir / "pip"), "install", "-q", str(source)],
        [str(bin_dir / "openenv"), "init", "my_env"],
        [str(bin_dir / "pip"), "install", "-q", "-e", "my_env[dev]"],
        [str(bin_dir / "pytest"), "-q", "-p", "no:cacheprovider", "my_env/tests"],
    ):
        step = run(command, 900, cwd=work, env=env)
        assert step.returncode == 0, f"{' '.join(command)}:\n{step.stdout[-4000:]}\n{step.stderr[-4000:]}"
    assert " passed" in step.stdout
