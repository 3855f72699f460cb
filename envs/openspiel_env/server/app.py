"""The OpenSpiel environment's server app.

Serve it with ``openspiel-env-server``, ``uvicorn openspiel_env.server.app:app`` or, from the
package directory, ``uvicorn server.app:app``. ``OPENSPIEL_GAME``, ``OPENSPIEL_AGENT_PLAYER`` and
``OPENSPIEL_OPPONENT_POLICY`` set the defaults of every session; ``MAX_CONCURRENT_ENVS`` how many
sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.runner import run_server

try:
    from ..models import OpenSpielAction, OpenSpielObservation, OpenSpielState
    from .openspiel_environment import OpenSpielEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import OpenSpielAction, OpenSpielObservation, OpenSpielState  # type: ignore[no-redef]
    from server.openspiel_environment import OpenSpielEnvironment  # type: ignore[no-redef]

app = create_app(
    OpenSpielEnvironment,
    OpenSpielAction,
    OpenSpielObservation,
    env_name="openspiel_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    state_cls=OpenSpielState,
)


def main() -> None:
    """Serve the environment on http://127.0.0.1:8000 (``--host`` and ``--port`` change that)."""
    import argparse

    parser = argparse.ArgumentParser(description="Serve the OpenSpiel environment")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    args = parser.parse_args()
    run_server(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
