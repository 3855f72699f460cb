"""A Gradio playground for one environment: OpenEnv 0.10's ``build_gradio_app`` (and
``get_gradio_display_title``), for packages that compose Gradio UIs themselves.

``build_gradio_app`` takes what a ``gradio_builder`` is given (see :mod:`.web.custom`) and returns
``gr.Blocks``: Reset, a form of the action's fields, Step, the observation, reward and state, the
quick-start snippet and the README. It plays ``web_manager``'s one shared environment
(:class:`~.web.shared.WebInterfaceManager`). A package's own builder may return it as it is, or put
it in a ``gr.Tabs`` beside its own tab. This project's web page (:mod:`.web`) does not use it.

Needs Gradio (``pip install 'openenv[gradio]'``): importing this module without it raises an
``ImportError`` that says so.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Optional, Tuple

try:
    import gradio as gr
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        "openenv.core.env_server.gradio_ui needs Gradio, which is not installed: pip install 'openenv[gradio]'"
    ) from exc
import pydantic

from . import error_details
from .types import EnvironmentMetadata
from .web.describe import _resolved, get_gradio_display_title

logger = logging.getLogger("openenv.server")


def _string_fields(web_manager: Any) -> set:
    """Names of the action's string fields (their text is sent as typed; other text fields are
    read as JSON where they parse)."""
    action_cls = getattr(web_manager, "action_cls", None)
    try:
        schema = action_cls.model_json_schema()  # type: ignore[union-attr]
    except AttributeError:
        return set()
    return {
        name for name, raw in schema.get("properties", {}).items() if _resolved(raw, schema).get("type") == "string"
    }


def _input(field: Dict[str, Any]) -> Any:
    label = field["name"] + (" *" if field.get("required") else "")
    info = field.get("help_text") or None
    where = {"label": label, "info": info, "elem_id": f"openenv-field-{field['name']}"}
    default = field.get("default_value")
    kind = field.get("type")
    if kind == "checkbox":
        return gr.Checkbox(value=bool(default), **where)
    if kind == "select":
        return gr.Dropdown(choices=list(field.get("choices") or []), value=default, **where)
    if kind == "number":
        return gr.Number(value=default, minimum=field.get("min_value"), maximum=field.get("max_value"), **where)
    lines = 4 if kind == "textarea" else 1
    placeholder = "comma-separated integers" if kind == "tensor" else field.get("placeholder")
    shown = default if isinstance(default, str) else (None if default is None else json.dumps(default))
    return gr.Textbox(value=shown, lines=lines, placeholder=placeholder, **where)


def _action(fields: List[Dict[str, Any]], strings: set, values: Tuple[Any, ...]) -> Dict[str, Any]:
    """The action dict the form's ``values`` describe (an empty optional field left out)."""
    action: Dict[str, Any] = {}
    for field, value in zip(fields, values, strict=True):
        name = field["name"]
        if value is None or (value == "" and not (field.get("required") and name in strings)):
            continue
        if field.get("type") == "tensor" and isinstance(value, str):
            value = [int(part) for part in value.replace("[", "").replace("]", "").split(",") if part.strip()]
        elif isinstance(value, str) and name not in strings:
            try:
                value = json.loads(value)
            except ValueError:
                pass  # sent as typed: the action's validation says what is wrong
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        action[name] = value
    return action


def _failure(exc: Exception) -> str:
    if isinstance(exc, pydantic.ValidationError):
        return "Invalid action: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'action'}: {e['msg']}" for e in exc.errors()
        )
    return error_details.describe(exc, logger, "the Gradio playground's call failed")


def _status(payload: Dict[str, Any]) -> str:
    reward = payload.get("reward")
    return f"reward **{'none' if reward is None else reward}** · {'done' if payload.get('done') else 'running'}"


def build_gradio_app(
    web_manager: Any,
    action_fields: List[Dict[str, Any]],
    metadata: Optional[EnvironmentMetadata],
    is_chat_env: bool,
    title: str,
    quick_start_md: Optional[str],
) -> gr.Blocks:
    """A Gradio playground of ``web_manager``'s environment (see the module docstring), titled
    ``title``: the arguments a ``gradio_builder`` receives, in the same order. ``is_chat_env``
    changes nothing here (a chat action's ``tokens`` are typed as comma-separated integers)."""
    del is_chat_env
    strings = _string_fields(web_manager)
    with gr.Blocks(title=title) as blocks:
        gr.Markdown(f"# {title}", elem_classes=["openenv-header"])
        if metadata is not None and metadata.description:
            gr.Markdown(metadata.description, elem_classes=["openenv-muted"])
        with gr.Row():
            with gr.Column():
                reset_button = gr.Button("Reset", variant="primary", elem_id="openenv-reset")
                inputs = [_input(field) for field in action_fields]
                step_button = gr.Button("Step", elem_id="openenv-step")
                if quick_start_md:
                    with gr.Accordion("Quick start", open=False):
                        gr.Markdown(quick_start_md)
            with gr.Column():
                status = gr.Markdown(
                    "Reset to start an episode.", elem_id="openenv-status", elem_classes=["openenv-status"]
                )
                observation = gr.JSON(label="Observation", elem_id="openenv-observation")
                state = gr.JSON(label="State", elem_id="openenv-state")
        if metadata is not None and metadata.readme_content:
            with gr.Accordion("README", open=False):
                gr.Markdown(metadata.readme_content)

        async def reset() -> Tuple[str, Any, Any]:
            try:
                payload = await web_manager.reset_environment()
                return _status(payload), payload["observation"], web_manager.get_state()
            except Exception as exc:
                raise gr.Error(_failure(exc)) from None

        async def step(*values: Any) -> Tuple[str, Any, Any]:
            try:
                payload = await web_manager.step_environment(_action(action_fields, strings, values))
                return _status(payload), payload["observation"], web_manager.get_state()
            except Exception as exc:
                raise gr.Error(_failure(exc)) from None

        reset_button.click(reset, inputs=None, outputs=[status, observation, state])
        step_button.click(step, inputs=inputs, outputs=[status, observation, state])
    return blocks


__all__ = ["build_gradio_app", "get_gradio_display_title"]
