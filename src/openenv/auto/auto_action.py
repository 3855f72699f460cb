"""``openenv.auto.auto_action``: where upstream OpenEnv 0.10 keeps ``AutoAction`` (the same class
as ``openenv.AutoAction``; see :mod:`openenv.auto`)."""

from . import AutoAction

__all__ = ["AutoAction"]
