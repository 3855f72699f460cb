"""How a server finds its package's ASGI app: the ``app`` entry of ``openenv.yaml``.

An app path is read the way its first part says:

* a module inside the package directory (``server.app:app``, the default and what ``openenv init``
  writes) is imported with the directory first on ``sys.path``, as ``uvicorn server.app:app`` run
  from that directory would;
* a path through the package's own name (``chess_env.server.app:app``, or
  ``envs.chess_env.server.app:app`` as in a checkout of a catalogue of packages) imports the
  directory as that package, as the packages' Dockerfiles serve them: the directory given, never a
  copy of the package installed elsewhere, and its relative imports work;
* a module inside the directory that imports beyond its top level (``from ..models import X``,
  code written to run as ``<package>.server.app``), or that imports its own package by name when
  that package is not installed, is imported again as ``<package>.server.app``.

The package's name is what its ``pyproject.toml`` maps onto the directory (setuptools'
``package-dir``), else the directory's name. A sandboxed server runs as a uid of its own, so the
package must be readable by others: where it is not, the error says so and how to fix it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import stat
import sys
from typing import Any, Iterator, List, Optional, Tuple

_BEYOND_TOP_LEVEL = "attempted relative import beyond top-level package"
_MAX_WALK = 5000  # entries looked at when explaining a failed import


class PackageNotReadableError(ImportError):
    """The package directory (or something in it) cannot be read by the server's user."""


def import_app(app_path: str, project_dir: Optional[str]) -> Any:
    """The object ``app_path`` (``module.path:attribute``) names, imported from ``project_dir``."""
    module_name, _, attribute = app_path.partition(":")
    module = _import_module(module_name, project_dir) if project_dir else importlib.import_module(module_name)
    app = module
    for part in attribute.split("."):
        try:
            app = getattr(app, part)
        except AttributeError:
            raise AttributeError(f"{module_name} has no {attribute!r} (the app path is {app_path!r})") from None
    return app


def package_names(directory: str) -> List[str]:
    """The names ``directory`` is imported as: its ``pyproject.toml``'s mapping onto it, then its own
    name (only valid Python identifiers, best first)."""
    names: List[str] = []
    for name in [*_pyproject_names(directory), os.path.basename(os.path.normpath(directory))]:
        if name.isidentifier() and name not in names:
            names.append(name)
    return names


def unreadable_message(path: str, info: os.stat_result, package_dir: str, uid: Optional[int] = None) -> str:
    """What to say when the sandbox's user cannot read ``path`` (``package_dir`` or a part of it)."""
    who = "the sandbox's user" if uid is None else f"the sandbox's user (uid {uid})"
    what = "package directory" if path == package_dir else "directory" if stat.S_ISDIR(info.st_mode) else "file"
    where = "" if path == package_dir else f" in the package {package_dir}"
    return (
        f"the {what} {path}{where} is not readable by {who}: it is mode {stat.S_IMODE(info.st_mode):04o}, "
        f"owned by uid {info.st_uid}. A sandboxed server runs as a uid of its own, so the package must be "
        f"readable by others: run chmod -R o+rX {package_dir} (a directory made by tempfile.mkdtemp is mode "
        "0700), or serve a copy of the package from a directory that others can read"
    )


# --- importing --------------------------------------------------------------------------------------


def _import_module(module_name: str, project_dir: str) -> Any:
    directory = os.path.realpath(project_dir)
    _check_readable(directory)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # as uvicorn run from the directory (or the Dockerfiles' PYTHONPATH)
    names = package_names(directory)
    head = module_name.split(".")[0]
    through_package = _through_package(module_name, names)
    if through_package is not None and not _inside(directory, head):
        _register_package(through_package, directory)
        return _import_explained(module_name, directory)
    before = set(sys.modules)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        if not names or not _package_import_cures(exc, names):
            _raise_if_unreadable(directory, exc)
            raise
        first = exc
    # Code written to run as its package (`from ..models import X`): import it that way.
    _forget_modules_from(directory, set(sys.modules) - before)
    package = names[0]
    try:
        _register_package(package, directory)
        return importlib.import_module(f"{package}.{module_name}")
    except ImportError as exc:
        _raise_if_unreadable(directory, exc)
        raise exc from first


def _import_explained(module_name: str, directory: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        _raise_if_unreadable(directory, exc)
        raise


def _through_package(module_name: str, names: List[str]) -> Optional[str]:
    """``envs.chess_env`` for ``envs.chess_env.server.app`` when the package is ``chess_env``."""
    parts = module_name.split(".")
    for index, part in enumerate(parts):
        if part in names:
            return ".".join(parts[: index + 1])
    return None


def _inside(directory: str, head: str) -> bool:
    return os.path.isfile(os.path.join(directory, head + ".py")) or os.path.isdir(os.path.join(directory, head))


def _package_import_cures(exc: BaseException, names: List[str]) -> bool:
    """Whether importing the module as part of its package would get past ``exc``."""
    for error in _chain(exc):
        if isinstance(error, ImportError) and not isinstance(error, ModuleNotFoundError):
            if _BEYOND_TOP_LEVEL in str(error):
                return True
        if isinstance(error, ModuleNotFoundError) and error.name:
            if error.name.split(".")[0] in names:  # `from chess_env.models import X`, not installed
                return True
    return False


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (an app's ``except ImportError``)."""
    seen = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _forget_modules_from(directory: str, names: set) -> None:
    """Drop the modules a failed import loaded from ``directory`` under top-level names (``server``,
    ``models``), so that only the package's own copies stay."""
    prefix = directory.rstrip(os.sep) + os.sep
    for name in names:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or []), None)
        if isinstance(where, str) and os.path.realpath(where).startswith(prefix):
            del sys.modules[name]


def _register_package(name: str, directory: str) -> None:
    """Make ``name`` (dotted, e.g. ``envs.chess_env``) the package whose code is ``directory``.

    Parents that do not exist (``envs``) become empty namespace packages: nothing beside the
    package is reachable through them."""
    parts = name.split(".")
    for index in range(1, len(parts)):
        parent = ".".join(parts[:index])
        if parent not in sys.modules and importlib.util.find_spec(parent) is None:
            spec = importlib.machinery.ModuleSpec(parent, None, is_package=True)
            sys.modules[parent] = importlib.util.module_from_spec(spec)
    existing = sys.modules.get(name)
    if existing is not None and directory in list(getattr(existing, "__path__", None) or []):
        return
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[loaded]  # another copy of the package (an installed one): this directory's wins
    init = os.path.join(directory, "__init__.py")
    if os.path.isfile(init):
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[directory])
    else:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [directory]
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        if spec.loader is not None:
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    if len(parts) > 1:
        setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)


def _pyproject_names(directory: str) -> List[str]:
    path = os.path.join(directory, "pyproject.toml")
    if not os.path.isfile(path):
        return []
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        return []
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, ValueError):
        return []
    mapping = data.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    if not isinstance(mapping, dict):
        return []
    return [key for key, value in mapping.items() if value in (".", "") and isinstance(key, str) and "." not in key]


# --- readability ------------------------------------------------------------------------------------


def _check_readable(directory: str) -> None:
    if not os.access(directory, os.R_OK | os.X_OK):
        raise PackageNotReadableError(unreadable_message(directory, os.stat(directory), directory, os.getuid()))


def _raise_if_unreadable(directory: str, exc: ImportError) -> None:
    """A failed import whose cause is a part of the package this user cannot read says so."""
    found = _first_unreadable(directory)
    if found is not None:
        path, info = found
        raise PackageNotReadableError(unreadable_message(path, info, directory, os.getuid())) from exc


def _first_unreadable(directory: str) -> Optional[Tuple[str, os.stat_result]]:
    seen = 0
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            return current, os.stat(current)
        for entry in entries:
            seen += 1
            if seen > _MAX_WALK:
                return None
            if entry.name.startswith(".") or entry.name == "__pycache__":
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                if not os.access(entry.path, os.R_OK | os.X_OK):
                    return entry.path, info
                stack.append(entry.path)
            elif entry.name.endswith(".py") and not os.access(entry.path, os.R_OK):
                return entry.path, info
    return None
