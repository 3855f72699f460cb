"""``LocalProcessProvider``: an environment server as a plain subprocess on a TCP port.

No isolation at all (the log says so): for developing an environment, and for tests that need to
show what a sandbox prevents. The server still dies with the process that started it.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Dict, Optional

from .sandbox import SandboxProvider


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalProcessProvider(SandboxProvider):
    """Serve an environment package as a plain subprocess on ``http://127.0.0.1:<port>``."""

    def __init__(
        self,
        project_path: str,
        app: Optional[str] = None,
        python: Optional[str] = None,
        host: str = "127.0.0.1",
        port: Optional[int] = None,
        env_vars: Optional[Dict[str, str]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(project_path, app=app, python=python, env_vars=env_vars, isolation="none", **kwargs)
        self.host = host
        self.port = port

    def start(self, port: Optional[int] = None, env_vars: Optional[Dict[str, str]] = None, **kwargs: Any) -> str:
        """Start the server on ``port`` (a free one by default); returns ``http://host:port``."""
        self._port = port or self.port or _free_port(self.host)
        return super().start(env_vars=env_vars, **kwargs)

    def _plain_address(self, directory: Path) -> Optional[Dict[str, Any]]:
        self._base_url = f"http://{self.host}:{self._port}"
        return {"port": self._port, "host": self.host}

    def _accepting(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex((self.host, self._port)) == 0
