"""``openenv``: the command line entry point (also ``python -m openenv.cli``)."""

from __future__ import annotations

import inspect
import sys
from typing import Any, List, Optional

import typer

from openenv.cli._common import CLIError, err

app = typer.Typer(
    name="openenv",
    help="Create, serve, validate, build and publish OpenEnv environments.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _register() -> None:
    from openenv.cli.commands import build, fork, init, list_envs, push, serve, validate

    for module in (init, serve, validate, build, push, list_envs, fork):
        module.register(app)
    for command in app.registered_commands:
        _name_the_values(command.callback)


def _name_the_values(callback: Any) -> None:
    """Help shows ``--tag TAG`` and a bare ``--json`` instead of typer's ``<str>`` and ``<bool>``."""
    for parameter in inspect.signature(callback).parameters.values():
        info = parameter.default
        if not isinstance(info, (typer.models.OptionInfo, typer.models.ArgumentInfo)) or info.metavar is not None:
            continue
        if isinstance(info, typer.models.OptionInfo) and isinstance(info.default, bool):
            info.metavar = ""
        else:
            info.metavar = parameter.name.upper()


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
    except Exception as exc:  # click's usage errors and the unexpected
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            return exc.exit_code
        if isinstance(exc, click.exceptions.Abort):
            err.print("Aborted.")
            return 1
        err.print(f"[bold red]Error:[/] {type(exc).__name__}: {exc}")
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
