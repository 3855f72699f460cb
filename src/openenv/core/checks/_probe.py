"""The import probe of a package check: its app and its client, imported in a child process
(``python -m openenv.core.checks._probe probe DIR APP``) so that a broken package cannot hurt the
caller; the child prints what it found as one line of JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from ._common import format_error

_PROBE_MARK = "OPENENV-VALIDATE-PROBE:"


def run_probe(directory: Path, app: Optional[str], timeout_s: float) -> Dict[str, Any]:
    """Import the app and the client in a child process; what it found, or ``{"error": why}``."""
    argv = [sys.executable, "-m", __name__, "probe", str(directory), app or ""]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run(
            argv, cwd=directory, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return {
            "error": f"importing took longer than {timeout_s:g} s (raise --timeout, or timeout_s, if it is just slow)"
        }
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(_PROBE_MARK):
            return json.loads(line[len(_PROBE_MARK) :])
    tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
    return {"error": f"the import process exited with code {done.returncode}:\n{tail}"}


def _probe(directory: str, app_path: str) -> Dict[str, Any]:
    import contextlib

    found: Dict[str, Any] = {}
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the result
        if app_path:
            try:
                from openenv.core.containers.runtime._serve import _import_app

                found["app"] = _describe_app(_import_app(app_path, directory))
            except BaseException as exc:
                found["app_error"] = format_error(exc)
        if os.path.isfile(os.path.join(directory, "client.py")):
            try:
                found["client_classes"] = _client_classes(directory)
            except BaseException as exc:
                found["client_error"] = format_error(exc)
    return found


def _describe_app(app: Any) -> Dict[str, Any]:
    from openenv.core.env_server.http_server import HTTPEnvServer

    described: Dict[str, Any] = {"type": f"{type(app).__module__}.{type(app).__qualname__}", "asgi": callable(app)}
    server = getattr(getattr(app, "state", None), "openenv_server", None)
    if isinstance(server, HTTPEnvServer):
        described["server"] = _describe_server(server)
    return described


def _describe_server(server: Any) -> Dict[str, Any]:
    from openenv.core.env_server.sessions import env_traits
    from openenv.core.env_server.types import Action, Observation, State

    def model(cls: Any, base: type) -> Dict[str, Any]:
        ok = isinstance(cls, type) and issubclass(cls, base)
        return {"name": getattr(cls, "__name__", repr(cls)), "base": base.__name__, "ok": ok}

    models = {"action": model(server.action_cls, Action), "observation": model(server.observation_cls, Observation)}
    if server.reset_observation_cls is not server.observation_cls:
        models["reset observation"] = model(server.reset_observation_cls, Observation)
    models["state"] = model(server.state_cls, State)
    cls = server.manager.env_cls
    traits = env_traits(cls) if cls is not None else None
    accepts_seed = None if traits is None else traits.reset_kwargs is None or "seed" in traits.reset_kwargs
    return {
        "env_name": server.env_name,
        "env_class": cls.__name__ if cls is not None else None,
        "max_concurrent_envs": server.max_concurrent_envs,
        "reset_accepts_seed": accepts_seed,
        "mcp": traits.mcp if traits is not None else None,
        "models": models,
    }


def _client_classes(directory: str) -> List[str]:
    """EnvClient subclasses defined in ``client.py``, imported as a submodule of the package (so
    its relative imports work) or, without ``__init__.py``, as a top-level module."""
    import importlib
    import importlib.util

    from openenv.core.env_client import EnvClient

    root = Path(directory)
    if (root / "__init__.py").is_file():
        package = root.name if root.name.isidentifier() else "_openenv_validated_package"
        spec = importlib.util.spec_from_file_location(
            package, root / "__init__.py", submodule_search_locations=[str(root)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        spec.loader.exec_module(module)
        client = importlib.import_module(f"{package}.client")
    else:
        client = importlib.import_module("client")
    found = []
    for value in vars(client).values():
        if isinstance(value, type) and issubclass(value, EnvClient) and value.__module__ == client.__name__:
            bases = ", ".join(b.__name__ for b in value.__bases__)
            found.append(f"{value.__name__} ({bases})")
    return found


def _probe_main(argv: List[str]) -> None:
    """``python -m openenv.core.checks._probe probe DIR APP``: print what importing found."""
    if len(argv) != 3 or argv[0] != "probe":
        sys.exit("usage: python -m openenv.core.checks._probe probe PACKAGE_DIR APP")
    result = _probe(argv[1], argv[2])
    sys.stdout.write(_PROBE_MARK + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _probe_main(sys.argv[1:])
