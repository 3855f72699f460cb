"""The REPL environment's server: ``uvicorn repl_env.server.app:app`` (or ``server.app:app``
from this directory). ``MAX_CONCURRENT_ENVS`` sets how many sessions it holds (default 64), each
with its own sandboxed worker; ``REPL_TIMEOUT_S``, ``REPL_MEMORY_MB`` and ``REPL_ISOLATION``
configure the workers."""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import serve_main

try:
    from ..models import REPLAction, REPLObservation, REPLState
    from .repl_environment import REPLEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import REPLAction, REPLObservation, REPLState  # type: ignore[no-redef]
    from server.repl_environment import REPLEnvironment  # type: ignore[no-redef]

app = create_app(
    REPLEnvironment,
    REPLAction,
    REPLObservation,
    env_name="repl_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    state_cls=REPLState,
)


def main() -> None:
    """Serve the REPL environment on http://127.0.0.1:8000 (``--host``/``--port`` to change)."""
    serve_main(app, "Serve the REPL environment")


if __name__ == "__main__":
    main()
