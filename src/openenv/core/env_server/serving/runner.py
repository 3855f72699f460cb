"""Running an environment app with uvicorn: in the foreground, or on a background thread.

The runners apply the app's :class:`~..settings.ServerLimits` (those of an OpenEnv app, else the
ones ``OPENENV_*`` sets) to the transport: uvicorn's WebSocket frame limit is the app's message
limit, the WebSocket protocol of :mod:`.._compat.uvicorn` refuses larger frames before buffering them
and shares the app's budget of bytes in flight, and :mod:`.._compat.uvicorn` guards each
connection (the header timeout and the per-client connection cap).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import threading
import time
from typing import Any, Optional, Sequence, Tuple

from ...utils import tuned_gc
from .._compat import uvicorn as uvicorn_compat
from ..limits import InFlightBudget
from ..settings import ServerSettings
from .access_log import quiet_polls


def _served(app: Any) -> Tuple[ServerSettings, Optional[InFlightBudget]]:
    """The settings of an OpenEnv app and its budget of bytes in flight; for any other app, what
    ``OPENENV_*`` says and a budget of its own."""
    server = getattr(getattr(app, "state", None), "openenv_server", None)
    settings = getattr(server, "settings", None)
    if isinstance(settings, ServerSettings):
        return settings, getattr(server, "budget", None)
    settings = ServerSettings.resolve()
    return settings, InFlightBudget(settings.limits.max_inflight_bytes)


def uvicorn_config(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    uds: Optional[str] = None,
    log_level: str = "warning",
    **overrides: Any,
) -> Any:
    """A loaded ``uvicorn.Config`` with OpenEnv's defaults (one worker, uvloop when installed) and
    the app's limits put on it (:func:`.._compat.uvicorn.protect`; ``overrides`` of ``ws``,
    ``ws_max_size`` and the ping options are kept as given). Its ``openenv_connections`` is the
    :class:`~.._compat.uvicorn.ConnectionTable` of the guarded connections (None when they are not
    guarded)."""
    import uvicorn

    settings, budget = _served(app)
    options: dict = dict(host=host, port=port, uds=uds, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)
    options.update(overrides)
    config = uvicorn.Config(app, **options)
    config.load()
    for missing in uvicorn_compat.protect(config, settings.limits, budget, keep=overrides):
        _say_once(f"serving without {missing}")
    quiet_polls()  # after uvicorn has set up its loggers: the --workers front's polls stay out of the log
    return config


@functools.cache  # once per message
def _say_once(message: str) -> None:
    """Log a warning about how this process serves, once."""
    logging.getLogger("openenv.server").warning(message)


def run_server(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    uds: Optional[str] = None,
    log_level: str = "info",
    **overrides: Any,
) -> None:
    """Serve ``app`` until interrupted (on a TCP port, or on a Unix socket when ``uds`` is set)."""
    import uvicorn

    server = uvicorn.Server(uvicorn_config(app, host=host, port=port, uds=uds, log_level=log_level, **overrides))
    with owned_process_gc(app):
        server.run()


def owned_process_gc(app: Any) -> Any:
    """The garbage-collector tuning of a process OpenEnv's runner owns (see
    :func:`openenv.core.utils.tuned_gc`): on unless ``OPENENV_GC_TUNING`` says otherwise; an app that was
    told to tune (``OPENENV_GC_TUNING=1``) does it itself while it is served."""
    return tuned_gc(_served(app)[0].gc_tuning is None)


def serve_main(app: Any, description: str, argv: Optional[Sequence[str]] = None) -> None:
    """The command line of an environment's ``server/app.py`` ``main()``: ``--host``, ``--port``,
    ``--uds`` and ``--log-level``, then :func:`run_server`. It serves on http://127.0.0.1:8000
    unless told otherwise."""
    parser = _parser(description)
    args = _parsed(parser, argv)
    run_server(app, host=args.host, port=args.port, uds=args.uds, log_level=args.log_level)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m openenv.core.env_server MODULE:APP [--host H] [--port P] [--uds PATH]
    [--log-level L]``: serve the ASGI app ``APP`` of ``MODULE`` (imported from the current
    directory, as ``uvicorn MODULE:APP`` does) with every limit of :mod:`..settings` on its transport.
    What the catalogue's Dockerfiles run."""
    import importlib
    import sys

    parser = _parser("Serve an environment's ASGI app (such as server.app:app) with OpenEnv's limits.")
    parser.add_argument("app", metavar="MODULE:APP", help="the app to serve, as uvicorn names it (server.app:app)")
    args = _parsed(parser, argv)
    module_name, _, attribute = args.app.partition(":")
    if not module_name or not attribute:
        parser.error(f"name the app as MODULE:APP (such as server.app:app), not {args.app!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        app: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the module itself imports something that is missing: its own traceback says what
        parser.error(f"no module {module_name!r} here ({os.getcwd()}): run this from the environment's directory")
    for part in attribute.split("."):
        app = getattr(app, part, None)
        if app is None:
            parser.error(f"module {module_name!r} has no {attribute!r}")
    run_server(app, host=args.host, port=args.port, uds=args.uds, log_level=args.log_level)


def _parser(description: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: all; default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--uds", metavar="PATH", help="listen on this Unix socket instead of a TCP port")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="uvicorn's log level (default info)",
    )
    return parser


def _parsed(parser: Any, argv: Optional[Sequence[str]]) -> Any:
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, not {args.port}")
    return args


class BackgroundServer:
    """Serves an app on a daemon thread; a context manager whose ``base_url`` is ready on entry.

    ``port=0`` picks a free port. With ``uds`` the server listens on that Unix socket and
    ``base_url`` is ``unix://<path>``.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        uds: Optional[str] = None,
        log_level: str = "warning",
        **overrides: Any,
    ) -> None:
        import uvicorn

        self._uds = uds
        self.host, self.port = host, 0
        self._socket: Optional[socket.socket] = None
        if uds is None:  # bound here, so that port 0's pick is known before the server starts
            self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # accepted sockets inherit it (asyncio sets it only on sockets made with IPPROTO_TCP):
            # without it an answer written in two pieces waits for the client's delayed ACK (40 ms)
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socket.bind((host, port))
            self.port = self._socket.getsockname()[1]
        config = uvicorn_config(app, host=host, port=self.port, uds=uds, log_level=log_level, **overrides)
        self.server = uvicorn.Server(config)
        # asyncio's own loop unless a loop is asked for by name ("uvloop", "asyncio", "auto").
        self._loop_factory = None
        if "loop" in overrides:
            get_loop_factory = getattr(config, "get_loop_factory", None)
            if get_loop_factory is not None:
                self._loop_factory = get_loop_factory()
            else:  # uvicorn before 0.36 sets the loop through the event loop policy
                config.setup_event_loop()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        """The event loop the server runs on, once started."""
        self._thread: Optional[threading.Thread] = None

    @property
    def base_url(self) -> str:
        if self._uds is not None:
            return f"unix://{self._uds}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> BackgroundServer:
        sockets = [self._socket] if self._socket is not None else None

        async def serving() -> None:
            self.loop = asyncio.get_running_loop()
            await self.server.serve(sockets=sockets)

        def serve() -> None:
            if self._loop_factory is None:
                asyncio.run(serving())
                return
            loop = self._loop_factory()
            try:
                loop.run_until_complete(serving())
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=serve, name="openenv-background-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during start-up (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server did not start within {timeout_s:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._uds is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._uds)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
