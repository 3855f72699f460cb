"""The echo package as a user meets it: its README example, run as written, and `openenv validate`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def test_the_readme_example_runs_as_written_and_prints_what_its_comments_say(tmp_path: Path) -> None:
    readme = (PACKAGE / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["Echo environment ready!", "Hi 0.2"]


def test_openenv_validate_passes_without_warnings() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "validate", str(PACKAGE), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    report = json.loads(result.stdout)
    assert report["passed"] is True
    assert [c["id"] for c in report["checks"] if c["status"] != "passed"] == []
