"""The server's module structure: the import-linter contracts of pyproject.toml hold (layers:
the app and its runner, transports, edges, the dispatch, sessions, environments, contract and
models; clients never import the server's machinery), and no two modules of the package import
each other, even indirectly."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

from tests.test_import_cycles import strongly_connected

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "openenv.core.env_server"


def test_the_import_contracts_hold() -> None:
    linter = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    done = subprocess.run([linter, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_module_of_the_server_imports_itself_through_others() -> None:
    graph = grimp.build_graph("openenv", cache_dir=None)
    modules = {m for m in graph.modules if m.startswith(PACKAGE + ".")}
    edges = {m: {t for t in graph.find_modules_directly_imported_by(m) if t in modules} for m in modules}
    assert strongly_connected(edges) == []
