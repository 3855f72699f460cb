"""The capture proxy's settings: every bound it keeps, typed, each readable from the environment.

========================================  ==========  ====================================================
variable                                  default     what
========================================  ==========  ====================================================
``OPENENV_CAPTURE_ADMIN_KEY``             generated   the key the admin routes (``/sessions*``) require
``OPENENV_CAPTURE_JOURNAL_DIR``           see below   where each session's journal is written
``OPENENV_CAPTURE_FSYNC``                 0           ``1``: fsync each journalled turn (survives a machine
                                                      crash, not only a killed proxy; costs a disk flush)
``OPENENV_CAPTURE_MAX_BODY_MB``           32          an agent's request body; larger gets 413
``OPENENV_CAPTURE_MAX_UPSTREAM_CALLS``    64          engine calls in flight at once; more wait their turn
``OPENENV_CAPTURE_QUEUE_TIMEOUT_S``       60          a call that waited this long for its turn gets 503
``OPENENV_CAPTURE_MAX_SESSION_CALLS``     8           calls in flight for one session; more get 429
``OPENENV_CAPTURE_UPSTREAM_TIMEOUT_S``    600         one engine call; longer gets 504
``OPENENV_CAPTURE_MAX_SESSIONS``          10000       live sessions; minting more gets 429
``OPENENV_CAPTURE_SESSION_TTL_S``         86400       a session unused this long is deleted with its journal
``OPENENV_CAPTURE_KEEPALIVE_S``           10          a streamed answer slower than this commits its headers
                                                      and sends SSE comments while the engine works
========================================  ==========  ====================================================

Journals: ``journal_dir`` if given, else ``OPENENV_CAPTURE_JOURNAL_DIR``, else
``$XDG_STATE_HOME/openenv/capture/<listen address>`` (``~/.local/state`` when unset), so a proxy
restarted on the same port or socket finds the sessions it served. A proxy on an ephemeral port
(0) gets a directory of its own there.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Dict, Optional


def _env_number(name: str, default: float, *, integer: bool = False) -> Any:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return int(value) if integer else value


@dataclass(frozen=True)
class CaptureLimits:
    """The bounds the proxy keeps; each refusal is an error in the agent's own dialect."""

    max_body_bytes: int = 32 << 20
    max_upstream_calls: int = 64
    queue_timeout_s: float = 60.0
    max_session_calls: int = 8
    upstream_timeout_s: float = 600.0
    max_sessions: int = 10_000
    session_ttl_s: float = 86_400.0
    keepalive_s: float = 10.0
    fsync: bool = False

    @classmethod
    def from_env(cls, **overrides: Any) -> CaptureLimits:
        """Defaults, then ``OPENENV_CAPTURE_*`` variables, then ``overrides`` (None ones skipped)."""
        base = cls(
            max_body_bytes=int(_env_number("OPENENV_CAPTURE_MAX_BODY_MB", 32) * (1 << 20)),
            max_upstream_calls=_env_number("OPENENV_CAPTURE_MAX_UPSTREAM_CALLS", 64, integer=True),
            queue_timeout_s=_env_number("OPENENV_CAPTURE_QUEUE_TIMEOUT_S", 60.0),
            max_session_calls=_env_number("OPENENV_CAPTURE_MAX_SESSION_CALLS", 8, integer=True),
            upstream_timeout_s=_env_number("OPENENV_CAPTURE_UPSTREAM_TIMEOUT_S", 600.0),
            max_sessions=_env_number("OPENENV_CAPTURE_MAX_SESSIONS", 10_000, integer=True),
            session_ttl_s=_env_number("OPENENV_CAPTURE_SESSION_TTL_S", 86_400.0),
            keepalive_s=_env_number("OPENENV_CAPTURE_KEEPALIVE_S", 10.0),
            fsync=os.environ.get("OPENENV_CAPTURE_FSYNC", "").strip().lower() in ("1", "true", "yes", "on"),
        )
        known = {f.name for f in fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown capture limits: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
        chosen: Dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
        limits = replace(base, **chosen)
        for name in ("max_body_bytes", "max_upstream_calls", "max_session_calls", "max_sessions"):
            if getattr(limits, name) < 1:
                raise ValueError(f"capture limit {name} must be at least 1, got {getattr(limits, name)}")
        return limits


def state_dir() -> Path:
    root = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(root) / "openenv" / "capture"


def default_journal_dir(listen: str, instance: str, ephemeral: bool) -> Path:
    """Where a proxy listening on ``listen`` keeps its journals when none is named."""
    named = os.environ.get("OPENENV_CAPTURE_JOURNAL_DIR", "").strip()
    if named:
        return Path(named)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", listen).strip("_") or "proxy"
    if ephemeral:
        slug = f"ephemeral-{instance}"
    return state_dir() / slug


def admin_key_from_env() -> Optional[str]:
    value = os.environ.get("OPENENV_CAPTURE_ADMIN_KEY", "").strip()
    return value or None
