"""The Hub loader: environments published as Hugging Face Spaces, by id (``"org/name"``).

As upstream's: when the Space runs (its ``/health`` answers), the client talks to it. Otherwise
the Space's package is fetched from its git repository — only with ``trust_remote_code=True`` or
``OPENENV_TRUST_REMOTE_CODE=1`` — and served here. Unlike upstream, the package is never
pip-installed, built or imported in this process: its repository is cloned (no hooks, no
submodules) into a cache directory and its server runs in a
:class:`~openenv.core.containers.runtime.SandboxProvider` (see :mod:`openenv.core.spaces`, which
also says how the Hub, the Spaces' URLs and the cache are configured). The client is therefore one
of OpenEnv's own (:class:`~openenv.core.mcp_client.MCPToolClient` for an environment whose actions
are MCP tool calls, else :class:`~openenv.core.generic_client.GenericEnvClient`), unless a
package of that name is installed here already, whose typed client is used.
"""

from __future__ import annotations

from typing import Any, Optional

from ..core.spaces import (
    RemoteCodeNotTrusted,
    fetch_space,
    is_hub_id,
    missing_requirements,
    refuse_untrusted,
    repo_id_of,
    sandboxed_space,
    space_repository,
    space_url,
    trusted,
)

HEALTH_TIMEOUT_S = 5.0


def space_is_running(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """Whether ``<url>/health`` answers 200."""
    import httpx

    from ..core.utils import parse_endpoint

    try:
        loopback = parse_endpoint(url).is_loopback
        response = httpx.get(url + "/health", timeout=timeout_s, trust_env=not loopback)
    except (httpx.HTTPError, ValueError):
        return False
    return response.status_code == 200


def client_class(name: str, action: Optional[str]) -> type:
    """An installed package's typed client, else OpenEnv's own for the action type."""
    from ..core.discovery import discover_environments, normalize

    installed = discover_environments().get(normalize(name))
    if installed is not None:
        return installed.client_class()
    if action in ("CallToolAction", "ListToolsAction"):
        from ..core.mcp_client import MCPToolClient

        return MCPToolClient
    from ..core.generic_client import GenericEnvClient

    return GenericEnvClient


def _schema_action(url: str) -> Optional[str]:
    import httpx

    try:
        schema = httpx.get(url + "/schema", timeout=HEALTH_TIMEOUT_S, trust_env=False).json()
        return str(schema["action"].get("title"))
    except Exception:
        return None


def load(
    name: str,
    *,
    trust_remote_code: bool = False,
    skip_install: bool = False,
    isolation: str = "sandbox",
    **kwargs: Any,
) -> Any:
    """A client of the Space ``name`` (see the module docstring); ``kwargs`` go to the client (and,
    for a package served here, those it does not take to its SandboxProvider)."""
    from ..core.env_client import split_client_kwargs
    from ..core.generic_client import GenericEnvClient

    repo_id = repo_id_of(name)
    url = space_url(repo_id)
    client_kwargs, provider_kwargs = split_client_kwargs(GenericEnvClient, kwargs)
    if space_is_running(url):  # (the provider's options have nothing to start)
        client_cls = GenericEnvClient if skip_install else client_class(repo_id.split("/")[1], _schema_action(url))
        return client_cls(base_url=url, **client_kwargs)
    provider = sandboxed_space(repo_id, trust_remote_code=trust_remote_code, isolation=isolation, **provider_kwargs)
    client_cls = client_class(provider.name, _manifest_action(provider.project_dir))
    return client_cls(provider=provider, **client_kwargs)


def _manifest_action(project_dir: str) -> Optional[str]:
    from ..core.manifest import EnvManifest

    action = EnvManifest.load(project_dir).raw.get("action")
    return str(action) if action else None


__all__ = [
    "RemoteCodeNotTrusted",
    "fetch_space",
    "is_hub_id",
    "load",
    "missing_requirements",
    "refuse_untrusted",
    "sandboxed_space",
    "repo_id_of",
    "space_is_running",
    "space_repository",
    "space_url",
    "trusted",
]
