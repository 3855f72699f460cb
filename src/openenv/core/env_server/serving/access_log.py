"""Keeping OpenEnv's own polling out of a server's access log.

The front of ``openenv serve --workers N`` asks every worker for its session count about once a
second (``GET /openenv/capacity``). uvicorn's access log, on at log level ``info``, would write a
line for each: two workers idle for 20 seconds made 40 lines, drowning the clients' requests.
Such a poll carries :data:`POLL_QUERY` (``GET /openenv/capacity?openenv-poll=1``), and
:func:`quiet_polls` installs a filter on uvicorn's access logger that drops exactly those lines.
Nothing else can be hidden that way: only a capacity query with that exact query string matches,
and a client's own ``GET /openenv/capacity`` is logged as any request is.
"""

from __future__ import annotations

import logging

CAPACITY_PATH = "/openenv/capacity"
POLL_QUERY = "openenv-poll=1"
POLL_TARGET = f"{CAPACITY_PATH}?{POLL_QUERY}"
"""The request target of a front's capacity poll, the one kind of request kept out of the log."""
ACCESS_LOGGER = "uvicorn.access"


class QuietPolls(logging.Filter):
    """Drops uvicorn's access-log records of :data:`POLL_TARGET` requests."""

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn logs `'%s - "%s %s HTTP/%s" %d'` with (client, method, path and query, version, status)
        args = record.args
        return not (isinstance(args, tuple) and len(args) >= 3 and args[1] == "GET" and args[2] == POLL_TARGET)


def quiet_polls() -> None:
    """Keep capacity polls out of this process's uvicorn access log (once per process)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(existing, QuietPolls) for existing in logger.filters):
        logger.addFilter(QuietPolls())
