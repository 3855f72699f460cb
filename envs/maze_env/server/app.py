"""The Maze environment's server app.

Serve it with ``maze-env-server`` (the console script), ``uvicorn maze_env.server.app:app``
or, from the package directory, ``uvicorn server.app:app``. ``MAX_CONCURRENT_ENVS`` sets how many
sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import serve_main

try:
    from ..models import MazeAction, MazeObservation, MazeState
    from .maze_environment import MazeEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import MazeAction, MazeObservation, MazeState  # type: ignore[no-redef]
    from server.maze_environment import MazeEnvironment  # type: ignore[no-redef]

app = create_app(
    MazeEnvironment,
    MazeAction,
    MazeObservation,
    env_name="maze_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    state_cls=MazeState,
)


def main() -> None:
    """Serve the environment on http://127.0.0.1:8000 (``--host`` and ``--port`` change that)."""
    serve_main(app, "Serve the Maze environment")


if __name__ == "__main__":
    main()
