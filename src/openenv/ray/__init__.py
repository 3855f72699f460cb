"""Environment servers on a Ray cluster (extra ``openenv[ray]``): :class:`RayEnvPool`.

``import openenv.ray`` imports Ray only when a pool is made.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "RayEnvPool": ".pool",
    "Replica": ".pool",
    "NoHealthyReplicaError": ".pool",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
