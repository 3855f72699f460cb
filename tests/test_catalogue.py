"""envs/README.md tells the truth: every package is in its table, `openenv list` finds every one,
and its example runs as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from openenv.core.containers.runtime.isolation import find_bwrap

ENVS = Path(__file__).resolve().parents[1] / "envs"
README = (ENVS / "README.md").read_text()
PACKAGES = sorted(p.name for p in ENVS.iterdir() if (p / "openenv.yaml").is_file())


def test_the_table_lists_every_package_and_nothing_else() -> None:
    listed = re.findall(r"^\| \[(\w+)\]\((\w+)\) \|", README, re.M)
    assert sorted(name for name, _ in listed) == PACKAGES
    assert all(name == link for name, link in listed)


def test_openenv_list_finds_every_package_of_the_catalogue() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "list", "--json"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    found = {Path(entry["path"]).name for entry in json.loads(out.stdout)}
    assert set(PACKAGES) <= found


@pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
def test_the_example_runs_as_written(tmp_path: Path) -> None:
    (code,) = re.findall(r"```python\n(.*?)```", README, re.S)
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Your cards: ") and "Dealer shows: " in lines[0]
    assert lines[-1].endswith(" True")  # STAND ends a blackjack hand
