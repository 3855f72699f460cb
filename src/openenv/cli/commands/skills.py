"""``openenv skills``: install the ``openenv-cli`` agent skill for coding agents.

A skill is a folder holding a ``SKILL.md`` (YAML front matter with its ``name`` and
``description``, then Markdown) that coding agents such as Claude Code, Codex, Cursor and OpenCode
read when a task matches the description. Ours tells an agent how to write, serve, validate and
use an OpenEnv environment with this release's commands; its text is the template
``templates/skills/SKILL.md.tmpl``, filled in with the version and the list of commands.

``openenv skills add`` writes the folder once, to ``.agents/skills/openenv-cli`` (in the working
directory, or the home directory with ``--global``), and links each selected agent's own skills
directory to it with a relative symbolic link, so that one copy serves every agent and moving the
project keeps the links working. ``--dest DIR`` writes ``DIR/openenv-cli`` instead, and nothing
else.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import typer

from openenv.cli._common import CLIError, err, out, styled
from openenv.cli._help import PlainCommand, PlainGroup, plain
from openenv.cli.commands.init import TEMPLATES_DIR, render
from openenv.core.utils import shown_path

SKILL_NAME = "openenv-cli"
SKILL_FILE = "SKILL.md"
SKILL_TEMPLATE = TEMPLATES_DIR / "skills" / "SKILL.md.tmpl"
SHARED_DIR = Path(".agents") / "skills"
"""Where the skill itself goes, under the project (or the home directory with ``--global``)."""


@dataclass(frozen=True)
class Agent:
    """A coding agent whose skills directory gets a link to the skill."""

    flag: str
    title: str
    local: Path
    """Its configuration directory in a project."""
    home: Path
    """Its configuration directory under the home directory (``--global``)."""


AGENTS: Tuple[Agent, ...] = (
    Agent("claude", "Claude Code", Path(".claude"), Path(".claude")),
    Agent("codex", "Codex", Path(".codex"), Path(".codex")),
    Agent("cursor", "Cursor", Path(".cursor"), Path(".cursor")),
    Agent("opencode", "OpenCode", Path(".opencode"), Path(".config") / "opencode"),
)


def render_skill(commands: List[Tuple[str, str]]) -> str:
    """The text of ``SKILL.md``: the template with this version and ``commands``
    (``(usage, what it does)`` pairs) filled in."""
    import openenv

    try:
        template = SKILL_TEMPLATE.read_text(encoding="utf-8")
    except OSError as exc:
        raise CLIError(
            f"cannot read the skill's template {SKILL_TEMPLATE}: the openenv installation is incomplete ({exc})"
        ) from None
    listed = "\n".join(f"* `{usage}`: {summary}" for usage, summary in commands)
    return render(template, {"version": openenv.__version__, "commands": listed})


def command_list(ctx: typer.Context) -> List[Tuple[str, str]]:
    """``(usage, summary)`` of every ``openenv`` command, as the running CLI has them."""
    rows: List[Tuple[str, str]] = []

    def walk(parent: typer.Context) -> None:
        group = parent.command
        for name in group.list_commands(parent):  # type: ignore[attr-defined]
            command = group.get_command(parent, name)  # type: ignore[attr-defined]
            if command is None or command.hidden or name == "help":
                continue
            context = typer.Context(command, info_name=name, parent=parent)
            if hasattr(command, "list_commands"):  # a group (`skills`): its commands, one by one
                walk(context)
                continue
            usage = " ".join([context.command_path, *command.collect_usage_pieces(context)])
            rows.append((usage, plain(command.get_short_help_str(limit=200))))

    walk(ctx.find_root())
    return rows


def install_targets(dest: Optional[Path], agents: List[Agent], is_global: bool) -> Tuple[Path, List[Path]]:
    """``(the skill's folder, the agents' links to it)`` for these options."""
    if dest is not None:
        return dest.expanduser() / SKILL_NAME, []
    base = Path.home() if is_global else Path.cwd()
    folder = base / SHARED_DIR / SKILL_NAME
    links = [base / (agent.home if is_global else agent.local) / "skills" / SKILL_NAME for agent in agents]
    return folder, links


def _occupied(path: Path) -> bool:
    return path.exists() or path.is_symlink()  # a dangling link occupies its name too


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def install(text: str, folder: Path, links: List[Path], force: bool) -> None:
    """Write ``text`` to ``folder/SKILL.md`` and point each of ``links`` at ``folder``.

    Nothing is written unless every target is free, or ``force`` allows replacing what is there."""
    for target in (folder, *links):
        if _occupied(target) and not force:
            raise CLIError(f"Skill already exists at {target}. Re-run with --force to overwrite.")
    try:
        for target in (folder, *links):
            if _occupied(target):
                _remove(target)
        folder.mkdir(parents=True)
        (folder / SKILL_FILE).write_text(text, encoding="utf-8")
        for link in links:
            link.parent.mkdir(parents=True, exist_ok=True)
            # relative: the project (or the home directory) can move and the links still hold
            link.symlink_to(os.path.relpath(folder, link.parent), target_is_directory=True)
    except OSError as exc:
        raise CLIError(f"could not install the skill: {exc}") from None


skills_app = typer.Typer(
    name="skills",
    help="Install the openenv-cli skill that teaches coding agents (Claude Code, Codex, Cursor, OpenCode) this CLI.",
    cls=PlainGroup,
    rich_markup_mode=None,
    add_completion=False,
    invoke_without_command=True,
)


@skills_app.callback()
def _skills(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:  # a bare `openenv skills`: what there is to run
        out.print(ctx.get_help())
        raise typer.Exit()


@skills_app.command("preview", cls=PlainCommand)
def preview(ctx: typer.Context) -> None:
    """Print the SKILL.md that `openenv skills add` installs."""
    sys.stdout.write(render_skill(command_list(ctx)))
    sys.stdout.flush()


@skills_app.command("add", cls=PlainCommand)
def add(
    ctx: typer.Context,
    claude: bool = typer.Option(False, "--claude", help="Link it into Claude Code's skills (.claude/skills)."),
    codex: bool = typer.Option(False, "--codex", help="Link it into Codex's skills (.codex/skills)."),
    cursor: bool = typer.Option(False, "--cursor", help="Link it into Cursor's skills (.cursor/skills)."),
    opencode: bool = typer.Option(
        False,
        "--opencode",
        help="Link it into OpenCode's skills (.opencode/skills; ~/.config/opencode/skills with -g).",
    ),
    is_global: bool = typer.Option(
        False, "--global", "-g", help="Install under the home directory (~/.agents/skills) rather than here."
    ),
    dest: Optional[Path] = typer.Option(
        None,
        "--dest",
        metavar="DIR",
        help="Write DIR/openenv-cli/SKILL.md and nothing else (not with the agent flags or --global).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace a skill (or link) already there."),
) -> None:
    """Install the openenv-cli skill: .agents/skills/openenv-cli/SKILL.md, linked into each agent named.

    The skill is written once, in the working directory's .agents/skills (the home directory's with --global); each agent flag adds a relative symbolic link to it from that agent's skills directory. An existing skill or link is left alone unless --force is given.
    """
    chosen: Dict[str, bool] = {"claude": claude, "codex": codex, "cursor": cursor, "opencode": opencode}
    agents = [agent for agent in AGENTS if chosen[agent.flag]]
    if dest is not None and (agents or is_global):
        others = [f"--{agent.flag}" for agent in agents] + (["--global"] if is_global else [])
        raise CLIError(
            f"--dest cannot be combined with {', '.join(others)}: --dest writes the skill into DIR only; "
            "drop --dest to install it for those agents"
        )
    folder, links = install_targets(dest, agents, is_global)
    install(render_skill(command_list(ctx)), folder, links, force)
    err.print(styled("[green]Installed[/] the {} skill in {}", SKILL_NAME, shown_path(folder)))
    for agent, link in zip(agents, links, strict=True):
        err.print(f"  {agent.title}: {shown_path(link)} -> {os.readlink(link)}")
    out.print(os.path.abspath(folder / SKILL_FILE))


def register(app: typer.Typer) -> None:
    app.add_typer(skills_app)
