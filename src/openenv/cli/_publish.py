"""What ``openenv build``, ``push`` and ``fork`` share: the package's layout, staging a clean copy
of it, the Space layout, and the Hugging Face Hub client.

Staging copies a package without what is local to one machine or one build: hidden directories
and files (``.git``, ``.venv``, ``.env``: a secret must never be published by accident) except
``.dockerignore``, ``.gitignore`` and ``.gitattributes``; ``__pycache__``, ``*.pyc``, ``*.egg-info``
anywhere; ``build/`` and ``dist/`` at the top. The image ``openenv build`` makes and the Space
``openenv push`` fills are built from the same staged copy.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from openenv.cli._common import CLIError, err, styled
from openenv.core.manifest import MANIFEST, EnvManifest

DOCKERFILES = ("server/Dockerfile", "Dockerfile")
"""Where a package's Dockerfile is looked for, in this order (paths relative to the package)."""

KEPT_HIDDEN = frozenset({".dockerignore", ".gitignore", ".gitattributes"})
EXCLUDED_NAMES = ("__pycache__", "*.pyc", "*.pyo", "*.egg-info")
EXCLUDED_AT_TOP = ("build", "dist")

SPACE_PORT_DEFAULT = 8000
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# -- the package ----------------------------------------------------------------------------------


def find_dockerfile(package_dir: Path) -> Optional[str]:
    """The package's Dockerfile, relative to it (``server/Dockerfile`` first), or None."""
    for candidate in DOCKERFILES:
        if (package_dir / candidate).is_file():
            return candidate
    return None


def dockerfile_hint(package_dir: Path) -> str:
    return (
        f"add one at {package_dir / 'server' / 'Dockerfile'} or {package_dir / 'Dockerfile'}; openenv's template "
        'fits packages laid out like `openenv init` makes them: python -c "from '
        "openenv.core.containers.runtime.docker import dockerfile_template as t; print(t(), end='')\" "
        f"> {package_dir / 'Dockerfile'}"
    )


def image_tag(name: str) -> str:
    """The default image tag of environment ``name``: ``openenv-<name minus _env>:latest``."""
    base = name[: -len("_env")] if name.endswith("_env") and name != "_env" else name
    base = re.sub(r"[^a-z0-9_.-]+", "-", base.lower()).strip("-._") or "env"
    return f"openenv-{base}:latest"


def _app_module_files(app: str) -> List[str]:
    module = app.split(":", 1)[0].replace(".", "/")
    return [f"{module}.py", f"{module}/__init__.py"]


def check_structure(manifest: EnvManifest) -> List[str]:
    """Refuse (CLIError listing every gap) a package that cannot be published; return warnings.

    Required: ``openenv.yaml`` naming the environment, ``__init__.py``, ``client.py``,
    ``README.md``, the module of the manifest's ``app`` (``server/app.py`` by default) and a
    Dockerfile (:data:`DOCKERFILES`). A missing ``pyproject.toml`` is a warning.
    """
    directory = manifest.path
    missing = []
    if not manifest.raw.get("name"):
        missing.append(f"a 'name' in {MANIFEST}")
    for required in ("__init__.py", "client.py", "README.md"):
        if not (directory / required).is_file():
            missing.append(required)
    app_files = _app_module_files(manifest.app)
    if not any((directory / candidate).is_file() for candidate in app_files):
        missing.append(f"{app_files[0]} (the module of app {manifest.app!r})")
    if find_dockerfile(directory) is None:
        missing.append(" or ".join(DOCKERFILES))
    if missing:
        hint = dockerfile_hint(directory) if find_dockerfile(directory) is None else "add them"
        raise CLIError(
            f"{directory} is not a complete environment package; missing: {', '.join(missing)}. "
            f"`openenv init NAME` makes a complete one to compare with; {hint}"
        )
    warnings = []
    if not (directory / "pyproject.toml").is_file():
        warnings.append("no pyproject.toml: the package cannot be installed with pip")
    return warnings


# -- staging --------------------------------------------------------------------------------------


def _matches(patterns: Iterable[str], relative: str, name: str, is_dir: bool) -> bool:
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        if not pattern or (dir_only and not is_dir):
            continue
        if "/" in pattern.lstrip("/"):
            if fnmatch.fnmatchcase(relative, pattern.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def excluded(relative: str, is_dir: bool, patterns: Sequence[str] = ()) -> bool:
    """Whether staging leaves out the file or directory at ``relative`` (a POSIX path in the package).

    ``patterns`` are the user's, gitignore-like: a pattern without a ``/`` matches a name at any
    depth (``*.ckpt``, ``data``), one with a ``/`` the path from the package root
    (``server/tmp/*``); a trailing ``/`` matches directories only.
    """
    name = relative.rsplit("/", 1)[-1]
    if name.startswith(".") and name not in KEPT_HIDDEN:
        return True
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in EXCLUDED_NAMES):
        return True
    if is_dir and "/" not in relative and name in EXCLUDED_AT_TOP:
        return True
    return _matches(patterns, relative, name, is_dir)


def stage(package_dir: Path, dest: Path, patterns: Sequence[str] = ()) -> List[str]:
    """Copy ``package_dir`` into the empty or absent ``dest`` without what :func:`excluded` names.

    Symbolic links that stay inside the package are copied as links; one that leads out of it is
    left out, with a warning (following it could publish a file from elsewhere on the machine).
    Returns the staged files' relative paths.
    """
    package_dir = package_dir.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    staged: List[str] = []
    for root, dirs, files in os.walk(package_dir):
        here = Path(root)
        rel_root = here.relative_to(package_dir).as_posix()
        prefix = "" if rel_root == "." else rel_root + "/"
        kept_dirs = []
        for name in sorted(dirs):
            relative = prefix + name
            if excluded(relative, True, patterns) or not _link_inside(here / name, package_dir, relative):
                continue
            if (here / name).is_symlink():
                _copy_link(here / name, dest / relative)
                staged.append(relative)
                continue
            (dest / relative).mkdir()
            kept_dirs.append(name)
        dirs[:] = kept_dirs
        for name in sorted(files):
            relative = prefix + name
            source = here / name
            if excluded(relative, False, patterns) or not _link_inside(source, package_dir, relative):
                continue
            if source.is_symlink():
                _copy_link(source, dest / relative)
            else:
                shutil.copy2(source, dest / relative)
            staged.append(relative)
    return staged


def _link_inside(path: Path, package_dir: Path, relative: str) -> bool:
    if not path.is_symlink():
        return True
    target = os.path.realpath(path)
    if target == str(package_dir) or target.startswith(str(package_dir) + os.sep):
        return True
    err.print(styled("[yellow]Warning:[/] left out {}: a symbolic link to {}, outside the package", relative, target))
    return False


def _copy_link(source: Path, dest: Path) -> None:
    target = os.readlink(source)
    if os.path.isabs(target):  # re-point it inside the copy
        target = os.path.relpath(os.path.realpath(source), os.path.realpath(source.parent))
    os.symlink(target, dest)


# -- the Space layout -----------------------------------------------------------------------------


def space_layout(staged: Path, manifest: EnvManifest, web: bool = True) -> List[str]:
    """Turn a staged package into a Docker Space: the Dockerfile at the root, and README front
    matter with ``sdk: docker`` and ``app_port`` (the manifest's ``port``). With ``web`` (as
    upstream does for Spaces) the Space opens on the web playground: ``base_path: /web`` in the
    front matter (unless it names another) and ``ENV ENABLE_WEB_INTERFACE=true`` in the
    Dockerfile (unless it sets that variable itself). Returns what changed."""
    changes = []
    dockerfile = find_dockerfile(staged)
    if dockerfile is None:
        raise CLIError(f"no Dockerfile in the staged copy of {manifest.path}: {dockerfile_hint(manifest.path)}")
    if dockerfile != "Dockerfile":
        if (staged / "Dockerfile").exists():
            changes.append(f"{dockerfile} replaces the root Dockerfile (openenv build uses {dockerfile} too)")
        else:
            changes.append(f"{dockerfile} moved to the root")
        os.replace(staged / dockerfile, staged / "Dockerfile")
    if web:
        docker_text = (staged / "Dockerfile").read_text(encoding="utf-8")
        with_web = with_web_interface(docker_text)
        if with_web != docker_text:
            (staged / "Dockerfile").write_text(with_web, encoding="utf-8")
            changes.append(f"Dockerfile: added {WEB_ENV_LINE.strip()} (the Space opens on the web playground)")
    readme = staged / "README.md"
    text = readme.read_text(encoding="utf-8")
    wanted = {"sdk": "docker", "app_port": manifest.port or SPACE_PORT_DEFAULT}
    defaults: Dict[str, Any] = {"title": manifest.name, "tags": ["openenv"]}
    if web:
        defaults["base_path"] = "/web"
    new_text, readme_changes = space_front_matter(text, wanted, defaults)
    if new_text != text:
        readme.write_text(new_text, encoding="utf-8")
        changes.extend(f"README.md: {change}" for change in readme_changes)
    return changes


WEB_ENV_LINE = "ENV ENABLE_WEB_INTERFACE=true\n"
_WEB_ENV_BLOCK = "# openenv push: the Space opens on the web playground (/web)\n" + WEB_ENV_LINE + "\n"


def with_web_interface(dockerfile: str) -> str:
    """``dockerfile`` with :data:`WEB_ENV_LINE` before its first ``CMD`` instruction (at its end
    when it has none); unchanged when it names ``ENABLE_WEB_INTERFACE`` already."""
    if "ENABLE_WEB_INTERFACE" in dockerfile:
        return dockerfile
    lines = dockerfile.splitlines(keepends=True)
    continued = False  # the previous line ended in a backslash: this one belongs to its instruction
    for index, line in enumerate(lines):
        if not continued and re.match(r"\s*CMD\b", line, re.IGNORECASE):
            while index > 0 and lines[index - 1].lstrip().startswith("#"):  # above the CMD's comment
                index -= 1
            return "".join([*lines[:index], _WEB_ENV_BLOCK, *lines[index:]])
        stripped = line.rstrip("\r\n")
        continued = stripped.endswith("\\") or (continued and not stripped.strip())
    return dockerfile + ("" if dockerfile.endswith("\n") or not dockerfile else "\n") + WEB_ENV_LINE


def _yaml_line(key: str, value: Any) -> str:
    import yaml

    return yaml.safe_dump({key: value}, default_flow_style=False, sort_keys=False).strip()


def space_front_matter(text: str, wanted: Dict[str, Any], defaults: Dict[str, Any]) -> Tuple[str, List[str]]:
    """``text`` (a README) with YAML front matter that has the ``wanted`` values and, for keys it
    lacks, the ``defaults``. Other keys, their order, comments and the body are left as they are."""
    import yaml

    lines = text.splitlines(keepends=True)
    if lines and lines[0].rstrip("\r\n") == "---":
        close = next((i for i in range(1, len(lines)) if lines[i].rstrip("\r\n") in ("---", "...")), None)
        if close is None:
            raise CLIError("README.md starts a front matter block (---) that never ends: close it with a --- line")
        block = lines[1:close]
        body = lines[close:]
    else:
        block, body = [], ["---\n", *(["\n"] if lines else []), *lines]
    try:
        current = yaml.safe_load("".join(block)) or {}
    except yaml.YAMLError as exc:
        raise CLIError(f"README.md's front matter is not valid YAML: {exc}") from None
    if not isinstance(current, dict):
        raise CLIError("README.md's front matter must be a YAML mapping (key: value lines)")
    changes = []
    for key, value in {**{k: v for k, v in defaults.items() if k not in current}, **wanted}.items():
        if key in current and current[key] == value:
            continue
        line = _yaml_line(key, value) + "\n"
        index = next((i for i, old in enumerate(block) if re.match(rf"{re.escape(key)}\s*:", old)), None)
        if index is None:
            block.append(line)
            changes.append(f"added {line.strip()}")
        else:
            end = index + 1  # a value may continue on indented lines
            while end < len(block) and block[end][:1] in (" ", "\t", "-") and block[end].strip():
                end += 1
            block[index:end] = [line]
            changes.append(f"{key}: {current[key]!r} replaced by {value!r}")
    if not changes:
        return text, []
    return "".join(["---\n", *block, *body]), changes


# -- the Hugging Face Hub -------------------------------------------------------------------------


def hf_api() -> Any:
    """A ``huggingface_hub.HfApi``: the one seam through which ``push`` and ``fork`` reach the Hub
    (tests replace this function with one that returns a recording fake)."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise CLIError("huggingface_hub is not installed: pip install 'openenv[hub]'") from None
    return HfApi()


LOGIN_HINT = "log in with `hf auth login` (or `huggingface-cli login`), or set HF_TOKEN to a write token"


def hub_error(exc: Exception, doing: str) -> CLIError:
    """A CLIError that says what failed on the Hub and what to do about it."""
    name = type(exc).__name__
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if name == "LocalTokenNotFoundError":
        return CLIError(f"not logged in to the Hugging Face Hub: {LOGIN_HINT}")
    if status == 401:
        return CLIError(f"the Hugging Face Hub refused the token while {doing} (HTTP 401): {LOGIN_HINT}")
    if status == 403:
        return CLIError(f"the Hugging Face Hub refused {doing} (HTTP 403): the token needs write access there")
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else name
    return CLIError(f"{doing} failed: {first_line}")


def hub_user(api: Any) -> str:
    """The name of the user the Hub token belongs to; CLIError when there is no usable token."""
    try:
        info = api.whoami()
    except Exception as exc:
        raise hub_error(exc, "checking the Hub login") from None
    name = info.get("name") if isinstance(info, dict) else None
    if not name:
        raise CLIError(f"the Hugging Face Hub did not say who the token belongs to: {LOGIN_HINT}")
    return str(name)


def _repo_parts(value: str) -> List[str]:
    repo = value.strip()
    for prefix in ("https://huggingface.co/spaces/", "https://hf.co/spaces/", "spaces/"):
        if repo.startswith(prefix):
            repo = repo[len(prefix) :].strip("/")
    parts = repo.split("/")
    if len(parts) > 2 or not all(parts) or any(part.strip() != part or " " in part for part in parts):
        raise CLIError(f"invalid Space id {value!r}: use NAME or ORG/NAME")
    return parts


def resolve_repo_id(value: Optional[str], default_name: str, user: str) -> str:
    """``ORG/NAME`` as given (a Space URL works too); a bare ``NAME`` (or nothing: ``default_name``)
    in the user's namespace."""
    parts = _repo_parts(value or default_name)
    return "/".join(parts) if len(parts) == 2 else f"{user}/{parts[0]}"


def space_id(value: str) -> str:
    """The ``ORG/NAME`` of an existing Space, given as such or as its URL."""
    parts = _repo_parts(value)
    if len(parts) != 2:
        raise CLIError(f"{value!r} names no Space: use ORG/NAME (or the Space's URL)")
    return "/".join(parts)


def parse_assignments(values: Optional[Sequence[str]], option: str, secret: bool = False) -> Dict[str, str]:
    """``KEY=VALUE`` strings as a dict; CLIError for a malformed one (a secret's value is never shown)."""
    result: Dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _ENV_NAME.fullmatch(key):
            # Without an "=" the whole argument may be the secret itself: never echo it.
            shown = "a value without '='" if secret and not sep else repr(key if secret else item)
            raise CLIError(f"{option} expects KEY=VALUE with KEY a variable name (letters, digits, _), got {shown}")
        result[key] = value
    return result
