"""What every ``openenv`` command shares: consoles, errors, finding the environment package."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.text import Text

from openenv.core.manifest import EnvManifest, ManifestError

# Messages and progress go to stderr; stdout carries only what a command produces (a URL, a
# JSON report), so `openenv list --json | jq` works. Both print strings as they are (no markup, no
# :emoji: codes):
# messages carry paths, package names, exception texts and install hints such as
# `pip install 'openenv[hub]'`, which rich would otherwise read as markup and cut. Deliberate
# styling goes through `styled`, which keeps the values it fills in as plain text.
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)
out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)

_SLOT = "\ue000"  # a private-use character: stands for one `{}` of a template while it is parsed


class CLIError(Exception):
    """A failure the user can act on: printed as ``Error: <message>``, exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def styled(template: str, *values: object) -> Text:
    """``template``'s rich markup (``"[bold]Serving[/] {} at {}"``) with each ``{}`` filled in by
    the next of ``values`` as plain text: a value's ``[hub]`` or ``[/]`` is printed, never read as
    markup. A value takes the style of the markup around its ``{}``."""
    if template.count("{}") != len(values):
        raise ValueError(f"{template!r} has {template.count('{}')} {{}} for {len(values)} values")
    parsed = Text.from_markup(template.replace("{}", _SLOT))
    result = Text()
    start = 0
    remaining = iter(values)
    for index, char in enumerate(parsed.plain):
        if char == _SLOT:
            result.append_text(parsed[start:index])
            style = " ".join(str(span.style) for span in parsed.spans if span.start <= index < span.end)
            result.append(str(next(remaining)), style=style or None)
            start = index + 1
    result.append_text(parsed[start:])
    return result


def print_error(message: object) -> None:
    """``Error: <message>`` on stderr, the message as plain text."""
    err.print(styled("[bold red]Error:[/] {}", message))


def load_package(path: Optional[str], *, by_name: bool = False) -> EnvManifest:
    """The environment package at ``path`` (default: the current directory), or a CLIError.

    With ``by_name``, a ``path`` that names nothing on disk and looks like a name (``echo``,
    ``echo_env``: no directory separator) is looked up among the installed environment packages,
    as ``openenv list`` shows them."""
    directory = Path(path or ".").expanduser()
    if by_name and path and not (directory.exists() or directory.is_symlink()) and _is_name(path):
        from openenv.core.discovery import resolve_environment

        try:
            return resolve_environment(path).manifest
        except ValueError as exc:
            raise CLIError(f"{path} is not a directory, and {exc}") from None
    try:
        return EnvManifest.load(directory)
    except ManifestError as exc:
        named = by_name and not directory.is_dir()
        hint = " (give a package's directory, or the name of an installed one: openenv list)" if named else ""
        raise CLIError(f"{exc}{hint}") from None


def _is_name(text: str) -> bool:
    return bool(text.strip()) and os.sep not in text and "/" not in text and not text.startswith((".", "~"))


def print_json(data: Any) -> None:
    """Write ``data`` as JSON on stdout (no colour, no wrapping)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()
