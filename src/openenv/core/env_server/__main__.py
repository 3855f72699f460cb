"""``python -m openenv.core.env_server server.app:app --host 0.0.0.0 --port 8000``: serve an
environment's ASGI app with every OpenEnv limit on its transport (see :func:`.serving.runner.main`)."""

from openenv.core.env_server.serving.runner import main

main()
