"""The chess environment's server app.

Serve it with ``chess-env-server``, ``uvicorn chess_env.server.app:app`` or, from the
package directory, ``uvicorn server.app:app``. ``CHESS_OPPONENT``, ``CHESS_OPPONENT_DEPTH``,
``CHESS_MAX_PLIES`` and ``CHESS_AGENT_COLOR`` set the defaults of every session;
``MAX_CONCURRENT_ENVS`` how many sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import serve_main

try:
    from ..models import ChessAction, ChessObservation, ChessState
    from .chess_environment import ChessEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import ChessAction, ChessObservation, ChessState  # type: ignore[no-redef]
    from server.chess_environment import ChessEnvironment  # type: ignore[no-redef]

app = create_app(
    ChessEnvironment,
    ChessAction,
    ChessObservation,
    env_name="chess_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    state_cls=ChessState,
)


def main() -> None:
    """Serve the environment on http://127.0.0.1:8000 (``--host`` and ``--port`` change that)."""
    serve_main(app, "Serve the chess environment")


if __name__ == "__main__":
    main()
