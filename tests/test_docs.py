"""The docs tell the truth about the files they name (the snippets themselves run through the
repository's conftest.py, with sybil)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python_blocks(path: Path) -> list:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_the_quickstart_file_is_the_readmes_quickstart() -> None:
    quickstart = (ROOT / "examples" / "echo_quickstart.py").read_text()
    assert quickstart.endswith(_python_blocks(ROOT / "README.md")[0])


def test_the_readme_stays_short_and_its_links_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_every_doc_link_to_a_file_of_this_repository_exists() -> None:
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            if not target.startswith("http"):
                assert (doc.parent / target).exists(), f"{doc.name}: {target}"
