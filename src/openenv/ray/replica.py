"""One replica of a :class:`~openenv.ray.RayEnvPool`: a Ray actor serving an environment on its node.

The actor runs on whichever node its placement-group bundle landed on and serves the environment
there, on ``http://<node ip>:<port>``:

* sandboxed (the default): a :class:`~openenv.core.containers.runtime.SandboxProvider` runs the
  server in our sandbox on that node; the actor binds the TCP port and the sandbox inherits the
  listening socket (``listen=``), so clients reach the server with nothing in between while the
  sandbox itself has no network;
* ``sandbox=False``: the server runs in the actor process itself, on that TCP port.

The server dies with the actor (the sandbox is started with ``--die-with-parent``; the plain server
is a thread of the actor process), so when Ray kills or restarts the actor, or its node goes, no
server is left behind.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, Dict, Optional


def resolve_package(env: str) -> str:
    """The package directory of ``env``: a path (with ``openenv.yaml``) or an installed env's name."""
    path = Path(env).expanduser()
    if path.exists():
        return str(path.resolve())
    from openenv.core.discovery import resolve_environment

    return str(resolve_environment(env).path)


class ReplicaServer:
    """The body of a replica actor (wrapped with ``ray.remote`` by the pool).

    ``env_vars`` reach the server's environment (``OPENENV_AUTH_TOKEN``, ``OPENENV_MAX_SESSIONS``
    and the package's own). ``host`` defaults to this node's IP as Ray knows it.
    """

    def __init__(
        self,
        env: str,
        sandbox: bool = True,
        env_vars: Optional[Dict[str, str]] = None,
        host: Optional[str] = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.host = host or ray.util.get_node_ip_address()
        project = resolve_package(env)
        env_vars = dict(env_vars or {})
        self._provider: Any = None
        self._server: Any = None
        if sandbox:
            self.base_url = self._start_sandboxed(project, env_vars, start_timeout_s)
        else:
            self.base_url = self._start_in_process(project, env_vars, start_timeout_s)

    def _start_sandboxed(self, project: str, env_vars: Dict[str, str], timeout_s: float) -> str:
        from openenv.core.containers.runtime.sandbox import SandboxProvider

        # The actor binds the node's TCP port and hands the socket to the sandboxed server, which
        # accepts on it directly (no relay on the path) and still has no network of its own.
        self._provider = SandboxProvider(project, env_vars=env_vars, start_timeout_s=timeout_s, listen=(self.host, 0))
        url = self._provider.start()
        self._provider.wait_for_ready(timeout_s)
        return url

    def _start_in_process(self, project: str, env_vars: Dict[str, str], timeout_s: float) -> str:
        from openenv.core.env_server.serving.runner import BackgroundServer
        from openenv.core.manifest import EnvManifest

        os.environ.update(env_vars)  # read by create_app when the package's app module is imported
        if project not in sys.path:
            sys.path.insert(0, project)
        module_name, _, attribute = EnvManifest.load(project).app.partition(":")
        app: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            app = getattr(app, part)
        self._server = BackgroundServer(app, host=self.host, port=0).start(timeout_s)
        return self._server.base_url

    def info(self) -> Dict[str, Any]:
        """Where this replica runs and serves: ``node_id``, ``base_url`` and ``pid`` (the actor's)."""
        return {"node_id": self.node_id, "base_url": self.base_url, "pid": os.getpid()}

    def stop(self) -> None:
        """Stop the server (and this process's sandbox wardens)."""
        if self._provider is not None:
            from openenv.core.containers.runtime.sandbox import shutdown_sandboxes

            self._provider.stop()
            shutdown_sandboxes()
            self._provider = None
        if self._server is not None:
            self._server.stop()
            self._server = None
