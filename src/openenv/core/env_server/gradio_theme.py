"""OpenEnv's look for Gradio UIs: ``OPENENV_GRADIO_THEME`` and ``OPENENV_GRADIO_CSS`` (OpenEnv 0.10's
module and names). A custom UI mounted by ``create_app(..., gradio_builder=...)`` is served with
both (:mod:`.web.custom`); packages that mount Gradio themselves import them from here.

Needs Gradio (``pip install 'openenv[gradio]'``): importing this module without it raises an
``ImportError`` that says so. The theme names only local font families, so a page served offline
loads no font from elsewhere.
"""

from __future__ import annotations

try:
    import gradio as gr
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        "openenv.core.env_server.gradio_theme needs Gradio, which is not installed: pip install 'openenv[gradio]'"
    ) from exc

OPENENV_GRADIO_THEME = gr.themes.Base(
    primary_hue="indigo",
    secondary_hue="slate",
    neutral_hue="slate",
    radius_size="sm",
    font=["system-ui", "-apple-system", "Segoe UI", "sans-serif"],
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"],
)
"""A plain theme in the playground's colours (indigo on slate), with system fonts."""

OPENENV_GRADIO_CSS = """
.openenv-header h1 { margin-bottom: 0.2em; }
.openenv-muted { opacity: 0.75; font-size: 0.9em; }
.openenv-status { font-variant-numeric: tabular-nums; }
"""
"""Small additions to the theme for the class names :mod:`.gradio_ui` uses (``openenv-*``)."""

__all__ = ["OPENENV_GRADIO_CSS", "OPENENV_GRADIO_THEME"]
