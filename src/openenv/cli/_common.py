"""What every ``openenv`` command shares: consoles, errors, finding the environment package."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from rich.console import Console

from openenv.core.manifest import EnvManifest, ManifestError

# Messages and progress go to stderr; stdout carries only what a command produces (a URL, a
# JSON report), so `openenv list --json | jq` works.
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


class CLIError(Exception):
    """A failure the user can act on: printed as ``Error: <message>``, exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def load_package(path: Optional[str]) -> EnvManifest:
    """The environment package at ``path`` (default: the current directory), or a CLIError."""
    directory = Path(path or ".").expanduser()
    try:
        return EnvManifest.load(directory)
    except ManifestError as exc:
        raise CLIError(str(exc)) from None


def print_json(data: Any) -> None:
    """Write ``data`` as JSON on stdout (no colour, no wrapping)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()
