"""The echo environment's server: ``uvicorn echo_env.server.app:app`` (or ``server.app:app``
from this directory). ``MAX_CONCURRENT_ENVS`` sets how many sessions it holds (default 64)."""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

try:
    from ..models import EchoObservation
    from .echo_environment import EchoEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import EchoObservation  # type: ignore[no-redef]
    from server.echo_environment import EchoEnvironment  # type: ignore[no-redef]

app = create_app(
    EchoEnvironment,
    CallToolAction,
    CallToolObservation,
    env_name="echo_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    reset_observation_cls=EchoObservation,
)


def main() -> None:
    """``server``: run the echo environment on http://127.0.0.1:8000 (``--host``/``--port`` to change)."""
    from openenv.core.env_server.serving.runner import serve_main

    serve_main(app, "Serve the echo environment")


if __name__ == "__main__":
    main()
