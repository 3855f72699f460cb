"""The TextArena environment's server: ``uvicorn textarena_env.server.app:app`` (or ``server.app:app``
from this directory). ``TEXTARENA_ENV_ID`` picks the default game, ``TEXTARENA_MAX_TURNS`` the
turn limit, ``MAX_CONCURRENT_ENVS`` how many sessions it holds (default 64)."""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app

try:
    from ..models import TextArenaAction, TextArenaObservation, TextArenaState
    from .textarena_environment import TextArenaEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import TextArenaAction, TextArenaObservation, TextArenaState  # type: ignore[no-redef]
    from server.textarena_environment import TextArenaEnvironment  # type: ignore[no-redef]

app = create_app(
    TextArenaEnvironment,
    TextArenaAction,
    TextArenaObservation,
    env_name="textarena_env",
    state_cls=TextArenaState,
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
)


def main() -> None:
    """``server``: run the environment on http://127.0.0.1:8000 (``--host``/``--port`` to change)."""
    from openenv.core.env_server.serving.runner import serve_main

    serve_main(app, "Serve the TextArena environment")


if __name__ == "__main__":
    main()
