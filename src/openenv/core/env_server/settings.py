"""The server's settings: every ``OPENENV_*`` variable a server reads, typed, read once.

:meth:`ServerSettings.resolve` reads them when an app is made (``create_app``) and merges them with
the arguments given in code, under one rule for every setting:

    **a variable that is set (not blank) wins over the argument; the argument wins over the default.**

An environment package's ``server/app.py`` states its defaults in code; whoever deploys it changes
them without editing it (``openenv serve --max-sessions 8`` sets ``OPENENV_MAX_SESSIONS``). A value
that does not parse is refused with a ``ValueError`` that names the variable and says what it takes.

======================================  ==========  ============================================================
variable                                default     meaning
======================================  ==========  ============================================================
``OPENENV_MODE``                        simulation  ``simulation`` or ``production`` (no HTTP reset/step/state)
``OPENENV_MAX_SESSIONS``                1           concurrent sessions (``max_concurrent_envs``)
``OPENENV_STEP_TIMEOUT_S``              none        bound on every reset/step/state/tool call (0: none)
``OPENENV_WORKER_THREADS``              auto        threads for sync environments (0: sessions + 1, at most 16)
``OPENENV_ERROR_DETAILS``               auto        ``1``/``0``/``auto``: whether error answers carry an
                                                    environment exception's text (see :mod:`.error_details`)
``OPENENV_AUTH_TOKEN``                  none        bearer token every route but ``/health`` (and the web
                                                    page's own files) needs
``OPENENV_GRADER_TOKEN``                none        the grader's token: read-only inspection of sessions (needs
                                                    ``OPENENV_AUTH_TOKEN``; see :mod:`.roles`, docs/roles.md)
``OPENENV_OBSERVER_TOKEN``              none        the observer's token: health, capacity, metadata, metrics. Each
                                                    token may come from a file instead: ``<VARIABLE>_FILE``
``OPENENV_MAX_TRAJECTORY_STEPS``        see right   entries of each session's trajectory kept for the grader (its
                                                    latest; see :mod:`.trajectory`, docs/roles.md). Unset:
                                                    10000 on a server with a grader's token, else 0 (no
                                                    recording)
``OPENENV_ALLOWED_ORIGINS``             none        pages of other sites allowed to open ``/ws`` and send
                                                    POSTs (comma-separated ``scheme://host[:port]``, or
                                                    ``*``: any); a browser's page of this server's own
                                                    origin always may (see :class:`.edges.middleware.SameOrigin`)
``OPENENV_ALLOWED_HOSTS``               none        names, beyond ``localhost`` and IP addresses, by which
                                                    browsers may reach this server (comma-separated
                                                    ``host.example.org``; ``.example.org``: it and every
                                                    name under it; ``*``: any). A browser's request for any
                                                    other name (DNS rebinding) is refused; a Hugging Face
                                                    Space's own name (``SPACE_HOST``) is always known
``ENABLE_WEB_INTERFACE``                off         ``1``/``true``/``yes``: serve the web playground at ``/web/``
                                                    (upstream's variable; see :mod:`.web`)
``OPENENV_SESSION_ID_PREFIX``           none        every session id this server makes starts with it and a
                                                    ``-`` (``w3-<uuid>``): the front of ``openenv serve
                                                    --workers N`` routes a call naming a session by it
``OPENENV_SNAPSHOT_KEY``                random      the key that signs this server's session snapshots; servers
                                                    that restore each other's snapshots (``--workers``, a Ray
                                                    pool) share one. Unset: each server draws its own at start
                                                    (see :mod:`.snapshots`)
``OPENENV_LIBRARY_INTERNALS``           1           ``0``: serve through uvicorn's, websockets' and FastMCP's
                                                    public APIs only (see :mod:`._compat`): slower, and without
                                                    the limits that need their internals
``OPENENV_GC_TUNING``                   runner's    ``1``/``0``: freeze start-up objects out of garbage
                                                    collection and collect less often while serving. Unset: on
                                                    where OpenEnv's runner owns the process (``run_server``,
                                                    ``serve_main``, ``openenv serve``), off for an app served
                                                    any other way
``OPENENV_SCHED_BATCH``                 0           ``1``: run the worker threads (and what a step starts) under
                                                    Linux's ``SCHED_BATCH`` policy
``OPENENV_MAX_MESSAGE_MB``              32          a frame or request body; the transport refuses a larger
                                                    frame before it is buffered (``MESSAGE_TOO_LARGE``)
``OPENENV_MAX_INFLIGHT_MB``             4 x above   large frames being received, large request bodies and
                                                    inflated compressed frames, all clients together
                                                    (``SERVER_BUSY`` / HTTP 503)
``OPENENV_HEADER_TIMEOUT_S``            10          a connection without a request under way (before its first
                                                    request head or WebSocket handshake is complete, and between
                                                    requests) is closed after this
``OPENENV_REQUEST_TIMEOUT_S``           60          at the front of ``openenv serve --workers``: a whole HTTP request,
                                                    head and body, must arrive within this of its first byte
                                                    (HTTP 408; the worker runs nothing)
``OPENENV_MAX_CONNECTIONS_PER_CLIENT``  256         open connections from one remote client address
``OPENENV_MAX_LOCAL_CONNECTIONS``       0           open connections from this machine (loopback and Unix-socket
                                                    peers together: a trainer's own rollouts)
``OPENENV_SESSION_IDLE_TIMEOUT_S``      600         a session with a socket attached that no call has used for
                                                    this long is closed; its next call is told why
``OPENENV_MAX_UNSENT_MB``               64          what the server holds unsent for a client that does not read
                                                    (pongs, answers); beyond it the client is dropped
``OPENENV_RESUME_GRACE_S``              60          how long the session of a resumable ``/ws`` connection that
                                                    dropped uncleanly waits for its client to resume it (0: no
                                                    resume; see docs/resume.md). Only time without a connection
                                                    counts, from the session's last call: a resume that makes
                                                    no call does not restart it
``OPENENV_RESUME_MAX_SUSPENDED_S``      3 x above   the most time in all that one such session may spend
                                                    without a connection, however often it is resumed; then
                                                    it is closed (0: no bound but the grace period)
``OPENENV_MAX_SNAPSHOT_MB``             16          a session snapshot, made or given to restore (``SNAPSHOT_REFUSED``;
                                                    restoring one also needs the message limit to hold it,
                                                    base64-encoded: 4/3 of its size)
``OPENENV_WS_PING_INTERVAL_S``          20          seconds between the server's WebSocket pings (0: none)
``OPENENV_WS_PING_TIMEOUT_S``           300         a client that leaves a ping unanswered this long is dropped
                                                    (0: never): long enough for a trainer whose event loop is
                                                    busy for minutes with its model
======================================  ==========  ============================================================

The limits (``OPENENV_MAX_MESSAGE_MB`` and the rows below it) are one object, :class:`ServerLimits`:
built in code (``create_app(..., limits=...)``) or read from their variables (``from_env``), and
handed by the app to the runner (:mod:`.serving.runner`) and the transport. ``0`` turns a limit off, but for
the message limit. Their defaults suit a trainer that waits minutes for its model between two steps.
A forwarder in front of the server (``openenv serve`` relays TCP to the server's Unix socket, a
reverse proxy on this machine) makes every client it relays look local: the front must bound its
own clients. ``openenv serve``'s forwarder applies ``OPENENV_MAX_CONNECTIONS_PER_CLIENT`` to the
remote addresses it accepts.

Variables read elsewhere, by other parts: ``OPENENV_CLIENT_MODE`` (clients),
``OPENENV_SANDBOX_CONFIG`` (the sandbox runtime).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Callable, Mapping, Optional, Tuple

from typing_extensions import TypedDict

from .types import ServerMode

_MIB = 1024 * 1024
RESUME_MAX_SUSPENDED_GRACES = 3
"""``OPENENV_RESUME_MAX_SUSPENDED_S``'s default, in grace periods: a client whose link drops now and
then resumes many times within it; one that keeps a session suspended (resuming only to drop again)
loses it."""
DEFAULT_TRAJECTORY_STEPS = 10_000
"""Entries of each session's trajectory kept on a server with a grader's token, unless
``OPENENV_MAX_TRAJECTORY_STEPS`` says otherwise."""
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


def _amount(unit: str, zero: Optional[str] = "0 turns the limit off") -> Callable[[str], float]:
    """A parser of a finite number of ``unit``: at least 0 (``zero`` says what 0 means), or more
    than 0 where ``zero`` is None."""

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (zero is None and value == 0):
            least = "more than 0" if zero is None else f"at least 0 ({zero})"
            raise ValueError(f"must be a finite number of {unit}, {least}")
        return value

    return parse


def _prefix(raw: str) -> str:
    if not (raw.isascii() and raw.replace("_", "").isalnum() and len(raw) <= 32):
        raise ValueError("must be 1 to 32 letters, digits or underscores (no '-': it ends the prefix)")
    return raw


def _origins(raw: str) -> Tuple[str, ...]:
    found = []
    for item in (part.strip().lower() for part in raw.split(",")):
        if not item:
            continue
        scheme, sep, rest = item.partition("://")
        if item != "*" and (scheme not in ("http", "https") or not sep or not rest or "/" in rest):
            raise ValueError(
                "must be '*' or origins like https://example.org or http://127.0.0.1:8000, comma-separated"
            )
        found.append(item)
    return tuple(found)


_HOST_NAME = re.compile(r"\.?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


def _hosts(raw: str) -> Tuple[str, ...]:
    found = []
    for item in (part.strip().lower() for part in raw.split(",")):
        if not item:
            continue
        if item != "*" and (len(item) > 253 or not _HOST_NAME.fullmatch(item)):
            raise ValueError(
                "must be '*' or host names like env.example.org (a leading dot: the name and every "
                "name under it), comma-separated, without scheme or port"
            )
        found.append(item)
    return tuple(found)


def _mode(raw: str) -> ServerMode:
    try:
        return ServerMode(raw.lower())
    except ValueError:
        raise ValueError("must be one of " + ", ".join(m.value for m in ServerMode)) from None


_TIMEOUT = _amount("seconds", "0: no timeout")

_PARSERS: Mapping[str, Callable[[str], Any]] = {
    "mode": _mode,
    "max_sessions": _count(1),
    "step_timeout_s": lambda raw: _TIMEOUT(raw) or None,
    "worker_threads": _count(0),
    "error_details": _auto_boolean,
    "auth_token": str,
    "grader_token": str,
    "observer_token": str,
    "snapshot_key": str,
    "max_trajectory_steps": _count(0),
    "session_id_prefix": _prefix,
    "library_internals": _boolean,
    "allowed_origins": _origins,
    "allowed_hosts": _hosts,
    "gc_tuning": _boolean,
    "sched_batch": _boolean,
    "web": _boolean,
    # the fields of ServerLimits, read by ServerLimits.from_env
    "max_message_mb": _amount("MiB", None),  # the largest frame accepted
    "max_inflight_mb": _amount("MiB"),
    "header_timeout_s": _amount("seconds"),
    "request_timeout_s": _amount("seconds"),
    "max_connections_per_client": _count(0),
    "max_local_connections": _count(0),
    "session_idle_timeout_s": _amount("seconds"),
    "max_unsent_mb": _amount("MiB"),
    "resume_grace_s": _amount("seconds", "0: no resume"),
    "resume_max_suspended_s": _amount("seconds", "0: no bound but OPENENV_RESUME_GRACE_S"),
    "max_snapshot_mb": _amount("MiB", None),
    "ws_ping_interval_s": _amount("seconds", "0: no pings"),
    "ws_ping_timeout_s": _amount("seconds", "0: no timeout"),
}
"""How each field's ``OPENENV_<FIELD>`` variable is parsed."""

_ARGUMENTS: Mapping[str, Tuple[Tuple[type, ...], str]] = {
    "mode": ((str,), "a ServerMode or its name"),  # a ServerMode is a str
    "max_sessions": ((int,), "an int"),
    "step_timeout_s": ((int, float), "a number"),
    "worker_threads": ((int,), "an int"),
    "error_details": ((bool,), "True, False"),
    "auth_token": ((str,), "a str"),
    "grader_token": ((str,), "a str"),
    "observer_token": ((str,), "a str"),
    "snapshot_key": ((str,), "a str"),
    "max_trajectory_steps": ((int,), "an int"),
    "session_id_prefix": ((str,), "a str"),
    "gc_tuning": ((bool,), "True, False"),
    "sched_batch": ((bool,), "True, False"),
    "web": ((bool,), "True, False"),
}
"""The fields :meth:`ServerSettings.resolve` takes as arguments: the types each may have, in code
and in words."""


_VARIABLES: Mapping[str, str] = {"web": "ENABLE_WEB_INTERFACE"}
"""Fields whose variable is not ``OPENENV_<FIELD>`` (upstream's names)."""


_TOKEN_FIELDS = frozenset({"auth_token", "grader_token", "observer_token"})


def read(environ: Mapping[str, str], field: str) -> Any:
    """The value of ``field``'s variable in ``environ`` (``dataclasses.MISSING`` when unset or
    blank); a ``ValueError`` naming the variable when it does not parse. A token may also be
    given as a file holding it (``OPENENV_AUTH_TOKEN_FILE``, ...), read when its variable is unset."""
    name = _VARIABLES.get(field) or "OPENENV_" + field.upper()
    raw = environ.get(name, "").strip()
    if not raw and field in _TOKEN_FIELDS and environ.get(name + "_FILE", "").strip():
        path = environ[name + "_FILE"].strip()
        try:
            with open(path, encoding="utf-8") as file:
                raw = file.read().strip()
        except OSError as exc:
            raise ValueError(f"{name}_FILE names a file that cannot be read ({exc.strerror}): {path}") from None
    if not raw:
        return dataclasses.MISSING
    try:
        return _PARSERS[field](raw)
    except ValueError as exc:
        raise ValueError(f"{name} {exc}, got {raw!r}") from None


def check_argument(field: str, value: Any) -> Any:
    """An argument given in code for ``field``, checked as strictly as its variable would be: of
    the field's type, then parsed as the variable's text would be."""
    types, words = _ARGUMENTS[field]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):  # True is an int too
        raise TypeError(f"{field} must be {words} or None, got {type(value).__name__}")
    try:
        return _PARSERS[field](value if isinstance(value, str) else str(value))
    except ValueError as exc:
        raise ValueError(f"{field} {exc}, got {value!r}") from None


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """The limits of the module docstring's table (each field its variable's name in lower case,
    less ``OPENENV_``), sizes in MiB and times in seconds; invalid values raise ``ValueError``
    naming the field."""

    max_message_mb: float = 32.0
    max_inflight_mb: Optional[float] = None
    header_timeout_s: float = 10.0
    request_timeout_s: float = 60.0
    max_connections_per_client: int = 256
    max_local_connections: int = 0
    session_idle_timeout_s: float = 600.0
    max_unsent_mb: float = 64.0
    resume_grace_s: float = 60.0
    resume_max_suspended_s: Optional[float] = None  # None: RESUME_MAX_SUSPENDED_GRACES x resume_grace_s
    max_snapshot_mb: float = 16.0
    ws_ping_interval_s: float = 20.0
    ws_ping_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.name in ("max_inflight_mb", "resume_max_suspended_s"):  # derived
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"ServerLimits.{field.name} must be a number, got {value!r}")
            try:
                _PARSERS[field.name](str(value))  # as strictly as its variable
            except ValueError as exc:
                raise ValueError(f"ServerLimits.{field.name} {exc}, got {value!r}") from None

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **fields: Any) -> ServerLimits:
        """The limits ``OPENENV_*`` sets (``environ``: ``os.environ``) over ``fields`` (keyword
        arguments that are not None) over the defaults: a variable that is set wins, as for every
        setting."""
        env = os.environ if environ is None else environ
        values = {name: value for name, value in fields.items() if value is not None}
        for field in dataclasses.fields(cls):
            value = read(env, field.name)
            if value is not dataclasses.MISSING:
                values[field.name] = value
        return cls(**values)

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mb * _MIB)

    @property
    def max_snapshot_bytes(self) -> int:
        return int(self.max_snapshot_mb * _MIB)

    @property
    def max_inflight_bytes(self) -> Optional[int]:
        """None: no budget."""
        mb = 4 * self.max_message_mb if self.max_inflight_mb is None else self.max_inflight_mb
        return int(mb * _MIB) or None

    @property
    def max_unsent_bytes(self) -> Optional[int]:
        return int(self.max_unsent_mb * _MIB) or None

    @property
    def resume_suspended_cap_s(self) -> Optional[float]:
        """The seconds a resumable session may spend without a connection in all (None: no cap)."""
        cap = self.resume_max_suspended_s
        if cap is None:
            cap = RESUME_MAX_SUSPENDED_GRACES * self.resume_grace_s
        return cap or None


class ServerOptions(TypedDict, total=False):
    """The keywords of ``create_app`` that :meth:`ServerSettings.resolve` takes (None: not given)."""

    step_timeout_s: Optional[float]
    max_message_size_mb: Optional[float]
    worker_threads: Optional[int]
    error_details: Optional[bool]
    auth_token: Optional[str]
    grader_token: Optional[str]
    observer_token: Optional[str]
    snapshot_key: Optional[str]
    max_trajectory_steps: Optional[int]
    web: Optional[bool]
    session_id_prefix: Optional[str]
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
    auth_token: Optional[str] = dataclasses.field(default=None, repr=False)
    """The orchestrator's token (``OPENENV_AUTH_TOKEN``): every call but ``/health`` needs a token."""
    grader_token: Optional[str] = dataclasses.field(default=None, repr=False)
    """The grader's token (``OPENENV_GRADER_TOKEN``): read-only inspection (see :mod:`.roles`)."""
    observer_token: Optional[str] = dataclasses.field(default=None, repr=False)
    """The observer's token (``OPENENV_OBSERVER_TOKEN``): progress only."""
    session_id_prefix: Optional[str] = None
    """None: session ids are plain uuids."""
    snapshot_key: Optional[str] = dataclasses.field(default=None, repr=False)
    """The key that signs session snapshots (None: one drawn at random per server)."""
    max_trajectory_steps: Optional[int] = None
    """Entries of each session's trajectory kept (0: none recorded; None: as
    :attr:`trajectory_entries` says)."""
    limits: ServerLimits = dataclasses.field(default_factory=ServerLimits)
    gc_tuning: Optional[bool] = None
    sched_batch: bool = False
    web: bool = False
    """Serve the web playground (``ENABLE_WEB_INTERFACE``, ``create_app(..., web=True)``)."""
    allowed_origins: Tuple[str, ...] = ()
    """Other sites' pages that may use this server from a browser (``OPENENV_ALLOWED_ORIGINS``)."""
    allowed_hosts: Tuple[str, ...] = ()
    """Names beyond ``localhost`` and IP addresses by which a browser may reach this server
    (``OPENENV_ALLOWED_HOSTS``)."""

    @property
    def trajectory_entries(self) -> int:
        """How many entries of each session's trajectory the server keeps (0: it records none).
        Unless ``OPENENV_MAX_TRAJECTORY_STEPS`` (or the argument) says, it records
        :data:`DEFAULT_TRAJECTORY_STEPS` on a server with a grader's token and nothing elsewhere:
        the record costs no CPU worth measuring, but it keeps each step's action and observation
        alive (memory, and objects for the garbage collector to walk) until the next reset, which
        is worth paying where a grader may ask for it."""
        if self.max_trajectory_steps is not None:
            return self.max_trajectory_steps
        return DEFAULT_TRAJECTORY_STEPS if self.grader_token else 0

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
        unknown = set(arguments) - set(_ARGUMENTS)
        if unknown:
            raise TypeError(f"unknown server setting(s): {', '.join(sorted(unknown))}")
        library_internals_enabled(env)  # process-wide, read where it is used; refused here if bad
        values: dict = {}
        for field in _ARGUMENTS:
            value = read(env, field)
            if value is dataclasses.MISSING:
                value = arguments.get(field)
                if value is None:
                    continue
                value = check_argument(field, value)
            values[field] = value
        own = dataclasses.asdict(limits) if limits is not None else {}
        if max_message_size_mb is not None:
            own["max_message_mb"] = max_message_size_mb
        values["limits"] = ServerLimits.from_env(env, **own)
        for field in ("allowed_origins", "allowed_hosts"):
            value = read(env, field)
            if value is not dataclasses.MISSING:
                values[field] = value
        space = env.get("SPACE_HOST", "").strip().lower()  # set by Hugging Face in a Space's container
        if space and _HOST_NAME.fullmatch(space):
            values["allowed_hosts"] = (*values.get("allowed_hosts", ()), space)
        return cls(**values)


def library_internals_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """``OPENENV_LIBRARY_INTERNALS``: whether :mod:`._compat` may rely on other libraries'
    internals. A setting of the process, not of one server: each ``_compat`` module reads it
    where it decides (FastMCP's once, at import)."""
    value = read(os.environ if environ is None else environ, "library_internals")
    return True if value is dataclasses.MISSING else value
