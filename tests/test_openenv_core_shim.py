"""Installing an environment package written for upstream OpenEnv keeps this core.

Upstream's packages depend on ``openenv-core[core]>=0.2.2``. PyPI's ``openenv-core`` (0.3.0) is
upstream's own core: it ships a top-level ``openenv`` package, so ``pip install <package>`` in a
venv holding this checkout's ``openenv`` writes upstream's files over ours, and the package then
runs on upstream's code without a word. ``compat/openenv-core`` is a distribution of that name
with no modules, depending on our ``openenv``; installed beside the core, it satisfies the
requirement and pip fetches nothing.

Everything here is real: fresh venvs, this checkout, the shim and ``tests/fixtures/countdown_env``
(an upstream-shaped package that requires ``openenv-core[core]>=0.2.2``) built into wheels and
installed with pip from PyPI's releases; the package served on a real port and stepped with its
own client. Without PyPI the tests are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "compat" / "openenv-core"
FIXTURE = ROOT / "tests" / "fixtures" / "countdown_env"
SHIM_VERSION = "0.3.0+openenv"
PIP_TIMEOUT_S = 900

# The files pip installed for the `openenv` distribution that are no longer what it installed
# (RECORD's hashes against the files on disk), as a JSON list.
CHANGED_FILES = """
import base64, hashlib, importlib.metadata, json
changed = []
for file in importlib.metadata.distribution("openenv").files:
    if file.hash is None:
        continue
    path = file.locate()
    digest = None
    if path.exists():
        digest = hashlib.new(file.hash.mode, path.read_bytes()).digest()
        digest = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    if digest != file.hash.value:
        changed.append(str(file))
print(json.dumps(changed))
"""

# The package served on a free port (OpenEnv's runner) and played with its own client.
SERVE_AND_STEP = """
from countdown_env import CountdownAction, CountdownEnv
from countdown_env.server.app import app
from openenv.core.env_server.serving.runner import BackgroundServer

with BackgroundServer(app) as server, CountdownEnv(base_url=server.base_url).sync() as env:
    print(env.reset(start=3).observation.remaining)
    print(env.step(CountdownAction(amount=2)).observation.remaining)
    result = env.step(CountdownAction(amount=1))
    print(result.observation.remaining, result.done, result.reward)
"""


def _pypi_unreachable() -> str:
    """Why PyPI's openenv-core cannot be looked up from here, or "" when it can."""
    import httpx

    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        response = httpx.get(f"{index}/openenv-core/", timeout=15, follow_redirects=True)
    except httpx.HTTPError as exc:
        return f"{index} does not answer ({exc!r})"
    return "" if response.status_code == 200 else f"{index}/openenv-core/ answered HTTP {response.status_code}"


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"},
    )


def _in(venv: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=120, cwd=venv
    )


def _installed_by(venv: Path, *args: str) -> Dict[str, dict]:
    """Run ``pip install *args`` in ``venv`` (``--dry-run`` among them: only resolve); return what
    pip installed (or would), by distribution name, each with pip's report entry."""
    done = _pip(venv, "install", "--quiet", "--report", "-", *args)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    return {item["metadata"]["name"].lower(): item for item in report["install"]}


def _changed_files(venv: Path) -> List[str]:
    done = _in(venv, CHANGED_FILES)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def _serve_and_step(venv: Path) -> List[str]:
    done = _in(venv, SERVE_AND_STEP)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """Wheels of this checkout's openenv, the shim and the fixture package, built from copies of
    their sources (the checkout is left as it was)."""
    reason = _pypi_unreachable()
    if reason:
        pytest.skip(f"PyPI is unreachable, and these installs need it: {reason}")
    where = tmp_path_factory.mktemp("openenv-core-shim")
    core = where / "openenv"
    shutil.copytree(ROOT / "src", core / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, core / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(SHIM, where / "shim", ignore=ignore)
    shutil.copytree(FIXTURE, where / "countdown_env", ignore=ignore)
    out = where / "wheels"
    sources = [str(core), str(where / "shim"), str(where / "countdown_env")]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), *sources],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = {path.name.split("-")[0]: path for path in out.glob("*.whl")}
    return {"core": found["openenv"], "shim": found["openenv_core"], "package": found["openenv_countdown_env"]}


def _venv(where: Path, *wheels: Path) -> Path:
    """A fresh venv (no pip of its own: pip runs from this interpreter) holding ``wheels`` and
    what they require."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    done = _pip(venv, "install", "--quiet", *map(str, wheels))
    assert done.returncode == 0, done.stderr[-4000:]
    return venv


@pytest.fixture(scope="module")
def with_shim(wheels: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Our core and the shim, as `make setup` and README's pip line install them."""
    venv = _venv(tmp_path_factory.mktemp("with-shim"), wheels["core"], wheels["shim"])
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


@pytest.fixture(scope="module")
def without_shim(wheels: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Our core alone (upstream's openenv-core and its dependencies land here: about 400 MB)."""
    venv = _venv(tmp_path_factory.mktemp("without-shim"), wheels["core"])
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


@pytest.fixture(scope="module")
def package_installed_with_shim(with_shim: Path, wheels: Dict[str, Path]) -> Dict[str, dict]:
    return _installed_by(with_shim, str(wheels["package"]))


@pytest.fixture(scope="module")
def package_installed_without_shim(without_shim: Path, wheels: Dict[str, Path]) -> Tuple[Dict[str, dict], List[str]]:
    """What installing the package fetched, and which of our files it changed (read right after)."""
    return _installed_by(without_shim, str(wheels["package"])), _changed_files(without_shim)


def test_with_the_shim_installing_an_upstream_package_installs_nothing_else(
    with_shim: Path, package_installed_with_shim: Dict[str, dict]
) -> None:
    assert set(package_installed_with_shim) == {"openenv-countdown-env"}
    done = _in(with_shim, "import importlib.metadata as m; print(m.version('openenv-core'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == SHIM_VERSION


def test_with_the_shim_the_package_runs_on_this_core(
    with_shim: Path, package_installed_with_shim: Dict[str, dict]
) -> None:
    assert _changed_files(with_shim) == []
    assert _serve_and_step(with_shim) == ["3", "1", "0 True 1.0"]


def test_without_the_shim_pip_writes_upstreams_openenv_over_this_one(
    package_installed_without_shim: Tuple[Dict[str, dict], List[str]],
) -> None:
    """The problem the shim solves: the same install fetches PyPI's openenv-core, and its files
    replace ours (``openenv/__init__.py`` among them) with nothing said."""
    installed, changed = package_installed_without_shim
    upstream = installed["openenv-core"]
    assert upstream["metadata"]["version"] != SHIM_VERSION
    assert upstream["download_info"]["url"].startswith("https://"), upstream["download_info"]
    assert "openenv/__init__.py" in changed and len(changed) > 20, changed


def test_the_documented_repair_puts_this_core_back(
    without_shim: Path, wheels: Dict[str, Path], package_installed_without_shim: Tuple[Dict[str, dict], List[str]]
) -> None:
    """docs/compatibility.md's repair for a venv where upstream's openenv-core was written over
    ours: uninstall both, then install ours and the shim."""
    done = _pip(without_shim, "uninstall", "--yes", "--quiet", "openenv-core", "openenv")
    assert done.returncode == 0, done.stderr[-4000:]
    installed = _installed_by(without_shim, str(wheels["core"]), str(wheels["shim"]))
    assert {"openenv", "openenv-core"} <= set(installed)
    assert _changed_files(without_shim) == []
    assert _serve_and_step(without_shim) == ["3", "1", "0 True 1.0"]


@pytest.mark.parametrize(
    ("how", "args", "fetches_upstream"),
    [
        ("upgrading the package (-U)", ["--upgrade", "{package}"], False),
        ("upgrading eagerly", ["--upgrade", "--upgrade-strategy", "eager", "{package}"], False),
        ("upgrading openenv-core itself", ["--upgrade", "openenv-core[core]"], False),
        ("a package pinning an older release", ["openenv-core[core]==0.2.3"], True),
        ("--force-reinstall (ignores what is installed)", ["--force-reinstall", "{package}"], True),
        ("--ignore-installed", ["--ignore-installed", "{package}"], True),
        ("--force-reinstall --no-deps", ["--force-reinstall", "--no-deps", "{package}"], False),
    ],
)
def test_what_keeps_the_shim_and_what_replaces_it(
    with_shim: Path, wheels: Dict[str, Path], how: str, args: List[str], fetches_upstream: bool
) -> None:
    """The cases docs/compatibility.md lists, resolved by pip (--dry-run: nothing is installed)."""
    args = [arg.format(package=wheels["package"]) for arg in args]
    would_install = _installed_by(with_shim, "--dry-run", *args)
    assert ("openenv-core" in would_install) is fetches_upstream, (how, sorted(would_install))


def test_the_shim_alone_never_brings_upstreams_openenv(wheels: Dict[str, Path], tmp_path: Path) -> None:
    """The shim asks for our releases (openenv>=0.11): in a venv without this checkout's openenv,
    pip finds none rather than taking PyPI's `openenv` (upstream's 0.10.0) in its place."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    done = _pip(venv, "install", "--dry-run", "--quiet", str(wheels["shim"]))
    assert done.returncode != 0
    assert "openenv>=0.11" in done.stderr.replace("[core]", ""), done.stderr[-4000:]
