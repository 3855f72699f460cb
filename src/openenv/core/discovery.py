"""Finding installed environment packages.

An environment package is a distribution named ``openenv-<name>`` (not ``openenv-core``) whose
module ships an ``openenv.yaml``; packages may also declare an ``openenv.environments`` entry
point (``echo = "echo_env"``). Names are matched loosely: ``echo``, ``echo_env``, ``echo-env`` and
``openenv-echo-env`` all find the same package.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from .manifest import MANIFEST, EnvManifest, ManifestError

ENTRY_POINT_GROUP = "openenv.environments"


def normalize(name: str) -> str:
    """``OpenEnv-Echo-Env`` / ``echo_env`` / ``echo`` -> ``echo``."""
    key = name.strip().lower().replace("-", "_")
    if key.startswith("openenv_"):
        key = key[len("openenv_") :]
    if key.endswith("_env"):
        key = key[: -len("_env")]
    return key


def _pascal(key: str) -> str:
    return "".join(part.capitalize() for part in key.split("_") if part)


@dataclass(frozen=True)
class EnvInfo:
    """An installed environment package as discovery sees it."""

    key: str
    module: str
    distribution: Optional[str]
    version: Optional[str]
    path: Path
    manifest: EnvManifest

    @property
    def env_name(self) -> str:
        return f"{self.key}_env"

    @property
    def client_class_name(self) -> str:
        """The manifest's ``client`` or ``<Key>Env``, e.g. ``EchoEnv`` (found case-insensitively, so
        ``REPLEnv``, ``FinQAEnv`` and ``TextArenaEnv`` need no manifest entry)."""
        return self.manifest.client or f"{_pascal(self.key)}Env"

    @property
    def action_class_name(self) -> str:
        return self.manifest.action or f"{_pascal(self.key)}Action"

    @property
    def observation_class_name(self) -> str:
        return self.manifest.observation or f"{_pascal(self.key)}Observation"

    def _find(self, name: str) -> type:
        for module_name in (self.module, f"{self.module}.client", f"{self.module}.models"):
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            value = getattr(module, name, None)
            if value is None:  # upstream's spellings: REPLEnv for "repl", FinQAEnv for "finqa"
                matches = [getattr(module, attr) for attr in dir(module) if attr.lower() == name.lower()]
                value = matches[0] if len(matches) == 1 else None
            if isinstance(value, type):
                return value
        raise ImportError(f"{name} not found in {self.module} (looked in the package, .client and .models)")

    def client_class(self) -> type:
        return self._find(self.client_class_name)

    def action_class(self) -> type:
        return self._find(self.action_class_name)

    def observation_class(self) -> type:
        return self._find(self.observation_class_name)


def _package_dir(module: str) -> Optional[Path]:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or []:
        if (Path(location) / MANIFEST).is_file():
            return Path(location)
    return None


def discover_environments() -> Dict[str, EnvInfo]:
    """Every installed environment package, by normalized name."""
    found: Dict[str, EnvInfo] = {}
    candidates: List[tuple] = []
    for dist in metadata.distributions():
        name = dist.metadata.get("Name") or ""
        entry_points = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
        for ep in entry_points:
            candidates.append((ep.value.split(":")[0], name, dist.version, ep.name))
        if name.lower().startswith("openenv-") and name.lower() not in ("openenv-core",) and not entry_points:
            module = name[len("openenv-") :].replace("-", "_").lower()
            candidates.append((module, name, dist.version, None))
    for module, dist_name, version, alias in candidates:
        path = _package_dir(module)
        if path is None:
            continue
        try:
            manifest = EnvManifest.load(path)
        except ManifestError:
            continue
        key = normalize(alias or manifest.name or module)
        found.setdefault(key, EnvInfo(key, module, dist_name, version, path, manifest))
    return found


def resolve_environment(name: str) -> EnvInfo:
    """The installed environment called ``name``; a ``ValueError`` that says what to do otherwise."""
    environments = discover_environments()
    info = environments.get(normalize(name))
    if info is None:
        raise ValueError(_not_found(name, sorted(environments)))
    return info


def _not_found(name: str, installed: List[str]) -> str:
    """Why ``name`` found nothing, and only next steps that exist: a close installed name, the
    catalogue's directory when there is one, the Hub's own URLs for a Hub id."""
    if "/" in name.strip("/") and not Path(name).expanduser().exists():
        repo = name.strip("/").split("/spaces/")[-1]
        return (
            f"{name!r} is a Hugging Face Space id, and no package of that name is installed here. "
            f"AutoEnv.from_env({repo!r}) connects to the running Space (or, with trust_remote_code=True, "
            "serves its package in a sandbox); the Space's own classes are its code and need its package "
            f"installed: pip install git+https://huggingface.co/spaces/{repo}"
        )
    key = normalize(name)
    near = difflib.get_close_matches(key, installed, n=1, cutoff=0.6)
    text = f"no installed environment package matches {name!r}" + (f": did you mean {near[0]!r}?" if near else ".")
    text += f" Installed: {', '.join(installed) or 'none'} (`openenv list` shows them)."
    catalogue = Path(__file__).resolve().parents[3] / "envs" / f"{key}_env"  # a source checkout's catalogue
    if (catalogue / MANIFEST).is_file():
        text += f" Install it with: pip install -e {catalogue}"
    else:
        text += " Install the package with pip, or pass the path of an environment package directory."
    return text


__all__ = ["ENTRY_POINT_GROUP", "EnvInfo", "discover_environments", "normalize", "resolve_environment"]
