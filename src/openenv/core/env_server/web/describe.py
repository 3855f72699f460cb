"""What OpenEnv 0.10's web interface tells a Gradio UI about an environment, in upstream's shapes.

A ``gradio_builder`` (see :mod:`.custom`) is called with the environment's metadata, its action's
form fields, whether it is a chat environment, a title and a quick-start snippet; environment
packages also call these functions themselves (through :mod:`..web_interface`). Nothing here
imports Gradio.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Type

from ..types import Action, EnvironmentMetadata, Observation

README_PLACES = ("envs/{env_name}/README.md", "/app/env/README.md", "/app/README.md")
"""Where :func:`load_environment_metadata` looks for a README after ``$ENV_README_PATH`` (the first
only with an ``env_name``, relative to the working directory; the others are a container's)."""

_CLIENT_BASES = frozenset({"EnvClient", "MCPToolClient", "MCPClientBase", "GenericEnvClient"})
_LONG_TEXT_NAMES = ("message", "code")


def _factory_target(env: Any) -> Any:
    """What a factory builds, as far as can be told without calling it (a ``partial`` unwrapped)."""
    while isinstance(env, functools.partial):
        env = env.func
    return env


def _first_readme(env_name: Optional[str]) -> Optional[str]:
    places = []
    if os.environ.get("ENV_README_PATH"):
        places.append(os.environ["ENV_README_PATH"])
    places += [p.format(env_name=env_name) for p in README_PLACES if env_name or "{env_name}" not in p]
    for place in places:
        try:
            return Path(place).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return None


def load_environment_metadata(env: Any, env_name: Optional[str] = None) -> EnvironmentMetadata:
    """The metadata a web UI shows for ``env`` (OpenEnv 0.10's contract).

    An environment *instance* answers for itself: its ``get_metadata()``, README and all (none is
    looked up). A *factory* (a class, a function, a ``functools.partial`` of either) is not called:
    the metadata is ``name = env_name`` or the factory's name, ``description = "<name> environment"``,
    ``version = "1.0.0"``, and ``readme_content`` the first readable of ``$ENV_README_PATH``,
    ``envs/<env_name>/README.md`` (relative to the working directory, only with ``env_name``),
    ``/app/env/README.md`` and ``/app/README.md`` (None when there is none).
    """
    from ..interfaces import Environment

    if isinstance(env, Environment):
        metadata = env.get_metadata()
        return metadata if isinstance(metadata, EnvironmentMetadata) else EnvironmentMetadata.model_validate(metadata)
    target = _factory_target(env)
    own_name = getattr(target, "__name__", None) or type(target).__name__
    return EnvironmentMetadata(
        name=env_name or own_name,
        description=f"{own_name} environment",
        version="1.0.0",
        readme_content=_first_readme(env_name),
    )


def get_gradio_display_title(metadata: Optional[EnvironmentMetadata], fallback: str = "OpenEnv Environment") -> str:
    """The title of a Gradio UI for the environment: ``"OpenEnv Agentic Environment: <name>"``
    (``fallback`` standing for the name when there is no metadata)."""
    name = metadata.name if metadata is not None else fallback
    return f"OpenEnv Agentic Environment: {name}"


# --- the action's form ---------------------------------------------------------------------------


def _resolved(schema: Dict[str, Any], root: Dict[str, Any]) -> Dict[str, Any]:
    """``schema`` with a ``$ref`` followed and ``Optional[X]`` read as ``X`` (its own keys kept)."""
    seen = 0
    while "$ref" in schema and seen < 32:
        target = (root.get("$defs") or root.get("definitions") or {}).get(schema["$ref"].rsplit("/", 1)[-1], {})
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        seen += 1
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        real = [_resolved(o, root) for o in options if o.get("type") != "null"]
        if len(real) == 1:
            return {**real[0], **{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}}
    return schema


def _input_type(name: str, schema: Dict[str, Any]) -> str:
    lowered = name.lower()
    if "tokens" in lowered:
        return "tensor"
    if "enum" in schema:
        return "select"
    kind = schema.get("type")
    if kind == "boolean":
        return "checkbox"
    if kind in ("integer", "number"):
        return "number"
    if kind == "string" and (schema.get("maxLength", 0) > 100 or any(word in lowered for word in _LONG_TEXT_NAMES)):
        return "textarea"
    return "text"


def _extract_action_fields(action_cls: Type[Action]) -> List[Dict[str, Any]]:
    """The fields of a form for ``action_cls``, one dict per property of its JSON schema but
    ``metadata``: ``name``, ``type`` (``tensor`` for a name containing "tokens", ``select`` for an
    enum, ``checkbox``, ``number``, ``textarea`` for a string longer than 100 characters or named
    after a message or code, else ``text``), ``required``, ``description``, ``default_value``,
    ``choices``, ``min_value``, ``max_value``, ``min_length``, ``max_length``, ``pattern``,
    ``placeholder`` and ``help_text`` (OpenEnv 0.10's keys; absent constraints are None)."""
    try:
        schema = action_cls.model_json_schema()
    except AttributeError:  # not a pydantic model: nothing to describe
        return []
    required = set(schema.get("required", []))
    fields = []
    for name, raw in schema.get("properties", {}).items():
        if name == "metadata":
            continue
        info = _resolved(raw, schema)
        description = info.get("description") or ""
        fields.append(
            {
                "name": name,
                "type": _input_type(name, info),
                "required": name in required,
                "description": description,
                "default_value": info.get("default", info.get("const")),
                "choices": info.get("enum") or ([info["const"]] if "const" in info else None),
                "min_value": info.get("minimum"),
                "max_value": info.get("maximum"),
                "min_length": info.get("minLength"),
                "max_length": info.get("maxLength"),
                "pattern": info.get("pattern"),
                "placeholder": name.replace("_", " "),
                "help_text": description,
            }
        )
    return fields


def _is_chat_env(action_cls: Type[Action]) -> bool:
    """Whether ``action_cls`` is a chat environment's action: a ``tokens`` field annotated with
    a tensor type (told by the annotation's name, so torch is not imported)."""
    field = getattr(action_cls, "model_fields", {}).get("tokens")
    return field is not None and "Tensor" in str(field.annotation)


# --- the quick start -----------------------------------------------------------------------------


def _package_files(module_name: str) -> List[Path]:
    """``client.py`` then ``__init__.py`` of the top-level package ``module_name`` is in (found
    without importing anything; none for ``__main__`` or a module outside a package)."""
    top = module_name.split(".", 1)[0]
    if not top or top == "__main__":
        return []
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    folders = [Path(p) for p in spec.submodule_search_locations]
    return [folder / name for name in ("client.py", "__init__.py") for folder in folders]


def _client_class(action_cls: Type[Action]) -> Optional[tuple]:
    """``(package, class name)`` of the client the environment's package defines, read from its
    source (parsed, never run)."""
    package = action_cls.__module__.split(".", 1)[0]
    for path in _package_files(action_cls.__module__):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if isinstance(base, ast.Subscript):  # EnvClient[Action, Observation, State]
                    inner = base.value
                    base_name = inner.attr if isinstance(inner, ast.Attribute) else getattr(inner, "id", "")
                if base_name in _CLIENT_BASES:
                    return package, node.name
    return None


def get_quick_start_markdown(
    metadata: Optional[EnvironmentMetadata], action_cls: Type[Action], observation_cls: Type[Observation]
) -> str:
    """Markdown that shows how to connect to this environment from Python: its package's client
    class (found by parsing the package's ``client.py`` or ``__init__.py``; ``GenericEnvClient``
    when there is none), the URL ``https://$SPACE_HOST`` on a Hugging Face Space (else
    ``http://localhost:8000``) and, with ``$SPACE_ID``, how to install the client from the Space."""
    del observation_cls  # (part of upstream's signature; the snippet does not need it)
    space_host = os.environ.get("SPACE_HOST")
    url = f"https://{space_host}" if space_host else "http://localhost:8000"
    found = _client_class(action_cls)
    if found is not None:
        package, client = found
        first_line = f"from {package} import {client}"
    else:
        client, first_line = "GenericEnvClient", "from openenv import GenericEnvClient"
    name = metadata.name if metadata is not None else "this environment"
    lines = [f"### Connect to {name}", ""]
    space_id = os.environ.get("SPACE_ID")
    if space_id:
        lines += [
            "Install its client:",
            "",
            "```bash",
            f"pip install git+https://huggingface.co/spaces/{space_id}",
            "```",
            "",
        ]
    lines += [
        "```python",
        first_line,
        "",
        f'with {client}(base_url="{url}").sync() as env:',
        "    result = env.reset()",
        "    print(result.observation)",
        "```",
    ]
    return "\n".join(lines)


__all__ = [
    "README_PLACES",
    "_extract_action_fields",
    "_is_chat_env",
    "get_gradio_display_title",
    "get_quick_start_markdown",
    "load_environment_metadata",
]
