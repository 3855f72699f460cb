"""OpenEnv: isolated execution environments for agentic reinforcement learning.

Wire- and API-compatible with OpenEnv 0.10. Start with :mod:`openenv.core`.
"""

from __future__ import annotations

from ._lazy import lazy_exports


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("openenv", "openenv-core"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "0.0.0"


_EXPORTS = {
    "GenericEnvClient": ".core.generic_client",
    "GenericAction": ".core.generic_client",
    "SyncEnvClient": ".core.sync_client",
    "EnvClient": ".core.env_client",
    "AutoEnv": ".auto",
    "AutoAction": ".auto",
}
_get, __dir__ = lazy_exports(__name__, _EXPORTS)


def __getattr__(name: str):
    if name == "__version__":
        value = _version()
        globals()["__version__"] = value
        return value
    if name in ("core", "cli", "auto"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    return _get(name)


__all__ = ["core", "cli", "__version__", *sorted(_EXPORTS)]
