"""The import path environment packages and scripts have used to run a server
(``from openenv.core.env_server.runner import serve_main, BackgroundServer``): kept, so that they
go on working. The code lives in :mod:`.serving.runner`."""

from .serving.runner import BackgroundServer, main, run_server, serve_main, uvicorn_config

__all__ = ["BackgroundServer", "main", "run_server", "serve_main", "uvicorn_config"]
