"""``openenv``: the command line entry point (also ``python -m openenv.cli``)."""

from __future__ import annotations

import difflib
import gc
import logging
import os
import signal
import sys
import threading
import traceback
from types import FrameType
from typing import Any, Callable, List, Optional, Union

import typer

from openenv.cli._common import CLIError, err, out, print_error
from openenv.cli._help import WIDTH, PlainCommand, PlainGroup

DEBUG_ENV = "OPENENV_DEBUG"
"""Set to 1 (or pass ``openenv --debug``) for the traceback of an unexpected error or a Ctrl-C."""
_TRUE = ("1", "true", "yes", "on")

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
    debug: bool = typer.Option(
        False,
        "--debug",
        help=f"Show the traceback of an unexpected error, or of where Ctrl-C stopped a command (or set {DEBUG_ENV}=1).",
    ),
) -> None:
    if debug:
        _run.debug = True
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
    from openenv.cli.commands import build, collect, evaluate, fork, init, list_envs, push, serve, skills, validate

    for module in (init, serve, validate, build, push, list_envs, fork, collect, evaluate, skills):
        module.register(app)
    app.command("help")(_help)
    for command in app.registered_commands:
        command.cls = PlainCommand


_register()


class _Run:
    """What :func:`main` learns while a command runs: whether to show tracebacks, and whether a
    Ctrl-C arrived (click turns the KeyboardInterrupt into a bare exit code 130)."""

    def __init__(self) -> None:
        self.debug = False
        self.interrupted = False

    def reset(self) -> None:
        self.debug = os.environ.get(DEBUG_ENV, "").strip().lower() in _TRUE
        self.interrupted = False

    def on_sigint(self, signum: int, frame: Optional[FrameType]) -> None:
        # Raised where the command is, as Python's own handler does. Being a handler of our own
        # also keeps asyncio.run from turning Ctrl-C into a task cancellation, which httpx reports
        # as a ReadTimeout that a command may take for an answer.
        self.interrupted = True
        if self.debug:
            err.print("Interrupted here:")
            traceback.print_stack(frame, file=sys.stderr)
        raise KeyboardInterrupt

    def quiet_after_interrupt(self, record: logging.LogRecord) -> bool:
        """A filter for asyncio's logger: after a Ctrl-C, its complaints about the tasks it ended
        (a KeyboardInterrupt that reached a task group, say) are not news (``--debug`` keeps them)."""
        return self.debug or not self.interrupted


_run = _Run()

_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, None]


def _own_sigint() -> Optional[_Handler]:
    """Install :meth:`_Run.on_sigint`; return the handler to put back (None: nothing was changed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:  # a program embedding main() chose its own
        return None
    signal.signal(signal.SIGINT, _run.on_sigint)
    return previous


def _interrupted() -> int:
    if not _run.debug:
        # A Ctrl-C can land inside a constructor (asyncio's transports, say); the half-built
        # object's __del__ then fails when it is collected, here or at exit, and Python prints
        # "Exception ignored in ..." after our last line. Such leftovers are not news.
        sys.unraisablehook = _ignore_unraisable
    gc.collect()
    err.print("Interrupted.")
    return 130


def _ignore_unraisable(unraisable: Any) -> None:
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """Run the CLI; return its exit code (0 ok, 1 failure, 130 interrupted).

    Whatever goes wrong ends in one line on stderr and a non-zero code: a :class:`CLIError` as
    ``Error: <message>``, Ctrl-C as ``Interrupted.``, an unexpected exception as its type and text
    (its traceback too with ``openenv --debug`` or ``OPENENV_DEBUG=1``)."""
    _run.reset()
    previous = _own_sigint()
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addFilter(_run.quiet_after_interrupt)
    try:
        code = app(args=argv, prog_name="openenv", standalone_mode=False)
    except CLIError as exc:
        print_error(exc)
        return exc.code
    except KeyboardInterrupt:  # outside a command (click answers one inside with exit code 130)
        return _interrupted()
    except SystemExit as exc:  # typer.Exit inside commands
        if _run.interrupted:
            return _interrupted()
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Exception as exc:  # click's usage errors (typer's own copy of click, in typer >= 0.2x) and the unexpected
        if _run.interrupted:  # what the Ctrl-C left behind (a cancelled request's error, say)
            return _interrupted()
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            message = getattr(exc, "message", None)
            if isinstance(message, str):  # typer's value coercion prefixes pydantic's "Value error, "
                exc.message = message.removeprefix("Value error, ")  # type: ignore[attr-defined]
            exc.show()
            return exc.exit_code
        if type(exc).__name__ == "Abort":
            if isinstance(exc.__context__, KeyboardInterrupt):
                return _interrupted()
            err.print("Aborted.")
            return 1
        if _run.debug:
            traceback.print_exception(exc, file=sys.stderr)
        hint = "" if _run.debug else f" (for the traceback: openenv --debug, or {DEBUG_ENV}=1)"
        print_error(f"unexpected {type(exc).__name__}: {exc}{hint}")
        return 1
    except BaseException:  # a KeyboardInterrupt that reached a task group comes out of it in a group
        if _run.interrupted:
            return _interrupted()
        raise
    finally:
        asyncio_log.removeFilter(_run.quiet_after_interrupt)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if _run.interrupted:  # (click answers a Ctrl-C with 130; a command may have caught it and failed)
        return _interrupted()
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
