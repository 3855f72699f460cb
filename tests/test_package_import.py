"""How a sandboxed server imports its package's app: packages written to run as ``<pkg>.server.app``
(relative imports, an ``envs.<pkg>.server.app:app`` manifest) and packages the sandbox cannot read.

Real sandboxes (SandboxProvider, warm and cold) and real ``openenv serve`` processes on 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from openenv.core.containers.runtime import IsolationError, SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap, privileged
from openenv.core.generic_client import GenericEnvClient

ROOT = Path(__file__).resolve().parents[1]
RELATIVE = ROOT / "tests" / "fixtures" / "relative_env"
OPENENV = [sys.executable, "-m", "openenv.cli"]

needs_bwrap = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")
as_root = pytest.mark.skipif(not privileged(), reason="only root's sandboxes run as a uid of their own")


def _copy(to: Path, app: str | None = None) -> Path:
    """A copy of the relative-imports fixture at ``to``, its manifest naming ``app``."""
    shutil.copytree(RELATIVE, to, ignore=shutil.ignore_patterns("__pycache__"))
    if app is not None:
        manifest = to / "openenv.yaml"
        manifest.write_text(manifest.read_text().replace("app: server.app:app", f"app: {app}"))
    return to


def _count_twice(url: str) -> dict:
    with GenericEnvClient(base_url=url).sync() as env:
        assert env.reset().observation["count"] == 0
        env.step({"add": 2})
        result = env.step({"add": 3})
    assert result.reward == 5.0
    return result.observation


def _sandboxed(project: Path, warm: bool = True) -> dict:
    provider = SandboxProvider(str(project), warm=warm)
    url = provider.start()
    try:
        provider.wait_for_ready(60)
        return _count_twice(url)
    finally:
        provider.stop()


def _start_failure(project: Path, warm: bool) -> str:
    provider = SandboxProvider(str(project), warm=warm)
    try:
        provider.start()
        provider.wait_for_ready(60)
    except (RuntimeError, IsolationError) as exc:
        return " ".join(str(exc).split())
    finally:
        provider.stop()
    raise AssertionError("the server started")


class _Serve:
    """``openenv serve PROJECT --port 0`` in a subprocess; ``url`` is the first line it prints."""

    def __init__(self, project: Path, log: Path) -> None:
        self.log = log
        self.process = subprocess.Popen(
            [*OPENENV, "serve", str(project), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
        )
        self.url = self.process.stdout.readline().strip()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    started = []

    def start(project: Path) -> _Serve:
        served = _Serve(project, tmp_path / f"serve-{len(started)}.log")
        started.append(served)
        assert served.url.startswith("http://127.0.0.1:"), served.log.read_text()[-3000:]
        return served

    yield start
    for served in started:
        served.stop()
        served.process.stdout.close()


# --- packages written to run as their package ---------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_an_app_with_relative_imports_is_served_as_its_package(warm):
    # server.app:app with `from ..models import ...`: plain `server.app` cannot import it.
    observation = _sandboxed(RELATIVE, warm)
    assert observation["module"] == "relative_env.server.counter"
    assert observation["source"] == str(RELATIVE / "server" / "counter.py")


@needs_bwrap
def test_openenv_serve_serves_an_app_with_relative_imports(serve):
    served = serve(RELATIVE)
    assert _count_twice(served.url)["module"] == "relative_env.server.counter"


@needs_bwrap
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_manifest_naming_envs_dot_package_is_served_from_the_directory(tmp_path, warm):
    # As in a checkout of a catalogue (envs/<pkg>/...): the sandbox sees only the package itself.
    project = _copy(tmp_path / "relative_env", app="envs.relative_env.server.app:app")
    observation = _sandboxed(project, warm)
    assert observation["module"] == "envs.relative_env.server.counter"
    assert observation["source"] == str(project / "server" / "counter.py")


@needs_bwrap
def test_openenv_serve_serves_a_manifest_naming_envs_dot_package(tmp_path, serve):
    project = _copy(tmp_path / "relative_env", app="envs.relative_env.server.app:app")
    assert _count_twice(serve(project).url)["module"] == "envs.relative_env.server.counter"


@needs_bwrap
def test_a_manifest_naming_the_package_serves_this_directory(tmp_path):
    # `relative_env.server.app:app` with no relative_env installed: the directory is the package.
    project = _copy(tmp_path / "relative_env", app="relative_env.server.app:app")
    assert _sandboxed(project)["source"] == str(project / "server" / "counter.py")


@needs_bwrap
def test_the_package_name_comes_from_pyproject_when_the_directory_is_not_a_name(tmp_path):
    project = _copy(tmp_path / "relative-env-checkout")
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [project]
            name = "relative-env"
            version = "0.1.0"

            [tool.setuptools]
            packages = ["relative_env", "relative_env.server"]
            package-dir = { "relative_env" = ".", "relative_env.server" = "server" }
            """
        )
    )
    assert _sandboxed(project)["module"] == "relative_env.server.counter"


def _import_in_child(project: Path, app: str = "server.app:app") -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        "from openenv.core.containers.runtime._serve import _import_app\n"
        f"app = _import_app({app!r}, {str(project)!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('server', 'models', 'relative_env', 'catalogue')))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")


def test_a_package_that_imports_from_its_directory_keeps_plain_imports(tmp_path):
    # The catalogue's and `openenv init`'s packages: `server.app` tries `..models`, falls back to
    # `models`; served from the directory, as `uvicorn server.app:app` run there would.
    project = tmp_path / "catalogue"
    (project / "server").mkdir(parents=True)
    (project / "__init__.py").write_text("raise RuntimeError('the package itself is never imported')\n")
    (project / "models.py").write_text("VALUE = 1\n")
    (project / "server" / "__init__.py").write_text("")
    (project / "server" / "app.py").write_text(
        "try:\n    from ..models import VALUE\nexcept ImportError:\n    from models import VALUE\napp = VALUE\n"
    )
    done = _import_in_child(project)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['models', 'server', 'server.app']"


def test_a_failed_first_attempt_leaves_no_top_level_copies(tmp_path):
    done = _import_in_child(RELATIVE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(
        [
            "relative_env",
            "relative_env.models",
            "relative_env.server",
            "relative_env.server.app",
            "relative_env.server.counter",
        ]
    )


def test_a_missing_dependency_is_reported_not_hidden_by_the_retry(tmp_path):
    project = _copy(tmp_path / "relative_env")
    models = project / "models.py"
    models.write_text(models.read_text() + "\nimport no_such_dependency_here  # noqa\n")
    done = _import_in_child(project)
    assert done.returncode != 0
    assert done.stderr.splitlines()[-1] == "ModuleNotFoundError: No module named 'no_such_dependency_here'"


# --- packages the sandbox cannot read (papercut 12) ------------------------------------------------


def _package_in_mkdtemp() -> str:
    """A copy of the fixture in a directory made by tempfile.mkdtemp (mode 0700, owned by root)."""
    directory = tempfile.mkdtemp()
    shutil.copytree(RELATIVE, directory, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    os.chmod(directory, 0o700)  # copytree gave it the fixture's mode; mkdtemp's is 0700
    return os.path.realpath(directory)


@needs_bwrap
@as_root
def test_a_package_in_a_mkdtemp_directory_is_refused_with_the_fix():
    directory = _package_in_mkdtemp()
    try:
        with pytest.raises(IsolationError) as refused:
            SandboxProvider(directory)
    finally:
        shutil.rmtree(directory)
    message = " ".join(str(refused.value).split())
    assert f"the package directory {directory} is not readable by the sandbox's user" in message
    assert "mode 0700" in message and f"chmod -R o+rX {directory}" in message


@needs_bwrap
@as_root
def test_openenv_serve_says_how_to_fix_an_unreadable_package():
    directory = _package_in_mkdtemp()
    try:
        done = subprocess.run([*OPENENV, "serve", directory, "--port", "0"], capture_output=True, text=True, timeout=90)
    finally:
        shutil.rmtree(directory)
    assert done.returncode == 1 and done.stdout == ""
    err = " ".join(done.stderr.split())
    assert "is not readable by the sandbox's user" in err and f"chmod -R o+rX {directory}" in err
    assert "No module named" not in err


@needs_bwrap
@as_root
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_an_unreadable_directory_inside_the_package_is_named(tmp_path, warm):
    project = _copy(tmp_path / "relative_env")
    (project / "server").chmod(0o700)
    message = _start_failure(project, warm)
    assert (
        f"the directory {project / 'server'} in the package {project} is not readable by the sandbox's user" in message
    )
    assert f"chmod -R o+rX {project}" in message
