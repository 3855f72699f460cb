"""Finding installed environment packages: :mod:`openenv.core.discovery`, under the path
``openenv.auto`` has always offered it (``EnvClient.from_env`` finds packages by name too, and
the core never imports ``openenv.auto``)."""

from __future__ import annotations

from ..core.discovery import ENTRY_POINT_GROUP, EnvInfo, discover_environments, normalize, resolve_environment

__all__ = ["ENTRY_POINT_GROUP", "EnvInfo", "discover_environments", "normalize", "resolve_environment"]
