"""OpenEnv's ``check_env``: checks of an environment against the contract a trainer relies on.

* :func:`check_env` drives an :class:`~openenv.core.env_server.interfaces.Environment` (an
  instance, or a class it builds) in this process, as the server would, with no server;
* :func:`check_package` checks an environment package directory, then serves it in a sandbox and
  checks the live server (``openenv validate PATH``);
* :func:`check_url` checks a running server through our own client (``openenv validate URL``).

Each raises :class:`EnvCheckError` naming every failed check and issues soft problems as
:class:`EnvCheckWarning`; with ``raise_on_failure=False`` each returns the :class:`CheckReport`
instead. Names are imported on first use.
"""

from __future__ import annotations

from ..._lazy import lazy_exports

_EXPORTS = {
    "check_env": ".environment",
    "check_package": ".package",
    "check_url": ".server",
    "Check": ".report",
    "CheckReport": ".report",
    "EnvCheckError": ".report",
    "EnvCheckWarning": ".report",
    "Status": ".report",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
