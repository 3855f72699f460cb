"""The Snake environment's server app.

Serve it with ``snake-env-server`` (the console script), ``uvicorn snake_env.server.app:app``
or, from the package directory, ``uvicorn server.app:app``. ``MAX_CONCURRENT_ENVS`` sets how many
sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import serve_main

try:
    from ..models import SnakeAction, SnakeObservation, SnakeState
    from .snake_environment import SnakeEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import SnakeAction, SnakeObservation, SnakeState  # type: ignore[no-redef]
    from server.snake_environment import SnakeEnvironment  # type: ignore[no-redef]

app = create_app(
    SnakeEnvironment,
    SnakeAction,
    SnakeObservation,
    env_name="snake_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    state_cls=SnakeState,
)


def main() -> None:
    """Serve the environment on http://127.0.0.1:8000 (``--host`` and ``--port`` change that)."""
    serve_main(app, "Serve the Snake environment")


if __name__ == "__main__":
    main()
