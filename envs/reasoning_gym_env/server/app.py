"""The Reasoning Gym environment's server: ``uvicorn reasoning_gym_env.server.app:app`` (or ``server.app:app``
from this directory). ``MAX_CONCURRENT_ENVS`` sets how many sessions it holds (default 64)."""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app

try:
    from ..models import ReasoningGymAction, ReasoningGymObservation, ReasoningGymState
    from .reasoning_gym_environment import ReasoningGymEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import ReasoningGymAction, ReasoningGymObservation, ReasoningGymState  # type: ignore[no-redef]
    from server.reasoning_gym_environment import ReasoningGymEnvironment  # type: ignore[no-redef]

app = create_app(
    ReasoningGymEnvironment,
    ReasoningGymAction,
    ReasoningGymObservation,
    env_name="reasoning_gym_env",
    state_cls=ReasoningGymState,
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
)


def main() -> None:
    """``server``: run the environment on http://127.0.0.1:8000 (``--host``/``--port`` to change)."""
    from openenv.core.env_server.serving.runner import serve_main

    serve_main(app, "Serve the Reasoning Gym environment")


if __name__ == "__main__":
    main()
