"""The Connect Four environment's server app.

Serve it with ``connect4-env-server``, ``uvicorn connect4_env.server.app:app`` or, from the
package directory, ``uvicorn server.app:app``. ``CONNECT4_OPPONENT`` sets the default opponent
(``random`` or ``greedy``); ``MAX_CONCURRENT_ENVS`` how many sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import serve_main

try:
    from ..models import Connect4Action, Connect4Observation, Connect4State
    from .connect4_environment import Connect4Environment
except ImportError:  # served from the package directory as `server.app:app`
    from models import Connect4Action, Connect4Observation, Connect4State  # type: ignore[no-redef]
    from server.connect4_environment import Connect4Environment  # type: ignore[no-redef]

app = create_app(
    Connect4Environment,
    Connect4Action,
    Connect4Observation,
    env_name="connect4_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    state_cls=Connect4State,
)


def main() -> None:
    """Serve the environment on http://127.0.0.1:8000 (``--host`` and ``--port`` change that)."""
    serve_main(app, "Serve the Connect Four environment")


if __name__ == "__main__":
    main()
