"""The Maze environment's server app.

Serve it with ``maze-env-server`` (the console script), ``uvicorn maze_env.server.app:app``
or, from the package directory, ``uvicorn server.app:app``. ``MAX_CONCURRENT_ENVS`` sets how many
sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.runner import run_server

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
    import argparse

    parser = argparse.ArgumentParser(description="Serve the Maze environment")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    args = parser.parse_args()
    run_server(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
