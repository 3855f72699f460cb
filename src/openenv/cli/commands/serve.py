"""``openenv serve``: run an environment package's server, sandboxed, behind a TCP address.

The command reads its options, makes the server's environment (:func:`_server_env`) and runs a
:class:`~openenv.core.containers.runtime.package_server.PackageServer`, printing what it reports
and its failures with what to do about them."""

from __future__ import annotations

import ast
import errno
import importlib.util
import ipaddress
import os
import secrets
import sys
from pathlib import Path
from typing import Any, ContextManager, Dict, List, Optional

import typer

from openenv.cli._common import CLIError, err, load_package, styled
from openenv.core.checks.dependencies import missing_module_help
from openenv.core.containers.runtime.package_server import (
    CannotListen,
    PackageServer,
    Reporter,
    SandboxUnavailable,
    ServeError,
)
from openenv.core.env_server.settings import read as read_setting
from openenv.core.manifest import EnvManifest
from openenv.core.utils import is_local_host


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        path: str = typer.Argument(
            ".",
            metavar="PATH",
            help="The environment package: a directory with openenv.yaml, or the name of an installed one (openenv list).",
        ),
        host: str = typer.Option(
            "127.0.0.1",
            "--host",
            metavar="HOST",
            help="Address to listen on; 0.0.0.0 accepts remote clients (their error answers carry no exception texts unless --env OPENENV_ERROR_DETAILS=1).",
        ),
        port: int = typer.Option(
            8000, "--port", "-p", metavar="PORT", help="TCP port to listen on (0 picks a free one)."
        ),
        sandbox: bool = typer.Option(
            True,
            "--sandbox/--no-sandbox",
            metavar="",
            help="Run the server in the bubblewrap sandbox (default) or as a plain process.",
        ),
        reload: bool = typer.Option(
            False, "--reload", metavar="", help="Restart the server when the package's files change."
        ),
        max_sessions: Optional[int] = typer.Option(
            None,
            "--max-sessions",
            min=1,
            metavar="N",
            help="Concurrent sessions the server holds (default: what the app says).",
        ),
        network: bool = typer.Option(
            False, "--network", metavar="", help="Let the sandboxed server reach the network."
        ),
        memory_mb: int = typer.Option(
            2048, "--memory-mb", min=64, metavar="MB", help="Memory limit of the sandboxed server."
        ),
        workers: int = typer.Option(
            1,
            "--workers",
            "-w",
            min=1,
            metavar="N",
            help="Sandboxed server processes behind the one address (each holds --max-sessions); see docs/scale.md.",
        ),
        env: List[str] = typer.Option(
            [], "--env", "-e", metavar="KEY=VALUE", help="KEY=VALUE for the server's environment (repeatable)."
        ),
        web: bool = typer.Option(
            False,
            "--web",
            metavar="",
            help="Also serve the web playground at http://HOST:PORT/web/ (ENABLE_WEB_INTERFACE=1).",
        ),
    ) -> None:
        """Serve an environment on [bold]http://HOST:PORT[/], in the sandbox unless told otherwise.

        The server runs isolated (its own namespaces, no network, a read-only system, memory and process limits) and listens on a Unix socket; this command forwards TCP connections to it, prints the server's log and a client snippet to paste. Ctrl-C stops everything. With OPENENV_AUTH_TOKEN set, the server requires it as a bearer token from every client.
        """
        if reload and workers > 1:
            raise CLIError(
                "--reload restarts one server process; it does not go with --workers: "
                "develop with one (drop --workers), serve with many (drop --reload)"
            )
        manifest = load_package(path, by_name=True)
        server = PackageServer(
            manifest,
            host,
            port,
            sandbox=sandbox,
            reload=reload,
            env_vars=_server_env(host, env, max_sessions, web),
            network=network,
            memory_mb=memory_mb,
            workers=workers,
            reporter=_Console(),
        )
        try:
            status = server.run()
        except ServeError as exc:
            raise _cli_error(exc, manifest) from None
        raise typer.Exit(status)


_TOKEN_VARIABLES = (
    "OPENENV_AUTH_TOKEN",
    "OPENENV_GRADER_TOKEN",
    "OPENENV_OBSERVER_TOKEN",
)
"""The roles' tokens (docs/roles.md) this shell gives the server: a token file
(``OPENENV_AUTH_TOKEN_FILE``...) is read here, as the sandboxed server cannot read this machine's files."""


def _server_env(host: str, pairs: List[str], max_sessions: Optional[int], web: bool = False) -> Dict[str, str]:
    """The server's environment variables: ``--env`` pairs and what the options imply."""
    env_vars = _parse_env(pairs)
    if max_sessions is not None:
        env_vars["OPENENV_MAX_SESSIONS"] = str(max_sessions)
    if web:
        env_vars["ENABLE_WEB_INTERFACE"] = "1"
    if not is_local_host(host):
        # Every client reaches the server through this command's forwarder, on a Unix socket,
        # so the server would take them all for local ones and send them exception texts.
        env_vars.setdefault("OPENENV_ERROR_DETAILS", "0")
    for name in _TOKEN_VARIABLES:  # handed on in the environment, never on a command line
        token = read_setting(os.environ, name[len("OPENENV_") :].lower())  # (or from its *_FILE)
        if isinstance(token, str) and token:
            env_vars.setdefault(name, token)
    # One snapshot key for the workers of --workers and for every reload of this command's server:
    # the shell's, or one drawn now (a snapshot is then restorable until this command stops).
    env_vars.setdefault("OPENENV_SNAPSHOT_KEY", os.environ.get("OPENENV_SNAPSHOT_KEY") or secrets.token_hex(32))
    for name in ("OPENENV_ALLOWED_HOSTS", "OPENENV_ALLOWED_ORIGINS"):  # what browsers may use: this shell's say
        if os.environ.get(name, "").strip():
            env_vars.setdefault(name, os.environ[name])
    if not _is_address(host) and host != "localhost":
        # served under a name of its own (--host env.lan): browsers may use it by that name
        named = [part for part in env_vars.get("OPENENV_ALLOWED_HOSTS", "").split(",") if part.strip()]
        env_vars["OPENENV_ALLOWED_HOSTS"] = ",".join([*named, host])
    return env_vars


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def _parse_env(pairs: List[str]) -> Dict[str, str]:
    values: Dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CLIError(f"--env takes KEY=VALUE, got {pair!r}")
        values[key.strip()] = value
    return values


class _Console(Reporter):
    """What the command tells its user while it serves: on stderr, but the URL and the client
    snippet, which go to stdout."""

    def starting(self, server: PackageServer) -> ContextManager[Any]:
        mode = "sandboxed" if server.sandbox else "WITHOUT isolation"
        if server.workers > 1:
            return err.status(styled("Starting {} processes of {} ({})...", server.workers, server.manifest.name, mode))
        return err.status(styled("Starting {} ({})...", server.manifest.name, mode))

    def serving(self, server: PackageServer, host: str, port: int) -> None:
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        url = f"http://{shown}:{port}"
        isolation = (
            f"sandboxed: {'with' if server.network else 'no'} network, {server.memory_mb} MiB memory limit"
            if server.sandbox
            else "NOT isolated: it can reach this machine's files and network"
        )
        workers = f", {server.workers} processes" if server.workers > 1 else ""
        err.print(
            styled("[bold green]Serving[/] {} at [bold]{}[/] ({}{})", server.manifest.name, url, isolation, workers)
        )
        if server.env_vars.get("ENABLE_WEB_INTERFACE", "").lower() in ("1", "true", "yes", "on"):
            err.print(styled("Play it in a browser: [bold]{}/web/[/]", url))
        token = server.env_vars.get("OPENENV_AUTH_TOKEN")
        if token:
            err.print(
                styled(
                    "Clients must send [bold]Authorization: Bearer $OPENENV_AUTH_TOKEN[/] (add headers= to the snippet)."
                )
            )
        elif host in ("0.0.0.0", "::"):
            err.print(
                styled(
                    "[yellow]Listening on every interface: anyone who can reach this machine can use it[/] "
                    "(set OPENENV_AUTH_TOKEN to require a token)."
                )
            )
        err.print("Paste this into Python to use it (Ctrl-C here stops the server):\n")
        sys.stdout.write(f"{url}\n\n{client_snippet(server.manifest.path, url)}\n\n")
        sys.stdout.flush()

    def changed(self, server: PackageServer, names: List[str]) -> None:
        err.print(styled("[yellow]Changed:[/] {}; restarting the server...", ", ".join(names)))

    def reload_failed(self, server: PackageServer, error: ServeError) -> None:
        err.print(
            styled(
                "[bold red]The changed code does not start[/] (still serving the previous one):\n{}",
                _cli_error(error, server.manifest),
            )
        )

    def reloaded(self, server: PackageServer) -> None:
        err.print(styled("[green]Reloaded.[/]"))

    def stopping(self, server: PackageServer) -> None:
        err.print("Stopping...")

    def stopped(self, server: PackageServer) -> None:
        err.print("Stopped.")


def _cli_error(error: ServeError, manifest: EnvManifest) -> CLIError:
    """``error`` with what to do about it, in the command's words."""
    if isinstance(error, SandboxUnavailable):
        return CLIError(f"{error}\n(or serve without isolation: --no-sandbox)")
    if isinstance(error, CannotListen):
        if error.error.errno == errno.EADDRINUSE:
            return CLIError(
                f"port {error.port} on {error.host} is in use; pick another with --port (0 picks a free one)"
            )
        return CLIError(str(error))
    message = str(error)
    advice = missing_module_help(message, manifest.name, manifest.path)  # a module it could not import
    return CLIError(f"{message}\n{advice}" if advice else message)


# --- the client snippet ---------------------------------------------------------------------------

_MCP_BASES = {"MCPToolClient", "MCPClientBase"}


def _client_class(package_dir: Path) -> Optional[tuple]:
    """``(class name, is_mcp)`` of the package's client in ``client.py`` (read, not imported)."""
    source = package_dir / "client.py"
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError):
        return None
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = {ast.unparse(b).split("[")[0].split(".")[-1] for b in node.bases}
            if bases & (_MCP_BASES | {"EnvClient"}):
                found.append((node.name, bool(bases & _MCP_BASES)))
    return found[0] if found else None


def client_snippet(package_dir: Path, url: str) -> str:
    """Python that connects to ``url`` with the package's own client (or the generic one)."""
    module = package_dir.name
    client = _client_class(package_dir)
    lines: List[str] = []
    if client is not None and module.isidentifier():
        name, is_mcp = client
        if importlib.util.find_spec(module) is None:
            lines.append(f"# first: pip install -e {package_dir}")
        lines.append(f"from {module} import {name}")
        lines.append("")
        lines.append(f'with {name}(base_url="{url}").sync() as env:')
        lines.append("    result = env.reset()")
        lines.append("    print(result.observation)")
        if is_mcp:
            lines.append("    print([tool.name for tool in env.list_tools()])")
    else:
        lines.append("from openenv.core import GenericEnvClient")
        lines.append("")
        lines.append(f'with GenericEnvClient(base_url="{url}").sync() as env:')
        lines.append("    result = env.reset()")
        lines.append("    print(result.observation)")
    return "\n".join(lines)
