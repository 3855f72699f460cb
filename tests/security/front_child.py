"""Run a :class:`Front` in a process of its own, for tests that measure it (its memory, its
descriptors) apart from the test's.

    python front_child.py '{"workers": {"w0": "/path/to/socket"}, "limits": {...}, "token": null,
                            "nofile": [256, 256], "cap_local": false, "max_per_client": null}'

``nofile`` (optional) sets this process's limit of open files (soft, hard) before the front starts.
Prints one JSON line once it listens (``port``, and ``nofile``: the soft limit then in force,
``max_connections``), then serves until its stdin closes. The front's log goes to stderr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
import threading


async def main(config: dict) -> None:
    from openenv.core.containers.runtime.front import Front, Worker
    from openenv.core.env_server.limits import ServerLimits

    workers = config["workers"]
    front = Front(
        [Worker(prefix) for prefix in workers],
        "127.0.0.1",
        0,
        token=config.get("token"),
        limits=ServerLimits(**config.get("limits", {})),
        max_per_client=config.get("max_per_client"),
        cap_local=config.get("cap_local", False),
    )
    for prefix, path in workers.items():
        front.set_up(prefix, path)
    _host, port = await front.start()
    await front.refresh()
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    print(
        json.dumps({"port": port, "nofile": soft, "max_connections": getattr(front, "max_connections", None)}),
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()
    await stop.wait()
    await front.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    settings = json.loads(sys.argv[1])
    if settings.get("nofile"):
        resource.setrlimit(resource.RLIMIT_NOFILE, tuple(settings["nofile"]))
    asyncio.run(main(settings))
