"""The OpenSpiel environment's server app.

Serve it with ``openspiel-env-server``, ``uvicorn openspiel_env.server.app:app`` or, from the
package directory, ``uvicorn server.app:app``. ``OPENSPIEL_GAME``, ``OPENSPIEL_AGENT_PLAYER`` and
``OPENSPIEL_OPPONENT_POLICY`` set the defaults of every session; ``MAX_CONCURRENT_ENVS`` how many
sessions it holds at once (default 64).
"""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import serve_main

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
    serve_main(app, "Serve the OpenSpiel environment")


if __name__ == "__main__":
    main()
