"""An environment package's manifest, ``openenv.yaml``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Union

MANIFEST = "openenv.yaml"
DEFAULT_APP = "server.app:app"


class ManifestError(ValueError):
    """An environment package's ``openenv.yaml`` is missing or invalid."""


@dataclass(frozen=True)
class EnvManifest:
    """What ``openenv.yaml`` says about an environment package.

    ``app`` is the ASGI app to serve: a module inside the package directory (``server.app:app``)
    or one through the package's own name (``<pkg>.server.app:app``, ``envs.<pkg>.server.app:app``);
    :mod:`openenv.core.containers.runtime._app_import` says how each is imported.
    """

    path: Path
    name: str
    app: str = DEFAULT_APP
    version: Optional[str] = None
    description: Optional[str] = None
    spec_version: Optional[int] = None
    port: int = 8000
    action: Optional[str] = None
    observation: Optional[str] = None
    client: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def load(cls, package_dir: Union[str, Path]) -> EnvManifest:
        """Read ``<package_dir>/openenv.yaml``; raise :class:`ManifestError` saying what is wrong."""
        import yaml

        directory = Path(package_dir).resolve()
        path = directory / MANIFEST
        if not directory.is_dir():
            raise ManifestError(f"{directory} is not a directory")
        if not path.is_file():
            raise ManifestError(f"{directory} has no {MANIFEST}: it is not an environment package")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ManifestError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ManifestError(f"{path} must hold a mapping, not {type(data).__name__}")
        app = data.get("app") or DEFAULT_APP
        if not isinstance(app, str) or ":" not in app:
            raise ManifestError(f"{path}: 'app' must look like 'module.path:attribute', got {app!r}")
        name = data.get("name") or directory.name
        port = data.get("port", 8000)
        return cls(
            path=directory,
            name=str(name),
            app=app,
            version=None if data.get("version") is None else str(data["version"]),
            description=data.get("description"),
            spec_version=data.get("spec_version"),
            port=int(port) if isinstance(port, (int, str)) and str(port).isdigit() else 8000,
            action=data.get("action"),
            observation=data.get("observation"),
            client=data.get("client"),
            raw=data,
        )


def find_package_dir(start: Union[str, Path]) -> Path:
    """The environment package containing ``start`` (a directory with ``openenv.yaml``)."""
    path = Path(start).resolve()
    for candidate in (path, *path.parents):
        if (candidate / MANIFEST).is_file():
            return candidate
    raise ManifestError(f"no {MANIFEST} in {path} or its parents")
