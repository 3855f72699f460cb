"""``openenv list``: the environment packages installed in this Python, as discovery sees them."""

from __future__ import annotations

from typing import Any, Dict, List

import typer
from rich.table import Table

from openenv.cli._common import out, print_json, styled


def installed() -> List[Dict[str, Any]]:
    """One record per installed environment package, sorted by name."""
    from openenv.core.discovery import discover_environments

    rows = []
    for key, info in sorted(discover_environments().items()):
        rows.append(
            {
                "name": key,
                "env_name": info.manifest.name,
                "distribution": info.distribution,
                "version": info.version,
                "module": info.module,
                "client": f"{info.module}.{info.client_class_name}",
                "action": info.action_class_name,
                "observation": info.observation_class_name,
                "description": info.manifest.description,
                "path": str(info.path),
            }
        )
    return rows


def register(app: typer.Typer) -> None:
    @app.command("list")
    def list_command(
        as_json: bool = typer.Option(False, "--json", help="Print the list as JSON (for scripts)."),
    ) -> None:
        """List installed environment packages ([bold]openenv-*[/] distributions with an openenv.yaml).

        These are the names [bold]AutoEnv.from_env(NAME)[/] and [bold]EnvClient.from_env(NAME)[/] accept.
        """
        rows = installed()
        if as_json:
            print_json(rows)
            return
        if not rows:
            out.print(styled("No environment packages installed. Create one with [bold]openenv init NAME[/]."))
            return
        out.print(f"{len(rows)} environment package{'s' if len(rows) != 1 else ''}:", markup=False)
        table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 2))  # no box: fits 80-100 columns
        for column in ("Name", "Version", "Client", "Path"):
            table.add_column(column, overflow="fold", no_wrap=column != "Path")
        for row in rows:
            table.add_row(row["name"], row["version"] or "-", row["client"], row["path"])
        out.print(table)
