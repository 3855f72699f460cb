"""The FinQA environment's server: ``uvicorn finqa_env.server.app:app`` (or ``server.app:app`` from
this directory). ``FINQA_MAX_STEPS`` bounds the tool calls of an episode (default 50);
``MAX_CONCURRENT_ENVS`` sets how many sessions it holds (default 64)."""

from __future__ import annotations

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation

try:
    from ..models import FinQAState
    from .finqa_environment import FinQAEnvironment
except ImportError:  # served from the package directory as `server.app:app`
    from models import FinQAState  # type: ignore[no-redef]
    from server.finqa_environment import FinQAEnvironment  # type: ignore[no-redef]

app = create_app(
    FinQAEnvironment,
    CallToolAction,
    CallToolObservation,
    env_name="finqa_env",
    state_cls=FinQAState,
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "64")),
    reset_observation_cls=Observation,
)


def main() -> None:
    """``server``: run the environment on http://127.0.0.1:8000 (``--host``/``--port`` to change)."""
    from openenv.core.env_server.serving.runner import serve_main

    serve_main(app, "Serve the FinQA environment")


if __name__ == "__main__":
    main()
