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
    import argparse

    from openenv.core.env_server.runner import run_server

    parser = argparse.ArgumentParser(description="Serve the Reasoning Gym environment")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    run_server(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
