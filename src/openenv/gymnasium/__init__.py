"""Gymnasium, both ways (extra ``openenv[gymnasium]``).

* Serving: :class:`GymnasiumEnvironment` serves registered Gymnasium environments over
  OpenEnv (``env_id`` and ``gymnasium.make`` keywords chosen at reset, among those the server
  allows); :class:`GymnasiumClient` is its typed client.
* Training: :func:`to_gymnasium` turns a client into a ``gymnasium.Env``;
  :func:`make_vector_env` gives a ``gymnasium.vector.VectorEnv`` over several sessions.
"""

from __future__ import annotations

try:
    import gymnasium  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("openenv.gymnasium needs Gymnasium: pip install 'openenv[gymnasium]'") from exc

from .adapter import RemoteEnv, to_gymnasium
from .client import GymnasiumClient
from .environment import CLASSIC_CONTROL, GymnasiumEnvironment
from .models import GymnasiumAction, GymnasiumObservation, GymnasiumState
from .vector import RemoteVectorEnv, make_vector_env

__all__ = [
    "CLASSIC_CONTROL",
    "GymnasiumAction",
    "GymnasiumClient",
    "GymnasiumEnvironment",
    "GymnasiumObservation",
    "GymnasiumState",
    "RemoteEnv",
    "RemoteVectorEnv",
    "make_vector_env",
    "to_gymnasium",
]
