"""The Grid World environment's server app.

Serve it with ``grid-world-env-server`` (the console script), ``uvicorn grid_world_env.server.app:app``
or, from the package directory, ``uvicorn server.app:app``. ``MAX_CONCURRENT_ENVS`` sets how many
sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import serve_main

try:
    from ..models import GridWorldAction, GridWorldObservation, GridWorldState
    from .grid_world_environment import GridWorldEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import GridWorldAction, GridWorldObservation, GridWorldState  # type: ignore[no-redef]
    from server.grid_world_environment import GridWorldEnvironment  # type: ignore[no-redef]

app = create_app(
    GridWorldEnvironment,
    GridWorldAction,
    GridWorldObservation,
    env_name="grid_world_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    state_cls=GridWorldState,
)


def main() -> None:
    """Serve the environment on http://127.0.0.1:8000 (``--host`` and ``--port`` change that)."""
    serve_main(app, "Serve the Grid World environment")


if __name__ == "__main__":
    main()
