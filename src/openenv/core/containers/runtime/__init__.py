"""Providers that start environment servers: in a sandbox (default), several sandboxed processes
behind one URL (``SandboxPool``), a plain process, Docker; and ``PackageServer``, which serves a
package at a TCP address until stopped (``openenv serve``).

``import openenv.core.containers.runtime`` is cheap: each provider is imported on first use.
"""

from __future__ import annotations

from ...._lazy import lazy_exports

_EXPORTS = {
    "ContainerProvider": ".providers",
    "RuntimeProvider": ".providers",
    "SandboxProvider": ".sandbox",
    "SandboxPool": ".pool",
    "PackageServer": ".package_server",
    "shutdown_sandboxes": ".sandbox",
    "LocalProcessProvider": ".process",
    "LocalDockerProvider": ".docker",
    "dockerfile_template": ".docker",
    "Limits": ".isolation",
    "IsolationError": ".isolation",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
