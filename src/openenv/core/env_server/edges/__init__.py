"""The edges: what the server enforces before a request reaches a route, as ASGI middlewares
that ``create_app`` composes around the app.

* :mod:`.middleware` — the middlewares themselves, from the outside in: the transport's limits
  on a server not started by the runner, the error-detail scope, other sites' pages, the bearer
  token and the bound on HTTP request bodies (the WebSocket routes, which ``create_app`` puts
  between the last two, are a transport's: :class:`..transports.ws.WebSocketRoutes`);
* :mod:`.auth` — the bearer token (``OPENENV_AUTH_TOKEN``): checking it, and which requests go
  without it (the container front of ``openenv serve --workers`` checks it with the same code).

Limits that act below ASGI, on the connection and its frames, are the transport guard's
(:mod:`.._compat.uvicorn`), by the table of :mod:`..limits`.
"""
