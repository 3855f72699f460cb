"""The Gymnasium environment's server app.

Serve it with ``gymnasium-env-server`` (the console script), ``uvicorn gymnasium_env.server.app:app``
or, from the package directory, ``uvicorn server.app:app``. ``MAX_CONCURRENT_ENVS`` sets how many
sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import serve_main

try:
    from ..models import GymnasiumAction, GymnasiumObservation, GymnasiumState
    from .gymnasium_environment import ClassicControlEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import GymnasiumAction, GymnasiumObservation, GymnasiumState  # type: ignore[no-redef]
    from server.gymnasium_environment import ClassicControlEnvironment  # type: ignore[no-redef]

app = create_app(
    ClassicControlEnvironment,
    GymnasiumAction,
    GymnasiumObservation,
    env_name="gymnasium_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    state_cls=GymnasiumState,
)


def main() -> None:
    """Serve the environments on http://127.0.0.1:8000 (``--host`` and ``--port`` change that)."""
    serve_main(app, "Serve Gymnasium's classic-control environments")


if __name__ == "__main__":
    main()
