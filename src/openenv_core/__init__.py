"""``openenv_core``: the old import name of :mod:`openenv.core`, kept as OpenEnv 0.10 keeps it.

Importing it warns (``DeprecationWarning``: import from ``openenv.core``); its attributes are
``openenv.core``'s, and ``openenv_core.<sub>`` is ``openenv.core.<sub>`` itself (the same module
objects), for the submodules code written against the old name imports.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, List

warnings.warn(
    "openenv_core is the old name of openenv.core and will go: import from openenv.core instead",
    DeprecationWarning,
    stacklevel=2,
)

_core = importlib.import_module("openenv.core")
_SUBMODULES = ("client_types", "containers", "env_client", "env_server", "rubrics", "tools", "utils")

for _name in _SUBMODULES:
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"openenv.core.{_name}")

__all__: List[str] = list(getattr(_core, "__all__", ()))


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return sys.modules[f"{__name__}.{name}"]
    return getattr(_core, name)


def __dir__() -> List[str]:
    return sorted({*__all__, *_SUBMODULES, *globals()})
