"""The coding environment's server: ``uvicorn coding_env.server.app:app`` (or ``server.app:app``
from this directory). ``MAX_CONCURRENT_ENVS`` sets how many sessions it holds (default 64);
``CODING_TIMEOUT_S``, ``CODING_MEMORY_MB`` and ``CODING_ISOLATION`` configure the code sandbox."""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import serve_main

try:
    from ..models import CodeAction, CodeObservation, CodeState
    from .coding_environment import CodingEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import CodeAction, CodeObservation, CodeState  # type: ignore[no-redef]
    from server.coding_environment import CodingEnvironment  # type: ignore[no-redef]

app = create_app(
    CodingEnvironment,
    CodeAction,
    CodeObservation,
    env_name="coding_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    state_cls=CodeState,
)


def main() -> None:
    """Serve the coding environment on http://127.0.0.1:8000 (``--host``/``--port`` to change)."""
    serve_main(app, "Serve the coding environment")


if __name__ == "__main__":
    main()
