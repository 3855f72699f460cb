"""``openenv validate``: check an environment package, or a running server, against OpenEnv's contract.

The checks are a library (:mod:`openenv.core.checks`); this command reads its arguments and
prints the report, as a table or as JSON."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import typer

from openenv.cli._common import CLIError, err, load_package, out, print_json, styled

_STYLES = {"passed": "green", "warning": "yellow", "failed": "bold red", "skipped": "dim"}
_MARKS = {"passed": "✓", "warning": "!", "failed": "✗", "skipped": "-"}
_URL_SCHEMES = ("http://", "https://", "ws://", "wss://", "unix:")


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def command(
        target: Optional[str] = typer.Argument(
            None, help="An environment package directory (default: the current one), or a running server's URL."
        ),
        json_output: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
        timeout: float = typer.Option(
            30.0,
            "--timeout",
            min=0.1,
            metavar="SECONDS",
            help="Seconds allowed for the import, the server start and each request.",
        ),
        runtime: bool = typer.Option(
            True, "--runtime/--no-runtime", help="Serve the package and check the live server (packages only)."
        ),
        sandbox: bool = typer.Option(
            True,
            "--sandbox/--no-sandbox",
            help="Serve the package in the bubblewrap sandbox (default) or as a plain process.",
        ),
        isolation: Optional[str] = typer.Option(None, "--isolation", hidden=True),  # before 0.11: sandbox|none
        action: Optional[str] = typer.Option(
            None,
            "--action",
            metavar="JSON",
            help="JSON of a valid step action (default: one generated from the action schema).",
        ),
    ) -> None:
        """Check an environment package (or a running server) and report each check.

        Static checks: manifest, layout, app, client, pyproject and Dockerfile. Then, serving the
        package in a sandbox (or at the URL given): /health, /schema, /metadata, reset/step/state over
        /ws, the answer to an invalid action, seeded determinism, concurrent sessions and MCP tools.

        Exit code 0 when no check failed (warnings allowed), 1 otherwise.
        """
        from openenv.core.checks import check_package, check_url

        if isolation is not None:
            if isolation not in ("sandbox", "none"):
                raise CLIError(f"--isolation must be 'sandbox' or 'none', not {isolation!r} (or use --no-sandbox)", 2)
            sandbox = isolation == "sandbox"
        step_action = _parse_action(action)
        progress = _progress_printer()
        with _sigterm_as_interrupt():
            if target and target.startswith(_URL_SCHEMES):
                report = check_url(
                    target, timeout_s=timeout, action=step_action, raise_on_failure=False, progress=progress
                )
            else:
                path = Path(target or ".").expanduser()
                if not path.is_dir():  # the name of an installed package (`echo`), or an error that says why not
                    try:
                        path = load_package(target, by_name=True).path
                    except CLIError as exc:
                        raise CLIError(str(exc), 2) from None
                report = check_package(
                    path,
                    timeout_s=timeout,
                    runtime=runtime,
                    isolation="sandbox" if sandbox else "none",
                    action=step_action,
                    raise_on_failure=False,
                    progress=progress,
                )
        if json_output:
            print_json(report.to_dict())
        else:
            _print_report(report)
        if not report.ok:
            raise typer.Exit(1)


def _parse_action(text: Optional[str]) -> Optional[Dict[str, Any]]:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CLIError(f"--action is not valid JSON: {exc}", code=2) from None
    if not isinstance(value, dict):
        raise CLIError('--action must be a JSON object, like \'{"message": "hi"}\'', code=2)
    return value


def _progress_printer() -> Any:
    def progress(message: str) -> None:
        err.print(styled("[dim]{}[/]", message))

    return progress


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the server this command started is stopped either way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print_report(report: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    kind = "package" if report.kind == "package" else "server"
    out.print(Text(f"openenv validate: {report.name or report.target} ({kind})", style="bold"))
    # No box and no header: one check a line (the detail wraps beside it), readable in 80-100 columns.
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    for check in report.checks:
        status = check.status.value
        first_line = check.detail.splitlines()[0] if check.detail else ""  # whole: it wraps, never cut
        table.add_row(Text(f"{_MARKS[status]} {status}", style=_STYLES[status]), check.id, Text(first_line))
    out.print(table)
    notable = [c for c in report.checks if c.status.value in ("failed", "warning")]
    for check in notable:
        out.print(Text(f"{check.status.value.upper()} {check.id}: ", style=_STYLES[check.status.value]), end="")
        out.print(Text(check.detail))
    counts = report.counts()
    verdict = Text("PASSED", style="bold green") if report.ok else Text("FAILED", style="bold red")
    summary = Text(
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['warning']} warnings, "
        f"{counts['skipped']} skipped: "
    )
    out.print(summary + verdict)
