"""What to tell a user whose environment package's server stopped at ``No module named 'X'``.

The server imports the package's app in the sandbox with the interpreter of this command, so a
module the package needs but this Python lacks stops it at start. The usual cause is a package
whose dependencies were never installed (``openenv serve envs/chess_env`` after ``make demo``,
which installs only the echo environment). Its ``pyproject.toml`` says what it needs; this module
compares that with what is installed (read as data: nothing of the package runs here) and says
which module is missing, which requirement provides it and the command that installs it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import List, Optional

from ..utils import shown_path

_NO_MODULE = re.compile(r"No module named '([\w.]+)'")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _provides(requirement: str, module: str) -> bool:
    """Whether the requirement ``requirement`` (``chess>=1.10``) looks like the distribution of
    the top-level module ``module``: the same name, or with a ``python-``/``py`` prefix."""
    name = _key(re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0])
    wanted = _key(module)
    return wanted in (name, name.removeprefix("python_"), name.removeprefix("py"))


def pip_command() -> str:
    """The pip of the interpreter that runs the servers (this one), as a user would type it."""
    pip = Path(sys.executable).parent / "pip"
    if pip.is_file() and os.access(pip, os.X_OK):
        return shown_path(pip)
    return f"{shown_path(Path(sys.executable))} -m pip"


def missing_module_help(message: str, name: str, package_dir: Path) -> Optional[str]:
    """A few sentences to add to ``message`` (why the server of package ``name`` did not start)
    when a module is missing: the module, the requirement of the package that provides it and
    the command that installs it; None when the failure is something else, or the module is the
    package's own."""
    from openenv.core.spaces import missing_requirements

    found = _NO_MODULE.search(message)
    if found is None:
        return None
    module = found.group(1).split(".")[0]
    if (package_dir / module).is_dir() or (package_dir / f"{module}.py").is_file():
        return None  # a module of the package itself: a wrong import path, not a dependency
    pyproject = package_dir / "pyproject.toml"
    python = shown_path(Path(sys.executable))
    if not pyproject.is_file():
        return (
            f"The package {name} imports the module '{module}', which this Python ({python}) lacks, and has no "
            f"pyproject.toml to say where it comes from: install the distribution that provides it "
            f"({pip_command()} install ...)."
        )
    missing: List[str] = missing_requirements(package_dir)
    providing = [requirement for requirement in missing if _provides(requirement, module)]
    install = f"{pip_command()} install -e {shown_path(package_dir)}"
    if providing:
        return (
            f"The package {name} needs the module '{module}', from its dependency {', '.join(providing)} "
            f"(declared in {shown_path(pyproject)}), which this Python ({python}) does not provide. "
            f"Install the package with its dependencies:\n  {install}"
        )
    if missing:
        return (
            f"The package {name} needs the module '{module}'; its {shown_path(pyproject)} declares "
            f"{', '.join(missing)}, which this Python ({python}) does not provide. Install the package with "
            f"its dependencies:\n  {install}"
        )
    return (
        f"The package {name} imports the module '{module}', which this Python ({python}) lacks, but its "
        f"{shown_path(pyproject)} does not declare it: add the distribution that provides '{module}' to "
        f"[project] dependencies there, then install the package again:\n  {install}"
    )
