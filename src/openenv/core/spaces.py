"""Hugging Face Space ids, and a Space's environment package fetched to be served here.

A Space is named ``"org/name"`` (or by its ``huggingface.co/spaces/...`` URL). When its package
must run on this machine, its git repository is cloned (no hooks, no submodules, symlinks as plain
files) into a cache directory and served in a
:class:`~openenv.core.containers.runtime.SandboxProvider`: never pip-installed, built or imported
in this process, and only with consent (``trust_remote_code=True`` or
``OPENENV_TRUST_REMOTE_CODE=1``). ``EnvClient.from_env`` and the Hub loader
(:mod:`openenv.auto.hub`) both start Spaces this way.

Configuration (environment variables):

* ``OPENENV_HUB_URL`` (``https://huggingface.co``): a Space's repository is ``<hub>/spaces/<id>``
  (a ``file://`` URL or a local directory work too);
* ``OPENENV_SPACE_URL_TEMPLATE`` (``https://{subdomain}.hf.space``): where a running Space
  answers; ``{subdomain}`` (``org-name``), ``{repo_id}``, ``{owner}`` and ``{name}`` are filled in;
* ``OPENENV_HUB_CACHE`` (``$XDG_CACHE_HOME/openenv/hub``): where repositories are cloned;
* ``OPENENV_TRUST_REMOTE_CODE`` (``1``, ``true`` or ``yes``): consent to run a Space's package.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, List

from .utils import hf_space_subdomain

DEFAULT_HUB_URL = "https://huggingface.co"
DEFAULT_SPACE_URL_TEMPLATE = "https://{subdomain}.hf.space"
CLONE_TIMEOUT_S = 300.0
FETCH_KEPT_S = 24 * 3600.0
"""Earlier fetches of a Space older than this are removed when it is fetched again."""
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_SPACES_PREFIX = re.compile(r"^(?:https?://)?(?:www\.)?huggingface\.co/spaces/")


class RemoteCodeNotTrusted(ValueError):
    """A Space's package would have to run here, and nobody said it may."""


def is_hub_id(name: str) -> bool:
    """Whether ``name`` names a Space (``org/name`` or its huggingface.co URL), not a local path."""
    if "huggingface.co/" in name:
        return True
    return bool(_REPO_ID.match(name)) and not Path(name).expanduser().exists()


def repo_id_of(name: str) -> str:
    """``org/name`` from a Space id or its URL; a ``ValueError`` for anything else."""
    repo_id = _SPACES_PREFIX.sub("", name).strip("/")
    if not _REPO_ID.match(repo_id) or ".." in repo_id:
        raise ValueError(f"{name!r} is not a Hugging Face Space id: expected 'owner/name'")
    return repo_id


def space_url(repo_id: str) -> str:
    """Where the running Space answers (``OPENENV_SPACE_URL_TEMPLATE``)."""
    owner, name = repo_id.split("/", 1)
    template = os.environ.get("OPENENV_SPACE_URL_TEMPLATE") or DEFAULT_SPACE_URL_TEMPLATE
    return template.format(subdomain=hf_space_subdomain(repo_id), repo_id=repo_id, owner=owner, name=name).rstrip("/")


def space_repository(repo_id: str) -> str:
    """The Space's git repository (``OPENENV_HUB_URL``/spaces/<id>)."""
    return f"{(os.environ.get('OPENENV_HUB_URL') or DEFAULT_HUB_URL).rstrip('/')}/spaces/{repo_id}"


def trusted(trust_remote_code: bool) -> bool:
    """``trust_remote_code``, or ``OPENENV_TRUST_REMOTE_CODE`` set to 1/true/yes."""
    return trust_remote_code or os.environ.get("OPENENV_TRUST_REMOTE_CODE", "").strip().lower() in ("1", "true", "yes")


def _cache_dir() -> Path:
    configured = os.environ.get("OPENENV_HUB_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "openenv" / "hub"


def fetch_space(repo_id: str) -> Path:
    """Clone the Space's repository (shallow, without running anything of it) into the cache;
    the package directory. Each fetch gets a directory of its own (a sandbox still serving an
    earlier fetch keeps its files); fetches older than a day are swept."""
    from .manifest import EnvManifest

    if shutil.which("git") is None:
        raise RuntimeError("fetching a Space needs git: install it (apt-get install git)")
    home = _cache_dir() / hf_space_subdomain(repo_id)
    home.mkdir(parents=True, exist_ok=True)
    _sweep(home, FETCH_KEPT_S)
    staging = Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
    source = space_repository(repo_id)
    # No hooks, no submodules, no LFS, and symlinks checked out as plain files: the host reads the
    # package's openenv.yaml and pyproject.toml, which must not lead it to files of its own.
    command = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.symlinks=false"]
    if "://" not in source or source.startswith("file://"):  # (a local stand-in for the Hub)
        command += ["-c", "protocol.file.allow=always"]
    command += ["clone", "--quiet", "--depth", "1", "--no-recurse-submodules", "--", source, str(staging / "repo")]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=CLONE_TIMEOUT_S,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_LFS_SKIP_SMUDGE": "1"},
        )
        if done.returncode != 0:
            raise RuntimeError(f"could not fetch the Space {repo_id} from {source}: {done.stderr.strip()}")
        EnvManifest.load(staging / "repo")  # it must be an environment package
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging / "repo"


def _sweep(home: Path, older_than_s: float) -> None:
    cutoff = time.time() - older_than_s
    for fetched in home.glob("fetch-*"):
        with contextlib.suppress(OSError):
            if fetched.stat().st_mtime < cutoff:
                shutil.rmtree(fetched, ignore_errors=True)


def missing_requirements(project: Path) -> List[str]:
    """The requirements of the package's ``pyproject.toml`` that this interpreter lacks (read as
    data; nothing of the package runs)."""
    try:
        import importlib.metadata as metadata

        from packaging.requirements import Requirement
    except ImportError:  # packaging absent: nothing to check against
        return []
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            return []
    try:
        declared = tomllib.loads((project / "pyproject.toml").read_text())["project"]["dependencies"]
    except (OSError, KeyError, TypeError, ValueError):
        return []
    missing = []
    for line in declared if isinstance(declared, list) else ():
        try:
            requirement = Requirement(str(line))
        except ValueError:
            missing.append(str(line))
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        if requirement.name.lower().replace("_", "-") == "openenv-core" and _this_core_installed(metadata):
            continue  # upstream's name for this core: the package imports `openenv`, which is ours
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(str(requirement))
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{requirement} (installed: {version})")
    return missing


def _this_core_installed(metadata: Any) -> bool:
    try:
        metadata.version("openenv")
    except metadata.PackageNotFoundError:
        return False
    return True


def refuse_untrusted(repo_id: str, trust_remote_code: bool) -> None:
    """Raise :class:`RemoteCodeNotTrusted` unless running the Space's package was consented to."""
    if not trusted(trust_remote_code):
        raise RemoteCodeNotTrusted(
            f"the Space {repo_id} is not running at {space_url(repo_id)}, so its package would have to be "
            f"fetched from {space_repository(repo_id)} and run on this machine (in a sandbox). Pass "
            "trust_remote_code=True or set OPENENV_TRUST_REMOTE_CODE=1 if you trust it; or start the Space "
            "and try again"
        )


def sandboxed_space(
    repo_id: str, *, trust_remote_code: bool = False, isolation: str = "sandbox", **options: Any
) -> Any:
    """A SandboxProvider serving the Space's package, fetched from its repository (``options``
    go to the provider); refused without consent (:func:`refuse_untrusted`)."""
    from .containers.runtime.sandbox import SandboxProvider

    refuse_untrusted(repo_id, trust_remote_code)
    project = fetch_space(repo_id)
    missing = missing_requirements(project)
    if missing:
        raise RuntimeError(
            f"the Space {repo_id}'s package needs {', '.join(missing)}, which this interpreter lacks: "
            "install them (pip install ...) and try again"
        )
    return SandboxProvider(str(project), isolation=isolation, **options)


__all__ = [
    "RemoteCodeNotTrusted",
    "fetch_space",
    "is_hub_id",
    "missing_requirements",
    "refuse_untrusted",
    "repo_id_of",
    "sandboxed_space",
    "space_repository",
    "space_url",
    "trusted",
]
