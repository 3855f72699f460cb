"""``openenv``: the command line entry point (also ``python -m openenv.cli``)."""

from __future__ import annotations

import difflib
import sys
from typing import List, Optional

import typer

from openenv.cli._common import CLIError, err, out
from openenv.cli._help import WIDTH, PlainCommand, PlainGroup

app = typer.Typer(
    name="openenv",
    help="Create, serve, validate, build and publish OpenEnv environments.",
    cls=PlainGroup,
    rich_markup_mode=None,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": WIDTH},
)


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", is_eager=True, help="Print openenv's version and exit."),
) -> None:
    if version:
        import openenv

        out.print(f"openenv {openenv.__version__}", markup=False)
        raise typer.Exit()
    if ctx.invoked_subcommand is None:  # a bare `openenv`: what there is to run
        out.print(ctx.get_help(), markup=False)
        raise typer.Exit()


def _help(
    ctx: typer.Context,
    command: Optional[str] = typer.Argument(None, metavar="COMMAND", help="The command to describe."),
) -> None:
    """Show the help of COMMAND (or of openenv)."""
    root = ctx.find_root()
    if command is None:
        out.print(root.get_help(), markup=False)
        return
    found = root.command.get_command(root, command)
    if found is None:
        names = root.command.list_commands(root)
        near = difflib.get_close_matches(command, names, n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise CLIError(f"no command '{command}': {hint}the commands are {', '.join(names)}")
    out.print(found.get_help(typer.Context(found, info_name=command, parent=root)), markup=False)


def _register() -> None:
    from openenv.cli.commands import build, fork, init, list_envs, push, serve, validate

    for module in (init, serve, validate, build, push, list_envs, fork):
        module.register(app)
    app.command("help")(_help)
    for command in app.registered_commands:
        command.cls = PlainCommand


_register()


def main(argv: Optional[List[str]] = None) -> int:
    """Run the CLI; return its exit code (0 ok, 1 failure, 130 interrupted)."""
    try:
        code = app(args=argv, prog_name="openenv", standalone_mode=False)
    except CLIError as exc:
        err.print(f"[bold red]Error:[/] {exc}", markup=True, highlight=False)
        return exc.code
    except KeyboardInterrupt:
        err.print("Interrupted.")
        return 130
    except SystemExit as exc:  # typer.Exit inside commands
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Exception as exc:  # click's usage errors (typer's own copy of click, in typer >= 0.2x) and the unexpected
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            message = getattr(exc, "message", None)
            if isinstance(message, str):  # typer's value coercion prefixes pydantic's "Value error, "
                exc.message = message.removeprefix("Value error, ")  # type: ignore[attr-defined]
            exc.show()
            return exc.exit_code
        if type(exc).__name__ == "Abort":
            err.print("Aborted.")
            return 1
        err.print(f"[bold red]Error:[/] {type(exc).__name__}: {exc}")
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
