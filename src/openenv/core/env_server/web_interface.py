"""OpenEnv 0.10's ``openenv.core.env_server.web_interface``: the names environment packages import
to build their web UI, here mapped onto this project's playground (:mod:`.web`).

* :func:`create_web_interface_app` — the app with the playground at ``/web/`` (``create_app(...,
  web=True)``, same signature); a ``gradio_builder`` is mounted beside it at ``/web/custom/``
  when Gradio is installed (:mod:`.web.custom`).
* :class:`WebInterfaceManager`, :class:`EpisodeState`, :class:`ActionLog` — one environment shared
  by a Gradio UI's visitors, as a builder receives it (:mod:`.web.shared`).
* :func:`load_environment_metadata`, :func:`get_quick_start_markdown`,
  :func:`get_gradio_display_title`, ``_extract_action_fields``, ``_is_chat_env`` — what a builder
  is told about the environment (:mod:`.web.describe`).
* ``build_gradio_app`` (:mod:`.gradio_ui`), ``OPENENV_GRADIO_THEME`` and ``OPENENV_GRADIO_CSS``
  (:mod:`.gradio_theme`) need Gradio and are imported on first use: without ``openenv[gradio]``
  asking for them raises an ``ImportError`` that says how to install it, and nothing else here
  needs Gradio.

Upstream's ``/ws/ui`` socket is not served, and its ``/web/reset``, ``/web/step`` and
``/web/state`` play a session per visitor here instead of one shared environment (see
docs/web.md).
"""

from __future__ import annotations

import importlib
from typing import Any

from .http_server import create_web_interface_app
from .web.describe import (
    _extract_action_fields,
    _is_chat_env,
    get_gradio_display_title,
    get_quick_start_markdown,
    load_environment_metadata,
)
from .web.shared import ActionLog, EpisodeState, WebInterfaceManager

_NEEDS_GRADIO = {
    "build_gradio_app": ".gradio_ui",
    "OPENENV_GRADIO_THEME": ".gradio_theme",
    "OPENENV_GRADIO_CSS": ".gradio_theme",
}


def __getattr__(name: str) -> Any:
    # Gradio's names only when asked for: importing this module must not need (or load) Gradio.
    module_name = _NEEDS_GRADIO.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name, __package__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_NEEDS_GRADIO))


__all__ = [
    "_extract_action_fields",
    "_is_chat_env",
    "ActionLog",
    "EpisodeState",
    "WebInterfaceManager",
    "create_web_interface_app",
    "get_gradio_display_title",
    "get_quick_start_markdown",
    "load_environment_metadata",
]
