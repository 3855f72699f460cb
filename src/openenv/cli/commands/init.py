"""``openenv init``: create a new environment package from a template.

Templates live in ``openenv/cli/templates/``: ``common/`` holds the files every package gets,
``typed/`` and ``mcp/`` the rest. Each file ends in ``.tmpl`` (so that no tool mistakes it for
code) and contains ``{{placeholder}}`` markers, in its text and in its path, that
:func:`render` fills in.
"""

from __future__ import annotations

import keyword
import re
import shlex
import shutil
import sys
import zlib
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import typer

from openenv.cli._common import CLIError, err, styled
from openenv.core.discovery import normalize

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
TEMPLATE_SUFFIX = ".tmpl"
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_NAME = re.compile(r"[a-z][a-z0-9_]*")


class TemplateKind(str, Enum):
    """The kinds of environment ``openenv init`` can create."""

    typed = "typed"
    mcp = "mcp"


@dataclass(frozen=True)
class _Template:
    description: str
    dependencies: Tuple[str, ...]


_TEMPLATES: Dict[TemplateKind, _Template] = {
    TemplateKind.typed: _Template("Echoes messages back and rewards their length.", ()),
    # FastMCP's server, as `fastmcp` rather than `openenv[core]` (an extra upstream 0.10 does not
    # have). From 3.3 on, `fastmcp` is a thin package over fastmcp-slim, which this OpenEnv's `core`
    # extra installs: the `fastmcp` module then comes from one distribution whichever OpenEnv is
    # installed (upstream 0.10 itself requires fastmcp>=3,<4).
    TemplateKind.mcp: _Template("MCP tools that echo messages and roll seeded dice.", ("fastmcp>=3.3,<5",)),
}

# Names a package may not take although Python would accept them: it would shadow (or be shadowed
# by) a module that OpenEnv, its servers or its tests import, or a top-level name the package's
# own layout uses when served from its directory (``server.app:app`` imports ``models``).
_TAKEN = frozenset(
    {
        "openenv",
        "anyio",
        "click",
        "docker",
        "fastapi",
        "fastmcp",
        "httpx",
        "mcp",
        "pydantic",
        "rich",
        "starlette",
        "typer",
        "uvicorn",
        "websockets",
        "yaml",
        "pip",
        "pytest",
        "setuptools",
        "wheel",
        "datasets",
        "gym",
        "gymnasium",
        "huggingface_hub",
        "numpy",
        "ray",
        "requests",
        "torch",
        "transformers",
        "trl",
        "client",
        "models",
        "server",
        "tests",
    }
)

_EMOJIS = ("🎯", "🧩", "🎲", "🚀", "🤖", "🧪", "🕹️", "🌱", "🔭", "🪐", "🦾", "🧭")
_COLORS = ("red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray")


def check_name(name: str) -> None:
    """Raise :class:`CLIError` unless ``name`` can be the package's import name."""
    if not name.strip():
        raise CLIError("the environment name is empty: give the package's import name, e.g. openenv init my_env")
    example = _suggest(name)
    if not _NAME.fullmatch(name):
        raise CLIError(
            f"{name!r} cannot be an environment name: use lowercase letters, digits and underscores, "
            f"starting with a letter (e.g. {example})"
        )
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise CLIError(f"{name!r} is a Python keyword and cannot name a package: pick another name (e.g. {example})")
    # sys.stdlib_module_names leaves out the standard library's own `test` package
    if name in sys.stdlib_module_names or name in sys.builtin_module_names or name == "test":
        raise CLIError(
            f"{name!r} would shadow the standard library module {name!r}: pick another name (e.g. {example})"
        )
    if name in _TAKEN:
        raise CLIError(
            f"{name!r} would clash with the module {name!r} that OpenEnv uses: pick another name (e.g. {example})"
        )


def _suggest(name: str) -> str:
    words = re.sub(r"[^a-z0-9]+", "_", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()).strip("_")
    if not words or not words[0].isalpha():
        words = f"env_{words}".rstrip("_")
    return words if words.endswith("_env") else f"{words}_env"


def placeholders(name: str, template: TemplateKind) -> Dict[str, str]:
    """The values of the ``{{placeholder}}`` markers for package ``name``."""
    key = normalize(name)
    prefix = "".join(part.capitalize() for part in key.split("_") if part)
    spec = _TEMPLATES[template]
    dependencies = (_openenv_requirement(), *spec.dependencies)
    # The Space's look is picked from the name, so that rendering the same name twice gives
    # the same files.
    digest = zlib.crc32(name.encode())
    color_from = digest % len(_COLORS)
    color_to = (color_from + 1 + (digest >> 8) % (len(_COLORS) - 1)) % len(_COLORS)
    return {
        "name": name,
        "key": key,
        "prefix": prefix,
        "title": " ".join(part.capitalize() for part in key.split("_") if part),
        "dist_name": "openenv-" + name.replace("_", "-"),
        "image": "openenv-" + key,
        "description": spec.description,
        "dependencies": ", ".join(f'"{d}"' for d in dependencies),
        "emoji": _EMOJIS[digest % len(_EMOJIS)],
        "color_from": _COLORS[color_from],
        "color_to": _COLORS[color_to],
    }


# The oldest OpenEnv the templates work with. They use only API that upstream OpenEnv 0.10 (on
# PyPI) and this distribution share, so a generated package installs from PyPI as it is, and
# against this OpenEnv where it is installed (scripts/template-interop.sh runs the generated
# tests under both).
OLDEST_OPENENV = "0.10"


def _openenv_requirement() -> str:
    return f"openenv>={OLDEST_OPENENV}"


def render(text: str, values: Dict[str, str]) -> str:
    """``text`` with every ``{{key}}`` replaced by ``values[key]``; an unknown key is an error."""

    def substitute(match: re.Match) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"unknown template placeholder {{{{{key}}}}}")
        return values[key]

    return _PLACEHOLDER.sub(substitute, text)


def render_template(name: str, template: TemplateKind) -> Dict[str, str]:
    """The package's files, ``{relative path: content}``, without writing anything."""
    values = placeholders(name, template)
    files: Dict[str, str] = {}
    for layer in ("common", template.value):
        root = TEMPLATES_DIR / layer
        for source in sorted(root.rglob(f"*{TEMPLATE_SUFFIX}")):
            relative = source.relative_to(root).as_posix()[: -len(TEMPLATE_SUFFIX)]
            files[render(relative, values)] = render(source.read_text(encoding="utf-8"), values)
    if not files:
        raise CLIError(f"no templates found in {TEMPLATES_DIR}: the openenv installation is incomplete")
    return files


def create_package(name: str, template: TemplateKind = TemplateKind.typed, output_dir: Path = Path(".")) -> List[Path]:
    """Write package ``name`` into ``output_dir/name``; return the files written.

    The target must not exist or be an empty directory. If anything fails, whatever this
    call created is removed again.
    """
    check_name(name)
    output = Path(output_dir).expanduser()
    # The first part of --output-dir that exists must be a directory for anything to go under it.
    existing = next((p for p in (output, *output.parents) if p.exists() or p.is_symlink()), None)
    if existing is not None and not existing.is_dir():
        raise CLIError(
            f"--output-dir {output}: {existing} exists and is not a directory; "
            "give a directory (or a path to create) as --output-dir"
        )
    target = output / name
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise CLIError(f"{target} exists and is not a directory: choose another name or --output-dir")
        if any(target.iterdir()):
            raise CLIError(
                f"{target} already exists and is not empty: choose another name or --output-dir, or remove it"
            )
    files = render_template(name, template)

    first_created = _first_missing(target)
    written: List[Path] = []
    try:
        target.mkdir(parents=True, exist_ok=True)
        for relative, content in files.items():
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            _write(path, content)
            written.append(path)
    except BaseException as exc:
        if first_created is not None:
            shutil.rmtree(first_created, ignore_errors=True)
        else:  # the target was an empty directory: empty it again
            for child in list(target.iterdir()):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise CLIError(f"could not create {target}: {exc} (nothing was left behind)") from exc
        raise
    return written


def _first_missing(path: Path) -> Optional[Path]:
    """The outermost directory of ``path`` that does not exist yet (None when ``path`` exists)."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def _write(path: Path, content: str) -> None:
    path.write_text(content, encoding="utf-8")


def _shown(path: Path) -> str:
    """``path`` as the user would type it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path.resolve())


def register(app: typer.Typer) -> None:
    @app.command("init")
    def command(
        name: str = typer.Argument(
            ...,
            metavar="NAME",
            help="Import name of the new package, e.g. my_env: lowercase letters, digits and underscores.",
            show_default=False,
        ),
        template: TemplateKind = typer.Option(
            TemplateKind.typed,
            "--template",
            "-t",
            help="typed: your own Action/Observation models and EnvClient; mcp: an MCPEnvironment whose actions are tool calls.",
            case_sensitive=False,
        ),
        output_dir: Path = typer.Option(
            Path("."),
            "--output-dir",
            "-o",
            help="Directory to create the package in (as OUTPUT_DIR/NAME); created if missing.",
        ),
    ) -> None:
        """Create a new environment package NAME, ready to install, test, serve and deploy.

        The package has a manifest (openenv.yaml), models, a client, a server (environment, app
        and Dockerfile), tests that start the real server, and a README that doubles as a Hugging
        Face Space card. Its reset(seed=...) is reproducible and it serves several sessions at once.
        """
        written = create_package(name, template, output_dir)
        target = Path(output_dir).expanduser() / name
        shown = _shown(target)
        err.print(styled("[bold green]Created[/] {}/ from the [bold]{}[/] template:", shown, template.value))
        for path in sorted(written):
            err.print(f"  {_shown(path)}")
        err.print(styled("\n[bold]Next steps:[/]"))
        for step in (
            f"pip install -e {shlex.quote(shown + '[dev]')}",
            f"pytest {shlex.quote(str(Path(shown) / 'tests'))}",
            f"openenv serve {shlex.quote(shown)}",
            f"openenv validate {shlex.quote(shown)}",
        ):
            err.print(f"  {step}")
