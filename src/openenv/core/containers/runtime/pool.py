"""``SandboxPool``: several sandboxed server processes of one environment behind one URL.

A server is one Python process, one core's worth of steps. The pool starts ``workers`` of them,
each a :class:`~.sandbox.SandboxProvider` whose session ids carry its own prefix (``w0-``,
``w1-``, ...), and puts a :class:`~.front.Front` on one TCP address before them: new sessions go
to the least-loaded worker, calls naming a session to the worker that holds it. A supervisor
thread watches the workers: one that dies is started again under the same prefix, and only its
own sessions end (their clients get ``SessionLostError``); the others carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import threading
from typing import Any, Dict, List, Optional

from ...env_server.settings import ServerLimits
from ...utils import is_local_host
from .front import Front, Worker
from .sandbox import SandboxProvider

logger = logging.getLogger("openenv.sandbox")

PREFIX_VAR = "OPENENV_SESSION_ID_PREFIX"


class SandboxPool:
    """Serve ``project_path`` from ``workers`` sandboxed processes at ``http://host:port``.

    ``port=0`` picks a free port. ``env_vars`` reach every worker (``OPENENV_AUTH_TOKEN`` among
    them makes the front send it with its own queries). A ``host`` other than this machine's
    (``0.0.0.0``) sets ``OPENENV_ERROR_DETAILS=0`` unless ``env_vars`` set it, as ``openenv serve``
    does: error answers then carry no exception text for anyone. The other keywords are those of
    :class:`~.sandbox.SandboxProvider`. ``start()`` returns the URL once every worker is ready;
    ``stop()`` ends them all. Use it as a context manager to do both.
    """

    def __init__(
        self,
        project_path: str,
        workers: int = 2,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        env_vars: Optional[Dict[str, str]] = None,
        check_interval_s: float = 0.25,
        start_timeout_s: float = 60.0,
        **provider_options: Any,
    ) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a whole number, at least 1, got {workers!r}")
        if PREFIX_VAR in (env_vars or {}):
            raise ValueError(f"{PREFIX_VAR} is set by the pool (one prefix per worker); leave it out of env_vars")
        self.project_path = project_path
        self.host, self.port = host, port
        self.env_vars = dict(env_vars or {})
        if not is_local_host(host):
            # Reachable from elsewhere: no exception text in error answers, for any client (the
            # front names each client to the workers too, but a proxy before it may not).
            self.env_vars.setdefault("OPENENV_ERROR_DETAILS", "0")
        # one key for every worker (and every restart of one): a snapshot made on one worker
        # restores on any other behind this URL
        self.env_vars.setdefault("OPENENV_SNAPSHOT_KEY", secrets.token_hex(32))
        self.check_interval_s = check_interval_s
        self.start_timeout_s = start_timeout_s
        self.prefixes = [f"w{i}" for i in range(workers)]
        self.providers: Dict[str, SandboxProvider] = {
            prefix: self._provider(prefix, **provider_options) for prefix in self.prefixes
        }
        self._options = provider_options
        token = self.env_vars.get("OPENENV_AUTH_TOKEN")
        limits = ServerLimits.from_env({**os.environ, **self.env_vars})
        self.front = Front([Worker(p) for p in self.prefixes], host, port, token=token, limits=limits)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._threads: List[threading.Thread] = []
        self._stopping = threading.Event()
        self._base_url: Optional[str] = None

    def _provider(self, prefix: str, **options: Any) -> SandboxProvider:
        env = {**self.env_vars, PREFIX_VAR: prefix}
        return SandboxProvider(self.project_path, env_vars=env, start_timeout_s=self.start_timeout_s, **options)

    @property
    def base_url(self) -> Optional[str]:
        return self._base_url

    def status(self) -> List[Dict[str, Any]]:
        """One record per worker: its prefix, status, sessions, capacity and restarts so far."""
        return [w.status() for w in self.front.workers.values()]

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> str:
        """Start every worker and the front; returns ``http://host:port``."""
        if self._base_url is not None:
            raise RuntimeError("this pool is already started; stop() it first")
        self._stopping.clear()
        try:
            loop = self._loop = asyncio.new_event_loop()
            runner = threading.Thread(target=loop.run_forever, name="openenv-pool-front", daemon=True)
            runner.start()
            self._threads = [runner]
            host, port = self._call(self.front.start())  # the port first: fail before starting anything
            for provider in self.providers.values():
                provider.start()
            for prefix, provider in self.providers.items():
                provider.wait_for_ready(self.start_timeout_s)
                self._set_up(prefix, provider)
            self._call(self.front.refresh())
        except BaseException:
            self.stop()
            raise
        supervisor = threading.Thread(target=self._supervise, name="openenv-pool-supervisor", daemon=True)
        supervisor.start()
        self._threads.append(supervisor)
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        self._base_url = f"http://{shown}:{port}"
        return self._base_url

    def wait_for_ready(self, timeout_s: float = 30.0) -> None:
        """Every worker is ready once :meth:`start` returns; kept for the providers' shape."""
        if self._base_url is None:
            raise RuntimeError("start() the pool first")

    def stop(self) -> None:
        """Stop the front and every worker."""
        self._stopping.set()
        for thread in reversed(self._threads):  # the supervisor first: it may be starting a worker
            if thread.name == "openenv-pool-supervisor":
                thread.join()
        loop, self._loop = self._loop, None
        if loop is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.front.close(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            for thread in self._threads:
                thread.join(10)
            loop.close()
        self._threads = []
        for provider in self.providers.values():
            provider.stop()
        self._base_url = None

    def __enter__(self) -> SandboxPool:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- supervision -----------------------------------------------------------------------------

    def _call(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def _set_up(self, prefix: str, provider: SandboxProvider) -> None:
        assert self._loop is not None and provider.base_url is not None
        self._loop.call_soon_threadsafe(self.front.set_up, prefix, provider.base_url)

    def _supervise(self) -> None:
        while not self._stopping.wait(self.check_interval_s):
            for prefix, provider in list(self.providers.items()):
                code = provider.poll()
                if code is None or self._stopping.is_set():
                    continue
                loop = self._loop
                if loop is None:
                    return
                loop.call_soon_threadsafe(self.front.set_down, prefix)
                logger.warning("worker %s of %s exited (code %s); starting it again", prefix, provider.name, code)
                dead = provider
                dead.stop(grace_s=1.0)
                self.providers[prefix] = self._restart(prefix) or dead

    def _restart(self, prefix: str) -> Optional[SandboxProvider]:
        """A fresh worker under ``prefix``, tried until it starts (pauses growing up to 30 s:
        a package that cannot start) or the pool stops (None)."""
        pause = 0.5
        while not self._stopping.is_set():
            fresh = self._provider(prefix, **self._options)
            try:
                fresh.start()
                fresh.wait_for_ready(self.start_timeout_s)
            except Exception as exc:
                fresh.stop()
                logger.error("worker %s did not start again (%s); retrying in %g s", prefix, exc, pause)
                self._stopping.wait(pause)
                pause = min(2 * pause, 30.0)
                continue
            if self._stopping.is_set():
                fresh.stop()
                return None
            self.front.workers[prefix].restarts += 1
            self._set_up(prefix, fresh)
            return fresh
        return None

    def __repr__(self) -> str:
        return f"SandboxPool({self.project_path!r}, workers={len(self.prefixes)}, base_url={self._base_url!r})"
