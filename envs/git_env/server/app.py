"""The git environment's server: ``uvicorn git_env.server.app:app`` (or ``server.app:app`` from
this directory). ``MAX_CONCURRENT_ENVS`` sets how many sessions it holds (default 64);
``GIT_ENV_ISOLATION`` ("sandbox", the default, or "none") how commands are confined."""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

try:
    from ..models import GitObservation, GitState
    from .git_environment import GitEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import GitObservation, GitState  # type: ignore[no-redef]
    from server.git_environment import GitEnvironment  # type: ignore[no-redef]

app = create_app(
    GitEnvironment,
    CallToolAction,
    CallToolObservation,
    env_name="git_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    reset_observation_cls=GitObservation,
    state_cls=GitState,
)


def main() -> None:
    """``git-env-server``: serve on http://127.0.0.1:8000 (``--host``/``--port`` to change)."""
    from openenv.core.env_server.serving.runner import serve_main

    serve_main(app, "Serve the git environment")


if __name__ == "__main__":
    main()
