"""``openenv fork``: duplicate a Hugging Face Space (an environment) into your namespace."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import typer

from openenv.cli import _publish
from openenv.cli._common import err, out, styled


def _entries(values: Dict[str, str]) -> Optional[List[Dict[str, str]]]:
    return [{"key": key, "value": value} for key, value in values.items()] or None


def fork_space(
    api: Any,
    source: str,
    repo_id: Optional[str],
    *,
    private: bool = False,
    variables: Optional[Dict[str, str]] = None,
    secrets: Optional[Dict[str, str]] = None,
    hardware: Optional[str] = None,
) -> str:
    """Duplicate the Space ``source`` (``ORG/NAME``) as ``repo_id`` (default: the same name in the
    token owner's namespace); return the new Space's URL.

    Uses ``HfApi.duplicate_repo(repo_type="space")`` where the installed ``huggingface_hub`` has
    it (2.x), ``HfApi.duplicate_space`` otherwise (0.x and 1.x).
    """
    source = _publish.space_id(source)
    user = _publish.hub_user(api)
    target = _publish.resolve_repo_id(repo_id, source.split("/", 1)[1], user)
    visibility = True if private else None  # None: the same as the source's
    try:
        if hasattr(api, "duplicate_repo"):
            url = api.duplicate_repo(
                source,
                target,
                repo_type="space",
                private=visibility,
                space_hardware=hardware,
                space_variables=_entries(variables or {}),
                space_secrets=_entries(secrets or {}),
            )
        else:
            url = api.duplicate_space(
                source,
                to_id=target,
                private=visibility,
                hardware=hardware,
                variables=_entries(variables or {}),
                secrets=_entries(secrets or {}),
            )
    except Exception as exc:
        raise _publish.hub_error(exc, f"duplicating the Space {source} as {target}") from None
    return str(url) if url else f"https://huggingface.co/spaces/{target}"


def register(app: typer.Typer) -> None:
    @app.command("fork")
    def command(
        space: str = typer.Argument(..., help="The Space to duplicate: ORG/NAME or its URL."),
        repo_id: Optional[str] = typer.Option(
            None, "--repo-id", "-r", help="The new Space: ORG/NAME, or NAME in your namespace (default: the same NAME)."
        ),
        private: bool = typer.Option(False, "--private", help="Make the new Space private (default: as the source)."),
        set_env: Optional[List[str]] = typer.Option(
            None, "--set-env", "-e", metavar="KEY=VALUE", help="A public variable of the new Space; repeat for more."
        ),
        set_secret: Optional[List[str]] = typer.Option(
            None,
            "--set-secret",
            "--secret",
            "-s",
            metavar="KEY=VALUE",
            help="A secret of the new Space; repeat for more.",
        ),
        hardware: str = typer.Option(
            "cpu-basic", "--hardware", "-H", metavar="FLAVOR", help="The new Space's hardware."
        ),
    ) -> None:
        """Duplicate a Hugging Face Space; prints the new Space's URL on stdout."""
        variables = _publish.parse_assignments(set_env, "--set-env")
        secrets = _publish.parse_assignments(set_secret, "--set-secret", secret=True)
        api = _publish.hf_api()
        url = fork_space(api, space, repo_id, private=private, variables=variables, secrets=secrets, hardware=hardware)
        extras = []
        if variables:
            extras.append(f"variables {', '.join(sorted(variables))}")
        if secrets:
            extras.append(f"secrets {', '.join(sorted(secrets))}")
        detail = f" with {' and '.join(extras)}" if extras else ""
        err.print(styled("[green]Forked[/] {} on {}{}.", _publish.space_id(space), hardware, detail))
        out.print(url, markup=False)
