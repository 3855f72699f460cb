"""Serving one environment package at a TCP address until told to stop: what ``openenv serve`` runs.

A :class:`PackageServer` starts the package's server in a sandbox (:class:`~.sandbox.SandboxProvider`;
with ``workers`` > 1, a :class:`~.pool.SandboxPool` of them behind its front), puts the TCP
address before it (one server: a :class:`~.forward.UnixForwarder` to its Unix socket, bound
first, which tells a client that comes while the server starts so), copies the servers' logs to
stderr as they grow, starts the server again when the package's files change (``reload``: the
new one takes over once it is ready; one that does not start leaves the old one serving) and
stops everything on SIGINT or SIGTERM.

What it has to tell a person (starting, serving at an address, a reload, stopping) goes to a
:class:`Reporter`; ``openenv serve`` prints it. Failures are :class:`ServeError` s: the sandbox
cannot be made here (:class:`SandboxUnavailable`), the server did not start
(:class:`DidNotStart`, its own error as the message), the address is taken
(:class:`CannotListen`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any, ContextManager, Dict, List, Optional

from ...manifest import EnvManifest

RELOAD_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".toml", ".txt")
"""A change to a file of the package with one of these suffixes restarts the server (``reload``)."""


class ServeError(Exception):
    """The package could not be served; the message says why."""


class SandboxUnavailable(ServeError):
    """The sandbox cannot be set up on this machine (the message says what to do)."""


class DidNotStart(ServeError):
    """The package's server did not start: its own error (a module it cannot import, say)."""


class CannotListen(ServeError):
    """The TCP address cannot be listened on; ``error`` is the ``OSError``."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {error}")
        self.host, self.port, self.error = host, port, error


class Reporter:
    """What a :class:`PackageServer` tells a person, each call naming the server; this one tells
    nothing (``openenv serve``'s prints)."""

    def starting(self, server: PackageServer) -> ContextManager[Any]:
        """Held while the server (every worker) starts."""
        return contextlib.nullcontext()

    def serving(self, server: PackageServer, host: str, port: int) -> None:
        """The package is served at ``host:port`` (the address bound: ``port`` 0 picked one)."""

    def changed(self, server: PackageServer, names: List[str]) -> None:
        """These files of the package changed (``reload``): a new server starts."""

    def reload_failed(self, server: PackageServer, error: ServeError) -> None:
        """The changed code does not start: the previous server goes on serving."""

    def reloaded(self, server: PackageServer) -> None:
        """The new server took over."""

    def stopping(self, server: PackageServer) -> None:
        """A signal came: everything stops."""

    def stopped(self, server: PackageServer) -> None:
        """Every server has stopped (said only when one had started)."""


class PackageServer:
    """Serve ``manifest``'s package at ``host:port`` (0: a free port) until SIGINT or SIGTERM.

    ``sandbox`` False runs it as a plain process; ``network`` lets the sandboxed server reach the
    network; ``memory_mb`` bounds its memory; ``env_vars`` are its environment; ``workers`` > 1
    starts that many behind one front (not with ``reload``). :meth:`run` serves and returns the
    exit status."""

    def __init__(
        self,
        manifest: EnvManifest,
        host: str,
        port: int,
        *,
        sandbox: bool = True,
        reload: bool = False,
        env_vars: Optional[Dict[str, str]] = None,
        network: bool = False,
        memory_mb: int = 2048,
        workers: int = 1,
        reporter: Optional[Reporter] = None,
    ) -> None:
        if reload and workers > 1:
            raise ValueError("reload restarts one server process: it does not go with workers > 1")
        self.manifest = manifest
        self.host, self.port = host, port
        self.sandbox, self.reload = sandbox, reload
        self.env_vars = dict(env_vars or {})
        self.network, self.memory_mb, self.workers = network, memory_mb, workers
        self.reporter = reporter or Reporter()
        self.provider: Any = None
        """The server being served now (one worker), or None."""
        self.pool: Any = None
        """The :class:`~.pool.SandboxPool` (``workers`` > 1), or None."""
        self._log_offsets: Dict[Path, int] = {}

    def run(self) -> int:
        """Serve until SIGINT or SIGTERM: 0 once stopped so, 130 on a KeyboardInterrupt."""
        try:
            return asyncio.run(self._serve_pool() if self.workers > 1 else self._serve_one())
        except KeyboardInterrupt:
            return 130

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

    def _new_provider(self) -> Any:
        from .isolation import IsolationError
        from .pool import SandboxPool
        from .sandbox import SandboxProvider

        try:
            if self.workers > 1:
                return SandboxPool(
                    str(self.manifest.path), self.workers, host=self.host, port=self.port, **self._options()
                )
            return SandboxProvider(str(self.manifest.path), **self._options())
        except IsolationError as exc:
            raise SandboxUnavailable(str(exc)) from None

    def _start_provider(self) -> Any:
        provider = self._new_provider()
        try:
            provider.start()
            provider.wait_for_ready(60)
        except BaseException as exc:
            provider.stop()
            if isinstance(exc, (RuntimeError, TimeoutError, OSError)):
                raise DidNotStart(str(exc)) from None
            raise
        return provider

    # --- one server, behind a forwarder ----------------------------------------------------------

    async def _serve_one(self) -> int:
        from .forward import UnixForwarder

        loop = asyncio.get_running_loop()
        # No server yet: until retarget(), a client is told that it is starting.
        forwarder = UnixForwarder(None, self.host, self.port)
        try:
            host, port = await forwarder.start()  # the port first: fail before starting anything
        except OSError as exc:
            raise CannotListen(self.host, self.port, exc) from None
        stop = _stop_on_signals(loop)
        watcher: Optional[asyncio.Task] = None
        try:
            with self.reporter.starting(self):
                self.provider = await loop.run_in_executor(None, self._start_provider)
            forwarder.retarget(self.provider.base_url)
            self.reporter.serving(self, host, port)
            follower = asyncio.ensure_future(self._follow_log())
            if self.reload:
                watcher = asyncio.ensure_future(self._watch(forwarder))
            await stop.wait()
            follower.cancel()
            self._copy_log()  # what the server said last
            self.reporter.stopping(self)
            return 0
        finally:
            if watcher is not None:
                watcher.cancel()
            await forwarder.close()
            if self.provider is not None:
                await loop.run_in_executor(None, self.provider.stop)
                self.reporter.stopped(self)  # (a server that never started says why instead)
            _forget_signals(loop)

    async def _watch(self, forwarder: Any) -> None:
        from watchfiles import awatch

        loop = asyncio.get_running_loop()

        def relevant(_change: Any, changed: str) -> bool:
            return "__pycache__" not in changed and changed.endswith(RELOAD_SUFFIXES)

        async for changes in awatch(str(self.manifest.path), watch_filter=relevant):
            self.reporter.changed(self, sorted({os.path.relpath(p, self.manifest.path) for _, p in changes}))
            try:
                fresh = await loop.run_in_executor(None, self._start_provider)
            except ServeError as exc:
                self.reporter.reload_failed(self, exc)
                continue
            old, self.provider = self.provider, fresh
            forwarder.retarget(fresh.base_url)
            if old is not None:
                await loop.run_in_executor(None, old.stop)
            self.reporter.reloaded(self)

    # --- several, behind the pool's front --------------------------------------------------------

    async def _serve_pool(self) -> int:
        """``workers`` > 1: a :class:`~.pool.SandboxPool` binds the address and runs the workers."""
        loop = asyncio.get_running_loop()
        stop = _stop_on_signals(loop)
        self.pool = self._new_provider()
        started = False
        try:
            with self.reporter.starting(self):
                try:
                    await loop.run_in_executor(None, self.pool.start)
                except OSError as exc:
                    raise CannotListen(self.host, self.port, exc) from None
                except (RuntimeError, TimeoutError) as exc:
                    raise DidNotStart(str(exc)) from None
            started = True
            self.reporter.serving(self, *self.pool.front.address)
            follower = asyncio.ensure_future(self._follow_log())
            await stop.wait()
            follower.cancel()
            self._copy_log()
            self.reporter.stopping(self)
            return 0
        finally:
            await loop.run_in_executor(None, self.pool.stop)
            _forget_signals(loop)
            if started:
                self.reporter.stopped(self)

    # --- the servers' logs -----------------------------------------------------------------------

    async def _follow_log(self) -> None:
        """Copy the servers' logs to stderr as they grow (across reloads and restarts)."""
        while True:
            self._copy_log()
            await asyncio.sleep(0.2)

    def _copy_log(self) -> None:
        from .sandbox import read_log

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


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stop_on_signals(loop: asyncio.AbstractEventLoop) -> asyncio.Event:
    stop = asyncio.Event()
    for sig in _SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    return stop


def _forget_signals(loop: asyncio.AbstractEventLoop) -> None:
    for sig in _SIGNALS:
        loop.remove_signal_handler(sig)
