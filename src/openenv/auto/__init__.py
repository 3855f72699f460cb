"""``AutoEnv`` / ``AutoAction``: clients and action classes of installed environments, by name.

env = AutoEnv.from_env("echo")          # the echo_env client, its server in a sandbox
with env.sync() as client: ...
Action = AutoAction.from_env("echo")     # its action class
env = AutoEnv.from_env("org/name")      # a Hugging Face Space: see openenv.auto.hub
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from ..core.discovery import EnvInfo, discover_environments, normalize, resolve_environment

__all__ = ["AutoAction", "AutoEnv", "EnvInfo", "discover_environments", "resolve_environment"]


def _info(name: str) -> EnvInfo:
    path = Path(name).expanduser()
    if path.is_dir():
        from ..core.manifest import EnvManifest

        manifest = EnvManifest.load(path)
        for info in discover_environments().values():
            if info.path == manifest.path:
                return info
        raise ValueError(f"{path} is an environment package but is not installed: pip install -e {path}")
    from . import hub

    if hub.is_hub_id(name):  # a Space whose package is installed here under the Space's name
        found = discover_environments().get(normalize(hub.repo_id_of(name).split("/")[1]))
        if found is not None:
            return found
    return resolve_environment(name)


class AutoEnv:
    """Client factory for installed environment packages (see the module docstring)."""

    def __init__(self) -> None:
        raise TypeError("AutoEnv is not instantiated: use AutoEnv.from_env(name)")

    @classmethod
    def from_env(
        cls,
        name: str,
        base_url: Optional[str] = None,
        docker_image: Optional[str] = None,
        container_provider: Any = None,
        wait_timeout: float = 30.0,
        env_vars: Optional[Dict[str, str]] = None,
        trust_remote_code: bool = False,
        skip_install: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The environment's client. With ``base_url`` it talks to that server; otherwise its
        server starts in a sandbox when the client connects and stops when it closes
        (``docker_image`` / ``container_provider`` run it with Docker instead).

        ``name`` is an installed package's name or its directory, or a Hugging Face Space id
        (``"org/name"``, see :mod:`openenv.auto.hub`): a running Space is used as it is; else its
        package is fetched and served in the sandbox, only with ``trust_remote_code=True`` or
        ``OPENENV_TRUST_REMOTE_CODE=1`` (a :class:`~openenv.auto.hub.RemoteCodeNotTrusted`
        error says so otherwise). Nothing is pip-installed.

        ``skip_install=True`` returns a :class:`~openenv.core.generic_client.GenericEnvClient`
        (dicts in, dicts out) and uses no package code, as upstream's: for ``base_url``, for a
        Space, or for a local environment's ``docker_image`` (its container starts when the
        client connects). A local environment with neither is a ``ValueError``: without its
        package there is nothing to run.
        """
        from . import hub

        if skip_install and base_url:
            from ..core.generic_client import GenericEnvClient

            return GenericEnvClient(base_url=base_url, **kwargs)
        if env_vars:
            kwargs["env_vars"] = env_vars
        if skip_install and not hub.is_hub_id(name):
            from ..core.generic_client import GenericEnvClient

            if docker_image is None:
                raise ValueError(
                    f"Cannot use skip_install=True for local environment '{name}' without providing "
                    "base_url or docker_image: pass base_url= (a running server) or docker_image= (an "
                    "image of it to start), or drop skip_install to use its installed package"
                )
            return GenericEnvClient.from_docker_image(docker_image, provider=container_provider, **kwargs)
        if hub.is_hub_id(name) and base_url is None:
            if docker_image is not None or container_provider is not None:
                if skip_install:
                    from ..core.generic_client import GenericEnvClient

                    client_cls: Any = GenericEnvClient
                else:
                    client_cls = hub.client_class(hub.repo_id_of(name).split("/")[1], None)
                if docker_image is not None:
                    return client_cls.from_docker_image(docker_image, provider=container_provider, **kwargs)
                return client_cls.from_env(name, provider=container_provider, use_docker=True, **kwargs)
            kwargs.setdefault("start_timeout_s", wait_timeout)
            return hub.load(name, trust_remote_code=trust_remote_code, skip_install=skip_install, **kwargs)
        client_cls = _info(name).client_class()
        if base_url is not None:
            kwargs.pop("env_vars", None)
            return client_cls(base_url=base_url, **kwargs)
        if docker_image is not None or container_provider is not None:
            image = docker_image or f"{normalize(name).replace('_', '-')}-env:latest"
            return client_cls.from_docker_image(image, provider=container_provider, **kwargs)
        kwargs.setdefault("start_timeout_s", wait_timeout)
        return client_cls.from_env(str(_info(name).path), **kwargs)

    from_hub = from_env

    @classmethod
    def get_env_class(cls, name: str) -> type:
        return _info(name).client_class()

    @classmethod
    def get_env_info(cls, name: str) -> Dict[str, Any]:
        info = _info(name)
        return {
            "name": info.env_name,
            "key": info.key,
            "module": info.module,
            "distribution": info.distribution,
            "version": info.version,
            "path": str(info.path),
            "client_class": info.client_class_name,
            "action_class": info.action_class_name,
            "observation_class": info.observation_class_name,
            "description": info.manifest.description,
        }

    @classmethod
    def list_environments(cls) -> Dict[str, Dict[str, Any]]:
        return {key: cls.get_env_info(key) for key in sorted(discover_environments())}


class AutoAction:
    """Action classes of installed environment packages."""

    def __init__(self) -> None:
        raise TypeError("AutoAction is not instantiated: use AutoAction.from_env(name)")

    @classmethod
    def from_env(cls, name: str, skip_install: bool = False) -> type:
        """The environment's action class (``GenericAction`` with ``skip_install``)."""
        if skip_install:
            from ..core.generic_client import GenericAction

            return GenericAction
        return _info(name).action_class()

    from_hub = from_env

    @classmethod
    def get_action_info(cls, name: str) -> Dict[str, Any]:
        info = _info(name)
        action = info.action_class()
        return {"name": action.__name__, "module": action.__module__, "schema": action.model_json_schema()}

    @classmethod
    def list_actions(cls) -> Dict[str, str]:
        return {key: info.action_class_name for key, info in sorted(discover_environments().items())}
