"""The server's settings: every ``OPENENV_*`` variable a server reads, typed, read once.

:meth:`ServerSettings.resolve` reads them when an app is made (``create_app``) and merges them with
the arguments given in code, under one rule for every setting:

    **a variable that is set (not blank) wins over the argument; the argument wins over the default.**

An environment package's ``server/app.py`` states its defaults in code; whoever deploys it changes
them without editing it (``openenv serve --max-sessions 8`` sets ``OPENENV_MAX_SESSIONS``). A value
that does not parse is refused with a ``ValueError`` that names the variable and says what it takes.

=====================================  ==========  ===============================================
variable                               default     meaning
=====================================  ==========  ===============================================
``OPENENV_MODE``                       simulation  ``simulation`` or ``production`` (no HTTP
                                                   reset/step/state)
``OPENENV_MAX_SESSIONS``               1           concurrent sessions (``max_concurrent_envs``)
``OPENENV_STEP_TIMEOUT_S``             none        bound on every reset/step/state/tool call
                                                   (0: none)
``OPENENV_WORKER_THREADS``             auto        threads for sync environments (0: sessions + 1,
                                                   at most 16)
``OPENENV_ERROR_DETAILS``              auto        ``1``/``0``/``auto``: whether error answers carry
                                                   an environment exception's text (see
                                                   :mod:`.error_details`)
``OPENENV_AUTH_TOKEN``                 none        bearer token every route but ``/health`` needs
``OPENENV_MAX_MESSAGE_MB`` and the     see         what clients may make the server hold
other limits                           :mod:`.limits`
``OPENENV_LIBRARY_INTERNALS``          1           ``0``: serve through uvicorn's, websockets' and
                                                   FastMCP's public APIs only (see
                                                   :mod:`._compat`): slower, and without the
                                                   limits that need their internals
``OPENENV_GC_TUNING``                  runner's    ``1``/``0``: freeze start-up objects out of
                                                   garbage collection and collect less often
                                                   while serving. Unset: on where OpenEnv's runner
                                                   owns the process (``run_server``,
                                                   ``serve_main``, ``openenv serve``), off for an
                                                   app served any other way
``OPENENV_SCHED_BATCH``                0           ``1``: run the worker threads (and what a step
                                                   starts) under Linux's ``SCHED_BATCH`` policy
=====================================  ==========  ===============================================

Variables read elsewhere, by other parts: ``OPENENV_CLIENT_MODE`` (clients),
``OPENENV_SANDBOX_CONFIG`` (the sandbox runtime).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
from typing import Any, Callable, Iterator, Mapping, Optional

from typing_extensions import TypedDict

from .limits import ServerLimits, limits_from_env
from .types import ServerMode

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _boolean(raw: str) -> bool:
    value = raw.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("must be 1 or 0")


def _auto_boolean(raw: str) -> Optional[bool]:
    if raw.lower() == "auto":
        return None
    try:
        return _boolean(raw)
    except ValueError:
        raise ValueError("must be 1, 0 or auto") from None


def _count(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        if not raw.isdigit() or int(raw) < minimum:
            raise ValueError(f"must be a whole number, at least {minimum}")
        return int(raw)

    return parse


def _seconds_or_none(raw: str) -> Optional[float]:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number of seconds (0: no timeout)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a finite number of seconds, at least 0 (0: no timeout)")
    return value or None


def _mode(raw: str) -> ServerMode:
    try:
        return ServerMode(raw.lower())
    except ValueError:
        raise ValueError("must be one of " + ", ".join(m.value for m in ServerMode)) from None


_PARSERS: Mapping[str, Callable[[str], Any]] = {
    "mode": _mode,
    "max_sessions": _count(1),
    "step_timeout_s": _seconds_or_none,
    "worker_threads": _count(0),
    "error_details": _auto_boolean,
    "auth_token": str,
    "library_internals": _boolean,
    "gc_tuning": _boolean,
    "sched_batch": _boolean,
}


_SERVER_FIELDS = tuple(field for field in _PARSERS if field != "library_internals")


def variable_of(field: str) -> str:
    return "OPENENV_" + field.upper()


def read(environ: Mapping[str, str], field: str) -> Any:
    """The value of ``field``'s variable in ``environ`` (``dataclasses.MISSING`` when unset or
    blank); a ``ValueError`` naming the variable when it does not parse."""
    name = variable_of(field)
    raw = environ.get(name, "").strip()
    if not raw:
        return dataclasses.MISSING
    try:
        return _PARSERS[field](raw)
    except ValueError as exc:
        raise ValueError(f"{name} {exc}, got {raw!r}") from None


class ServerOptions(TypedDict, total=False):
    """The keywords of ``create_app`` that :meth:`ServerSettings.resolve` takes (None: not given)."""

    step_timeout_s: Optional[float]
    max_message_size_mb: Optional[float]
    worker_threads: Optional[int]
    error_details: Optional[bool]
    auth_token: Optional[str]
    limits: Optional[ServerLimits]


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """What one server runs with; see the module docstring. Build it with :meth:`resolve`."""

    mode: ServerMode = ServerMode.SIMULATION
    max_sessions: Optional[int] = None
    """None: as the app's ``max_concurrent_envs`` / ``concurrency_config`` says."""
    step_timeout_s: Optional[float] = None
    worker_threads: Optional[int] = None
    error_details: Optional[bool] = None
    auth_token: Optional[str] = None
    limits: ServerLimits = dataclasses.field(default_factory=ServerLimits)
    gc_tuning: Optional[bool] = None
    """None: on where OpenEnv's runner owns the process (see :func:`tuned_gc`), else off."""
    sched_batch: bool = False

    @classmethod
    def resolve(
        cls,
        environ: Optional[Mapping[str, str]] = None,
        *,
        limits: Optional[ServerLimits] = None,
        max_message_size_mb: Optional[float] = None,
        **arguments: Any,
    ) -> ServerSettings:
        """The settings of ``environ`` (default ``os.environ``) over ``arguments`` (keyword
        arguments that are None count as not given) over the defaults. ``limits`` and
        ``max_message_size_mb`` are the app's own limits, each ``OPENENV_*`` limit overriding its
        field."""
        env = os.environ if environ is None else environ
        unknown = set(arguments) - set(_SERVER_FIELDS)
        if unknown:
            raise TypeError(f"unknown server setting(s): {', '.join(sorted(unknown))}")
        library_internals_enabled(env)  # process-wide, read where it is used; refused here if bad
        values: dict = {}
        for field in _SERVER_FIELDS:
            value = read(env, field)
            if value is dataclasses.MISSING:
                value = arguments.get(field)
                if value is None:
                    continue
                value = _checked_argument(field, value)
            values[field] = value
        base = limits if limits is not None else ServerLimits()
        if max_message_size_mb is not None:
            base = base.replace(max_message_mb=max_message_size_mb)
        values["limits"] = limits_from_env(env, base)
        return cls(**values)


def _checked_argument(field: str, value: Any) -> Any:
    """An argument given in code, checked as strictly as its variable would be."""
    if field == "mode":
        return value if isinstance(value, ServerMode) else _mode(str(value))
    if field == "step_timeout_s":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"step_timeout_s must be a finite number of seconds >= 0, got {value!r}")
        return float(value) or None
    if field in ("max_sessions", "worker_threads"):
        minimum = 1 if field == "max_sessions" else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{field} must be a whole number >= {minimum}, got {value!r}")
        return value
    if field == "error_details":
        if not isinstance(value, bool):
            raise TypeError(f"error_details must be True, False or None, got {value!r}")
        return value
    if field == "auth_token" and not isinstance(value, str):
        raise TypeError(f"auth_token must be a str, got {type(value).__name__}")
    if field in ("gc_tuning", "sched_batch") and not isinstance(value, bool):
        raise TypeError(f"{field} must be True or False, got {value!r}")
    return value


@contextlib.contextmanager
def tuned_gc(enabled: bool) -> Iterator[None]:
    """Garbage-collector settings for a process that serves environments, while it serves.

    A server holds many long-lived objects (sessions, sockets, environments) and allocates a few
    short-lived ones per step; with CPython's defaults the collector keeps rescanning the former.
    Objects that exist at start-up are frozen out of collection and young collections run every
    10,000 allocations instead of 700. They change the whole process, so an app turns them on only
    when asked (``OPENENV_GC_TUNING=1``) and OpenEnv's runner, which owns its process, by default.
    ``make bench``: a sync environment at 512 sessions went from 0.54 to 0.71 of the floor's steps/s.
    """
    if not enabled:
        yield
        return
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def library_internals_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """``OPENENV_LIBRARY_INTERNALS``: whether :mod:`._compat` may rely on other libraries'
    internals. A setting of the process, not of one server: each ``_compat`` module reads it
    where it decides (FastMCP's once, at import)."""
    value = read(os.environ if environ is None else environ, "library_internals")
    return True if value is dataclasses.MISSING else value
