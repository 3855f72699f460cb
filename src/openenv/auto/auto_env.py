"""``openenv.auto.auto_env``: where upstream OpenEnv 0.10 keeps ``AutoEnv`` (the same class as
``openenv.AutoEnv``; see :mod:`openenv.auto`)."""

from . import AutoEnv

__all__ = ["AutoEnv"]
