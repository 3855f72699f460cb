"""Serving: running an environment's app in a process, with every OpenEnv limit on its transport.

* :mod:`.runner` — uvicorn in the foreground (:func:`~.runner.run_server`,
  :func:`~.runner.serve_main`, ``python -m openenv.core.env_server``) or on a background thread
  (:class:`~.runner.BackgroundServer`), with the app's limits put on uvicorn and its transport
  guard (:mod:`.._compat.uvicorn`);
* :mod:`.access_log` — keeping the capacity polls of ``openenv serve --workers N``'s front out of
  each worker's access log.

What a request meets once it is served is the app's (:mod:`..http_server`). Running servers in
sandboxes, behind a TCP address, until a signal (``openenv serve``) is the providers' part:
:mod:`openenv.core.containers.runtime.package_server`.
"""
