"""The base install (``pip install .`` of this checkout) is what README.md says: its count of
distributions and its size, with no FastMCP and no uvloop (both come with the ``core`` extra).
Plain environments serve and are driven all the same, and MCPEnvironment says which extra brings
FastMCP instead of turning into None.

The install is real: a fresh venv, this checkout installed into it from PyPI's releases. In the
tests that run in this interpreter instead, FastMCP is hidden (``sys.modules["fastmcp"] = None``
makes its import fail as on a machine without it); everything else is the real server and client."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Set

import pytest

ROOT = Path(__file__).resolve().parent.parent
# anyio's and build's backports, installed on Python 3.10 only: not counted in README's figure
BACKPORTS = {"exceptiongroup", "tomli"}

SERVE_WITHOUT_FASTMCP = """
import sys
sys.modules["fastmcp"] = None
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv import GenericEnvClient

class Act(Action):
    n: int = 0

class Obs(Observation):
    total: int = 0

class Adder(Environment):
    def __init__(self):
        self.total = 0
    def reset(self, seed=None, episode_id=None, **kw):
        self.total = 0
        return Obs()
    def step(self, action, timeout_s=None, **kw):
        self.total += action.n
        return Obs(total=self.total)
    @property
    def state(self):
        return State(step_count=0)

app = create_app(Adder, Act, Obs, env_name="adder")
with BackgroundServer(app) as server:
    with GenericEnvClient(base_url=server.base_url).sync() as env:
        env.reset()
        print(env.step({"n": 2}).observation["total"], env.step({"n": 3}).observation["total"])
print("fastmcp" in sys.modules and sys.modules["fastmcp"] is not None)
"""


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_a_plain_environment_serves_and_steps_without_fastmcp() -> None:
    done = _run(SERVE_WITHOUT_FASTMCP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "5", "False"]


def test_mcp_environment_without_fastmcp_names_the_extra_to_install() -> None:
    done = _run(
        'import sys; sys.modules["fastmcp"] = None\n'
        "import openenv.core.env_server as server\n"
        "try:\n"
        "    server.MCPEnvironment\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('resolved to', server.MCPEnvironment)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "MCPEnvironment needs FastMCP" in done.stdout
    assert "pip install 'openenv[core]'" in done.stdout


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding ``pip install .`` of this checkout and what it requires, nothing else:
    pip runs from this interpreter (``--python``), so the venv holds no pip either. The wheel is
    built from a copy of its sources, so the checkout is left as it was."""
    where = tmp_path_factory.mktemp("base-install")
    source = where / "openenv"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    done = _pip(venv, "install", "--quiet", str(source))
    assert done.returncode == 0, done.stderr[-4000:]
    return venv


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )


def _in(venv: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=120, cwd=venv
    )


def _distributions(venv: Path) -> Set[str]:
    done = _in(venv, "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in m.distributions()))")
    assert done.returncode == 0, done.stderr
    return {re.sub(r"[-_.]+", "-", name).lower() for name in done.stdout.split()}


def _disk_megabytes(directory: Path) -> float:
    """What ``du`` counts: the blocks of every file and directory below ``directory``, in MiB."""
    blocks = 0
    for parent, dirs, files in os.walk(directory):
        for name in dirs + files:
            blocks += os.lstat(os.path.join(parent, name)).st_blocks
    return blocks * 512 / 2**20


def _readme_figures() -> tuple:
    found = re.search(r"\((\d+) distributions, (\d+) MB\)", (ROOT / "README.md").read_text())
    assert found, "README.md no longer gives the base install's figures as '(N distributions, M MB)'"
    return int(found.group(1)), int(found.group(2))


def test_the_base_install_is_as_large_as_the_readme_says(base_venv: Path) -> None:
    count, megabytes = _readme_figures()
    installed = _distributions(base_venv) - BACKPORTS
    assert not installed & {"uvloop", "python-dotenv", "fastmcp", "fastmcp-slim"}, sorted(installed)
    assert len(installed) == count, (
        f"README.md says the base install is {count} distributions; `pip install .` installs {len(installed)}: "
        f"{sorted(installed)}. Make a new need an extra, or correct README.md"
    )
    (site_packages,) = (base_venv / "lib").glob("python3*/site-packages")
    size = _disk_megabytes(site_packages)
    assert abs(size - megabytes) <= 0.1 * megabytes, f"README.md says {megabytes} MB; the base install is {size:.1f}"


def test_the_base_install_serves_and_steps_without_fastmcp_and_uvloop(base_venv: Path) -> None:
    done = _in(base_venv, SERVE_WITHOUT_FASTMCP + "import importlib.util; print(importlib.util.find_spec('uvloop'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "5", "False", "None"]


def test_the_client_imports_no_command_line_or_server_libraries(base_venv: Path) -> None:
    done = _in(
        base_venv,
        "import sys, openenv.core\n"
        "from openenv import GenericEnvClient, SyncEnvClient\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'rich', 'pygments', 'typer', 'click', 'uvicorn', 'fastapi', 'starlette', 'watchfiles', 'build'}))",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_base_install_has_the_openenv_command(base_venv: Path) -> None:
    done = subprocess.run([str(base_venv / "bin" / "openenv"), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("openenv ")


def test_an_environment_package_keeps_this_openenv_and_adds_the_core_extra(base_venv: Path) -> None:
    done = _pip(base_venv, "install", "--dry-run", "--quiet", "--report", "-", str(ROOT / "envs" / "echo_env"))
    assert done.returncode == 0, done.stderr[-4000:]
    would_install = {item["metadata"]["name"].lower() for item in json.loads(done.stdout)["install"]}
    assert "openenv" not in would_install  # not upstream's 0.10.0 from PyPI in its place
    assert {"fastmcp-slim", "uvloop", "openenv-echo-env"} <= would_install
