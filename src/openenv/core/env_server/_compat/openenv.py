"""Upstream OpenEnv 0.10's private ``HTTPEnvServer`` attributes, for the packages that read them.

Packages written for upstream subclass its ``HTTPEnvServer`` and reach into what its
``__init__`` sets: a stateful ``/reset`` built on ``self._env_factory()``, routes of their own run
in ``self._executor``, capacity read from ``self._max_concurrent_envs``. :class:`UpstreamServerNames`
gives :class:`~..http_server.HTTPEnvServer` every one of those names, with upstream's meaning.
Sessions here live in the server's ``manager`` (a ``SessionManager``), so the session tables are
snapshots of it, read-only; upstream's per-session executors and exit stacks have no counterpart
(sessions run in one worker pool), and are empty. Nothing here touches another library: this is
about names upstream code relies on, so there is nothing to switch off.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable, Dict, Optional, Set

UPSTREAM_EXECUTOR_THREADS = 32
"""Threads of ``_executor`` (upstream's pool for stateless calls has 32)."""


class UpstreamServerNames:
    """Mixin: upstream's private ``HTTPEnvServer`` attributes (see the module docstring).

    The class using it sets ``_env_factory`` (the environment factory), ``concurrency_config``
    and ``manager``."""

    _env_factory: Callable[[], Any]
    concurrency_config: Any
    manager: Any
    _upstream_executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
    _upstream_lock: Optional[asyncio.Lock] = None

    @property
    def _concurrency_config(self) -> Any:
        """The ``ConcurrencyConfig`` the server was made with (its session limit as served)."""
        return self.concurrency_config

    @property
    def _max_concurrent_envs(self) -> int:
        return int(self.manager.max_sessions)

    @property
    def _session_idle_timeout_s(self) -> Optional[float]:
        return self.concurrency_config.session_timeout

    @property
    def _sessions(self) -> Dict[str, Any]:
        """Each open session's environment by session id (None while it is being built)."""
        return {session_id: session.env for session_id, session in self.manager.sessions().items()}

    @property
    def _session_info(self) -> Dict[str, Any]:
        """Each open session's ``SessionInfo`` by session id."""
        return {session_id: session.info() for session_id, session in self.manager.sessions().items()}

    @property
    def _session_websocket_attachments(self) -> Set[str]:
        """The ids of the sessions a WebSocket is attached to (or owns)."""
        return {session_id for session_id, session in self.manager.sessions().items() if session.attached}

    @property
    def _session_pending_closes(self) -> Set[str]:
        """The ids of sessions asked to close while a WebSocket was attached (closed when it leaves)."""
        return {session_id for session_id, session in self.manager.sessions().items() if session.close_requested}

    @property
    def _session_executors(self) -> Dict[str, Any]:
        return {}  # sessions share the server's worker pool: none has an executor of its own

    @property
    def _session_stacks(self) -> Dict[str, Any]:
        return {}  # an MCP environment's connections are its own (see MCPEnvironment), not the server's

    @property
    def _requires_single_thread_executor(self) -> bool:
        return bool(getattr(self.manager.env_cls, "REQUIRES_SINGLE_THREAD_EXECUTOR", False))

    @property
    def _shared_session_executor(self) -> None:
        return None  # such environments get a one-thread worker pool of their own instead

    @property
    def _reaper_task(self) -> Optional[asyncio.Task]:
        return getattr(self.manager, "_reaper", None)  # (our own SessionManager's idle reaper)

    @property
    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """A thread pool for blocking work of a subclass's own routes (``run_in_executor``),
        made on first use; the server's own calls never run in it."""
        if self._upstream_executor is None:
            self._upstream_executor = concurrent.futures.ThreadPoolExecutor(
                UPSTREAM_EXECUTOR_THREADS, thread_name_prefix="openenv-upstream-executor"
            )
        return self._upstream_executor

    @property
    def _session_lock(self) -> asyncio.Lock:
        """A lock for a subclass's own session bookkeeping (the server's does not take it)."""
        if self._upstream_lock is None:
            self._upstream_lock = asyncio.Lock()
        return self._upstream_lock
