"""Lazy attribute exports, so that importing a package costs nothing until a name is used."""

from __future__ import annotations

import importlib
from typing import Any, Dict, List, Optional


def lazy_exports(package: str, exports: Dict[str, str], optional: Optional[Dict[str, str]] = None) -> tuple:
    """``__getattr__`` and ``__dir__`` for a module whose names live in submodules.

    ``exports`` maps a public name to the module (relative to ``package``) that defines it;
    ``optional`` names resolve to None when their module cannot be imported.
    """
    optional = optional or {}

    def __getattr__(name: str) -> Any:
        module_name = exports.get(name) or optional.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(module_name, package)
        except ImportError:
            if name in optional:
                return None
            raise
        value = getattr(module, name)
        importlib.import_module(package).__dict__[name] = value
        return value

    def __dir__() -> List[str]:
        return sorted(set(exports) | set(optional))

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
