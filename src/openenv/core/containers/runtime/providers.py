"""The two provider interfaces (OpenEnv 0.10).

A :class:`ContainerProvider` starts a server from an image (Docker and the like); a
:class:`RuntimeProvider` starts one from an environment package on this machine (the sandbox, a
plain process). Either hands the client a base URL and nothing else, so the client works the same
whichever runs the server.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict, Optional


class ContainerProvider(ABC):
    """Starts environment servers from container images."""

    @abstractmethod
    def start_container(
        self, image: str, port: Optional[int] = None, env_vars: Optional[Dict[str, str]] = None, **kwargs: Any
    ) -> str:
        """Start a container running ``image`` and return the server's base URL."""

    @abstractmethod
    def stop_container(self) -> None:
        """Stop (and remove) the container this provider started."""

    @abstractmethod
    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Return once ``GET /health`` answers; raise ``TimeoutError`` after ``timeout_s``."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release SDK clients and the like."""

    def __enter__(self) -> ContainerProvider:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RuntimeProvider(ABC):
    """Starts an environment server from a package on this machine."""

    @abstractmethod
    def start(self, port: Optional[int] = None, env_vars: Optional[Dict[str, str]] = None, **kwargs: Any) -> str:
        """Start the server and return its base URL."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the server and remove everything it left."""

    @abstractmethod
    def wait_for_ready(self, timeout_s: float = 30.0) -> None:
        """Return once the server answers; raise ``TimeoutError`` after ``timeout_s``."""

    def __enter__(self) -> RuntimeProvider:
        self.start()
        self.wait_for_ready()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
