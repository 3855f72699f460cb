"""What a package name can show a code sandbox (issue 36, point 3).

``packages=("numpy",)`` binds the directory a name resolves to into the sandbox, and the name
comes from an environment package, hostile by assumption. When names were resolved by Python run
from ``/``, every top-level directory was a namespace package: ``packages=("proc",)`` showed the
host's ``/proc`` (its processes, their command lines), ``("etc",)`` its ``/etc``. Names are now
top-level module names, resolved by the interpreter in isolated mode from an empty directory, and
whatever resolves outside that interpreter's standard library and site-packages is refused.

The traps a site-packages directory could hold (a link to ``/proc``, a ``.pth`` file naming ``/``,
a namespace package with a part elsewhere) are built in a real virtual environment of our own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.tools import run_python

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")

# Run in the sandbox: how much the directory a package name showed holds (pids: numeric entries).
PEEK = """
import json, os
shown = "/run/openenv/site/{name}"
try:
    entries = os.listdir(shown)
except OSError:  # a file, or a directory this uid may not list: shown all the same
    entries = []
print(json.dumps({{"entries": len(entries), "pids": len([e for e in entries if e.isdigit()])}}))
"""


def shown(name: str, **kwargs) -> Tuple[str, Dict]:
    """("refused", {"error": ...}) or ("ran", what the sandbox saw) for ``packages=[name]``."""
    try:
        run = run_python(PEEK.format(name=name), packages=[name], **kwargs)
    except ValueError as exc:
        return "refused", {"error": str(exc)}
    assert run.exit_code == 0, run
    return "ran", json.loads(run.stdout)


@pytest.mark.parametrize("name", ["proc", "etc", "dev", "root", "tmp"])
def test_a_top_level_directory_is_not_a_package(name):
    outcome, seen = shown(name)
    assert outcome == "refused", f"packages=[{name!r}] showed the host's /{name}: {seen}"
    assert f"'{name}'" in seen["error"] and "not importable" in seen["error"], seen


def test_pythonpath_does_not_make_a_package(tmp_path, monkeypatch):
    (tmp_path / "openenv_pythonpath_probe.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    outcome, seen = shown("openenv_pythonpath_probe")
    assert outcome == "refused" and "not importable" in seen["error"], seen


@pytest.mark.parametrize(
    "name", [".", "..", "/proc", "../proc", "proc.self", "proc/self", "", "os.path", "class", "1x", "a-b", "pröc"]
)
def test_a_name_that_is_not_a_top_level_module_name_is_refused_before_anything_resolves_it(name):
    # No interpreter exists at this path: resolving the name would fail otherwise (IsolationError).
    with pytest.raises(ValueError, match="not a top-level module name"):
        run_python("pass", packages=[name], python="/nonexistent/python3")


# --- traps in site-packages ---------------------------------------------------------------------


class Venv:
    """A real virtual environment in a temporary directory, its site-packages ours to fill."""

    def __init__(self, root: Path) -> None:
        subprocess.run([os.path.realpath(sys.executable), "-m", "venv", "--without-pip", str(root)], check=True)
        self.python = str(root / "bin" / "python")
        purelib = subprocess.run(
            [self.python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self.site = Path(purelib)

    def refusal(self, name: str) -> Optional[str]:
        outcome, seen = shown(name, python=self.python)
        return seen["error"] if outcome == "refused" else None


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    root = tmp_path_factory.mktemp("venv")
    venv = Venv(root / "venv")
    (venv.site / "openenv_helper").mkdir()
    (venv.site / "openenv_helper" / "__init__.py").write_text("VALUE = 42\n")
    (venv.site / "procview").symlink_to("/proc")  # a link that leads out of site-packages
    elsewhere = root / "elsewhere"
    (elsewhere / "spread").mkdir(parents=True)  # one part of a namespace package outside...
    (venv.site / "spread").mkdir()  # ...and one inside
    # A .pth line is a sys.path entry: "/" makes /proc a namespace package again, as the
    # resolver's old current directory did.
    (venv.site / "traps.pth").write_text(f"/\n{elsewhere}\n")
    return venv


def test_a_package_in_site_packages_is_shown(venv):
    run = run_python(
        "import openenv_helper; print(openenv_helper.VALUE)", packages=["openenv_helper"], python=venv.python
    )
    assert (run.exit_code, run.stdout) == (0, "42\n"), run


def test_a_link_in_site_packages_leading_to_proc_is_refused(venv):
    refusal = venv.refusal("procview")
    assert refusal is not None and "'procview'" in refusal and "/proc" in refusal, refusal
    assert "outside" in refusal


def test_a_pth_entry_naming_the_root_does_not_make_proc_a_package(venv):
    refusal = venv.refusal("proc")
    assert refusal is not None and "'proc'" in refusal and "outside" in refusal, refusal


def test_a_namespace_package_with_a_part_outside_site_packages_is_refused(venv):
    refusal = venv.refusal("spread")
    assert refusal is not None and "'spread'" in refusal and "elsewhere" in refusal, refusal
