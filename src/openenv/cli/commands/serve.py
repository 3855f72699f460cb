"""``openenv serve``: run an environment package's server, sandboxed, behind a TCP address."""

from __future__ import annotations

import ast
import asyncio
import errno
import importlib.util
import ipaddress
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Dict, List, Optional

import typer

from openenv.cli._common import CLIError, err, load_package, styled
from openenv.core.checks.dependencies import missing_module_help
from openenv.core.env_server.settings import read as read_setting
from openenv.core.manifest import EnvManifest
from openenv.core.utils import is_local_host

_WATCH_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".toml", ".txt")


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
        env_vars = _server_env(host, env, max_sessions, web)
        server = _Serve(manifest, host, port, sandbox, reload, env_vars, network, memory_mb, workers)
        raise typer.Exit(server.run())


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


class _Serve:
    def __init__(
        self,
        manifest: EnvManifest,
        host: str,
        port: int,
        sandbox: bool,
        reload: bool,
        env_vars: Dict[str, str],
        network: bool,
        memory_mb: int,
        workers: int = 1,
    ) -> None:
        self.manifest = manifest
        self.workers = workers
        self.host, self.port = host, port
        self.sandbox, self.reload = sandbox, reload
        self.env_vars, self.network, self.memory_mb = env_vars, network, memory_mb
        self.provider = None
        self.pool = None
        self._log_offsets: Dict[Path, int] = {}

    # --- the server in its sandbox ---------------------------------------------------------------

    def _options(self) -> Dict[str, object]:
        return {
            "isolation": "sandbox" if self.sandbox else "none",
            "network": self.network,
            "memory_mb": self.memory_mb,
            "env_vars": self.env_vars,
            # Warm starts fork from a warden that holds the framework, never the package: a
            # reloaded server imports the changed code.
            "warm": True,
            "log_level": "info",
        }

    def _new_provider(self):
        from openenv.core.containers.runtime import SandboxPool, SandboxProvider
        from openenv.core.containers.runtime.isolation import IsolationError

        try:
            if self.workers > 1:
                return SandboxPool(
                    str(self.manifest.path), self.workers, host=self.host, port=self.port, **self._options()
                )
            return SandboxProvider(str(self.manifest.path), **self._options())
        except IsolationError as exc:
            raise CLIError(f"{exc}\n(or serve without isolation: --no-sandbox)") from None

    def _start_provider(self):
        provider = self._new_provider()
        try:
            provider.start()
            provider.wait_for_ready(60)
        except BaseException as exc:
            provider.stop()
            if isinstance(exc, (RuntimeError, TimeoutError, OSError)):
                raise self._did_not_start(exc) from None
            raise
        return provider

    def _did_not_start(self, exc: BaseException) -> CLIError:
        """The server's failure to start, with what to do when a module is missing."""
        message = str(exc)
        advice = missing_module_help(message, self.manifest.name, self.manifest.path)
        return CLIError(f"{message}\n{advice}" if advice else message)

    # --- the TCP front ----------------------------------------------------------------------------

    def run(self) -> int:
        try:
            return asyncio.run(self._main())
        except KeyboardInterrupt:
            return 130

    async def _main(self) -> int:
        if self.workers > 1:
            return await self._main_pool()
        from openenv.core.containers.runtime.forward import UnixForwarder

        loop = asyncio.get_running_loop()
        # No server yet: until retarget(), a client is told that it is starting.
        forwarder = UnixForwarder(None, self.host, self.port)
        try:
            host, port = await forwarder.start()  # the port first: fail before starting anything
        except OSError as exc:
            raise self._cannot_listen(exc) from None
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watcher: Optional[asyncio.Task] = None
        try:
            mode = "sandboxed" if self.sandbox else "WITHOUT isolation"
            with err.status(styled("Starting {} ({})...", self.manifest.name, mode)):
                self.provider = await loop.run_in_executor(None, self._start_provider)
            forwarder.retarget(self.provider.base_url)
            self._announce(host, port)
            follower = asyncio.ensure_future(self._follow_log())
            if self.reload:
                watcher = asyncio.ensure_future(self._watch(forwarder))
            await stop.wait()
            follower.cancel()
            self._copy_log()  # what the server said last
            err.print("Stopping...")
            return 0
        finally:
            if watcher is not None:
                watcher.cancel()
            await forwarder.close()
            if self.provider is not None:
                await loop.run_in_executor(None, self.provider.stop)
                err.print("Stopped.")  # (a server that never started says why instead)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _cannot_listen(self, exc: OSError) -> CLIError:
        if exc.errno == errno.EADDRINUSE:
            return CLIError(f"port {self.port} on {self.host} is in use; pick another with --port (0 picks a free one)")
        return CLIError(f"cannot listen on {self.host}:{self.port}: {exc}")

    async def _main_pool(self) -> int:
        """``--workers N``: a :class:`SandboxPool` binds the address and runs the workers."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        self.pool = self._new_provider()
        started = False
        try:
            mode = "sandboxed" if self.sandbox else "WITHOUT isolation"
            with err.status(styled("Starting {} processes of {} ({})...", self.workers, self.manifest.name, mode)):
                try:
                    await loop.run_in_executor(None, self.pool.start)
                except OSError as exc:
                    raise self._cannot_listen(exc) from None
                except (RuntimeError, TimeoutError) as exc:
                    raise self._did_not_start(exc) from None
            started = True
            self._announce(*self.pool.front.address)
            follower = asyncio.ensure_future(self._follow_log())
            await stop.wait()
            follower.cancel()
            self._copy_log()
            err.print("Stopping...")
            return 0
        finally:
            await loop.run_in_executor(None, self.pool.stop)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if started:
                err.print("Stopped.")

    async def _follow_log(self) -> None:
        """Copy the servers' logs to stderr as they grow (across reloads and restarts)."""
        while True:
            self._copy_log()
            await asyncio.sleep(0.2)

    def _copy_log(self) -> None:
        from openenv.core.containers.runtime.sandbox import read_log

        providers = list(self.pool.providers.items()) if self.pool is not None else [("", self.provider)]
        paths = {p.log_path: name for name, p in providers if p is not None and p.log_path is not None}
        self._log_offsets = {path: self._log_offsets.get(path, 0) for path in paths}  # forget stopped ones
        for path, name in paths.items():
            offset = self._log_offsets[path]
            chunk, size = read_log(path, offset)
            if size < offset:
                offset = 0  # the log reached its bound and started over
                chunk, size = read_log(path, 0)
            complete = chunk.rfind(b"\n") + 1  # whole lines only
            if complete:
                self._log_offsets[path] = offset + complete
                text = chunk[:complete].decode(errors="replace")
                if name:  # which worker said it
                    text = "".join(f"[{name}] {line}" for line in text.splitlines(keepends=True))
                sys.stderr.write(text)
                sys.stderr.flush()

    async def _watch(self, forwarder) -> None:
        from watchfiles import awatch

        loop = asyncio.get_running_loop()

        def relevant(_change, changed: str) -> bool:
            return "__pycache__" not in changed and changed.endswith(_WATCH_SUFFIXES)

        async for changes in awatch(str(self.manifest.path), watch_filter=relevant):
            names = ", ".join(sorted({os.path.relpath(p, self.manifest.path) for _, p in changes}))
            err.print(styled("[yellow]Changed:[/] {}; restarting the server...", names))
            try:
                fresh = await loop.run_in_executor(None, self._start_provider)
            except CLIError as exc:
                err.print(
                    styled("[bold red]The changed code does not start[/] (still serving the previous one):\n{}", exc)
                )
                continue
            old, self.provider = self.provider, fresh
            forwarder.retarget(fresh.base_url)
            if old is not None:
                await loop.run_in_executor(None, old.stop)
            err.print(styled("[green]Reloaded.[/]"))

    def _announce(self, host: str, port: int) -> None:
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        url = f"http://{shown}:{port}"
        isolation = (
            f"sandboxed: {'with' if self.network else 'no'} network, {self.memory_mb} MiB memory limit"
            if self.sandbox
            else "NOT isolated: it can reach this machine's files and network"
        )
        workers = f", {self.workers} processes" if self.workers > 1 else ""
        err.print(
            styled("[bold green]Serving[/] {} at [bold]{}[/] ({}{})", self.manifest.name, url, isolation, workers)
        )
        if self.env_vars.get("ENABLE_WEB_INTERFACE", "").lower() in ("1", "true", "yes", "on"):
            err.print(styled("Play it in a browser: [bold]{}/web/[/]", url))
        token = self.env_vars.get("OPENENV_AUTH_TOKEN")
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
        sys.stdout.write(f"{url}\n\n{client_snippet(self.manifest.path, url)}\n\n")
        sys.stdout.flush()


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
