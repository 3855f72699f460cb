"""An environment package's own Gradio UI (``create_app(..., gradio_builder=...)``), beside the
playground: served at ``/web/custom/``, linked from the playground's page.

The builder is called as OpenEnv 0.10 calls it, ``gradio_builder(web_manager, action_fields,
metadata, is_chat_env, title, quick_start_md)``, and must return ``gr.Blocks`` (else
``TypeError``); the Blocks are mounted with Gradio's public ``gr.mount_gradio_app`` under the
OpenEnv theme, as a route of the server's own app, so the server's token, origin and size checks
stand in front of it like any route; its answers forbid framing, as the playground's do. ``web_manager`` is a
:class:`~.shared.WebInterfaceManager`: one environment, built now, shared by every visitor of the
UI, closed when the app shuts down.

Gradio is optional (``pip install 'openenv[gradio]'``) and imported only here, only when a builder
is given and the web page is on. Without it the page is served alone and one log line says how to
get the custom UI.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from typing import Any, AsyncIterator, Callable, Dict, Optional, Type

from starlette.routing import Mount

from ..types import Action, Observation
from .describe import (
    _extract_action_fields,
    _is_chat_env,
    get_gradio_display_title,
    get_quick_start_markdown,
    load_environment_metadata,
)
from .shared import WebInterfaceManager

logger = logging.getLogger("openenv.server")

CUSTOM_PATH = "/web/custom"
"""Where an environment's own Gradio UI is mounted (its page: ``/web/custom/``)."""

MISSING_GRADIO = (
    "the environment's custom Gradio UI (gradio_builder) is not served: Gradio is not installed; "
    "pip install 'openenv[gradio]' to get it at /web/custom/"
)


def _mount_options(mount: Callable[..., Any], **wanted: Any) -> Dict[str, Any]:
    """The keywords of ``wanted`` this Gradio's ``mount_gradio_app`` takes (``theme`` and ``css``
    moved there in Gradio 6; ``ssr_mode`` and ``mcp_server`` came in 5)."""
    accepted = inspect.signature(mount).parameters
    return {name: value for name, value in wanted.items() if name in accepted}


def mount_custom_ui(
    app: Any,
    playground: Any,
    gradio_builder: Callable[..., Any],
    env: Any,
    action_cls: Type[Action],
    observation_cls: Type[Observation],
    *,
    env_name: Optional[str] = None,
    custom_tab_name: str = "Custom",
    custom_tab_primary: bool = False,
    show_default_tab: bool = True,
    title_override: Optional[str] = None,
    show_errors: bool = False,
) -> Optional[WebInterfaceManager]:
    """Build the package's UI with ``gradio_builder`` and mount it at :data:`CUSTOM_PATH` of ``app``;
    returns its manager (also ``app.state.openenv_web_manager``), or None (and logs
    :data:`MISSING_GRADIO`) when Gradio is not installed.

    ``playground`` (the page's :class:`~..web.Playground`) links to it as ``custom_tab_name``;
    with ``custom_tab_primary`` or ``show_default_tab=False``, ``/`` and ``/web`` lead there
    instead of the playground (which stays at ``/web/``). ``show_errors``: Gradio shows an
    unexpected exception's text to the visitor (the server's ``error_details=True``); otherwise
    only a builder's ``gr.Error`` messages are shown."""
    try:
        import gradio as gr
    except ImportError:
        logger.warning(MISSING_GRADIO)
        return None
    from ..gradio_theme import OPENENV_GRADIO_CSS, OPENENV_GRADIO_THEME

    # Gradio reports usage to its makers unless told not to; a server sends nothing unasked.
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    metadata = load_environment_metadata(env, env_name)
    manager = WebInterfaceManager(env, action_cls, observation_cls, metadata)
    title = title_override or get_gradio_display_title(metadata)
    try:
        blocks = gradio_builder(
            manager,
            _extract_action_fields(action_cls),
            metadata,
            _is_chat_env(action_cls),
            title,
            get_quick_start_markdown(metadata, action_cls, observation_cls),
        )
        if not isinstance(blocks, gr.Blocks):
            raise TypeError(
                f"gradio_builder must return a gradio.Blocks, not {type(blocks).__name__}: "
                "build the UI in `with gr.Blocks() as ui:` and return ui"
            )
    except BaseException:
        manager._discard()  # no app will close it
        raise
    blocks.title = title
    options = _mount_options(
        gr.mount_gradio_app,
        theme=OPENENV_GRADIO_THEME,
        css=OPENENV_GRADIO_CSS,
        show_error=show_errors,
        ssr_mode=False,  # no Node.js server beside ours
        mcp_server=False,  # the environment's tools are served by /mcp, behind the server's checks
    )
    gr.mount_gradio_app(app, blocks, path=CUSTOM_PATH, **options)
    for route in app.router.routes:
        if isinstance(route, Mount) and route.path == CUSTOM_PATH:
            route.app = NotFramed(route.app)  # as Starlette's own Mount(middleware=...) wraps it
    _close_with_app(app, manager)
    app.state.openenv_web_manager = manager
    playground.custom = {
        "name": custom_tab_name,
        "path": CUSTOM_PATH.removeprefix("/web/") + "/",
        "primary": custom_tab_primary or not show_default_tab,
    }
    return manager


class NotFramed:
    """ASGI wrapper: every HTTP answer of the wrapped app says no page may frame it (as the
    playground's own page says), so another site cannot show the UI in a frame and lure clicks."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_unframed(message: Dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"x-frame-options"]
                headers += [(b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_unframed)


def _close_with_app(app: Any, manager: WebInterfaceManager) -> None:
    """Close ``manager``'s environment when ``app`` shuts down."""
    previous = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        async with previous(application) as state:
            try:
                yield state
            finally:
                await manager.close()

    app.router.lifespan_context = lifespan


__all__ = ["CUSTOM_PATH", "MISSING_GRADIO", "mount_custom_ui"]
