"""The Connect Four environment's server app.

Serve it with ``connect4-env-server``, ``uvicorn connect4_env.server.app:app`` or, from the
package directory, ``uvicorn server.app:app``. ``CONNECT4_OPPONENT`` sets the default opponent
(``random`` or ``greedy``); ``MAX_CONCURRENT_ENVS`` how many sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.runner import run_server

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
    import argparse

    parser = argparse.ArgumentParser(description="Serve the Connect Four environment")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    args = parser.parse_args()
    run_server(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
