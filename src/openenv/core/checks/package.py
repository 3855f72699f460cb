"""The checks of an environment package directory: ``check_package``, what ``openenv validate
PATH`` runs.

The package is checked statically first (its manifest, layout, ``pyproject.toml`` and Dockerfile,
and its app and client, imported in a child process so that a broken package cannot hurt the
caller: :mod:`._probe`), then served in a sandbox and checked at run time like any server
(:mod:`.server`).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Dict, Optional, Union

from ..manifest import MANIFEST, EnvManifest, ManifestError
from ._common import Progress, quiet
from ._probe import run_probe
from .report import CheckReport, Status
from .server import Hints, ServerProbe, skip_rest


def check_package(
    path: Union[str, Path],
    *,
    timeout_s: float = 30.0,
    runtime: bool = True,
    isolation: str = "sandbox",
    action: Optional[Dict[str, Any]] = None,
    raise_on_failure: bool = True,
    progress: Progress = quiet,
) -> CheckReport:
    """Check the environment package at ``path``, as ``openenv validate PATH`` does: its manifest,
    layout, app, models, client, ``pyproject.toml`` and Dockerfile; then, with ``runtime``, serve
    it in a sandbox (``isolation="none"``: a plain process) and check the live server as
    :func:`~openenv.core.checks.check_url` does. The server is always stopped. ``timeout_s`` bounds
    the import, the server's start and each request; ``action`` is a valid step action as JSON data.

    Raises :class:`~openenv.core.checks.EnvCheckError` naming every failed check (warnings are
    issued as :class:`~openenv.core.checks.EnvCheckWarning`); with ``raise_on_failure=False``,
    returns the :class:`~openenv.core.checks.CheckReport` instead."""
    directory = Path(path).expanduser().resolve()
    report = CheckReport(target=str(directory), kind="package", name=directory.name)
    hints = _check_statically(directory, report, timeout_s, progress)
    if not runtime:
        return report.finish(raise_on_failure)
    if isinstance(hints, str):
        skip_rest(report, hints)
        return report.finish(raise_on_failure)
    from ..containers.runtime.sandbox import SandboxProvider

    where = "in a sandbox" if isolation == "sandbox" else "in a plain process (no isolation)"
    progress(f"Starting {report.name} {where} ...")
    provider: Optional[SandboxProvider] = None
    try:
        started = time.monotonic()
        try:
            provider = SandboxProvider(str(directory), isolation=isolation, warm=False, start_timeout_s=timeout_s)
            url = provider.start()
            provider.wait_for_ready(timeout_s)
        except Exception as exc:
            hint = " (pass --no-sandbox, or isolation='none', to run it without one)" if "bwrap" in str(exc) else ""
            report.add("server.start", "Server starts", Status.FAILED, f"{type(exc).__name__}: {exc}{hint}")
            skip_rest(report, "the server did not start")
            return report.finish(raise_on_failure)
        elapsed = time.monotonic() - started
        report.add("server.start", "Server starts", Status.PASSED, f"ready {where} in {elapsed:.1f} s at {url}")
        progress(f"Server ready in {elapsed:.1f} s; checking it ...")
        ServerProbe(url, report, hints, timeout_s, action).check()
    finally:
        if provider is not None:
            progress("Stopping the server ...")
            provider.stop()
    return report.finish(raise_on_failure)


def _check_statically(directory: Path, report: CheckReport, timeout_s: float, progress: Progress) -> Union[Hints, str]:
    """The static checks; what importing the app told, or why the package cannot be served."""
    manifest = _check_manifest(directory, report)
    if manifest is not None:
        report.name = manifest.name
    _check_layout(directory, report)
    progress(f"Importing {manifest.app if manifest else 'the client'} in a child process ...")
    probe = run_probe(directory, manifest.app if manifest else None, timeout_s)
    hints = _check_app(probe, manifest, report)
    _check_client(directory, probe, report)
    _check_pyproject(directory, report)
    _check_dockerfile(directory, report)
    if hints is None:
        return "no openenv.yaml to serve" if manifest is None else "the app did not import (see app.import)"
    return hints


def _check_manifest(directory: Path, report: CheckReport) -> Optional[EnvManifest]:
    path = directory / MANIFEST
    if not path.is_file():
        report.add(
            "manifest.present",
            f"{MANIFEST} present",
            Status.FAILED,
            f"no {MANIFEST} in {directory}: every environment package needs one (`openenv init` writes a template)",
        )
        return None
    report.add("manifest.present", f"{MANIFEST} present", Status.PASSED, str(path))
    try:
        manifest = EnvManifest.load(directory)
    except ManifestError as exc:
        report.add("manifest.valid", f"{MANIFEST} readable", Status.FAILED, str(exc))
        return None
    report.add("manifest.valid", f"{MANIFEST} readable", Status.PASSED, "valid YAML mapping")
    raw = manifest.raw
    missing = [k for k in ("name", "app") if not raw.get(k)]
    unset = [k for k in ("spec_version", "version", "description") if raw.get(k) in (None, "")]
    problems = []
    if missing:
        defaults = {"name": f"the directory name {directory.name!r}", "app": f"{manifest.app!r}"}
        problems.append(
            "required field(s) missing: "
            + ", ".join(f"{k} (would default to {defaults[k]})" for k in missing)
            + "; `openenv push`, discovery and the providers read them"
        )
    advice = []
    if unset:
        advice.append(f"recommended field(s) missing: {', '.join(unset)}")
    if raw.get("spec_version") not in (None, 1):
        advice.append(f"spec_version is {raw['spec_version']!r}; this OpenEnv knows spec_version 1")
    if "port" in raw and not isinstance(raw["port"], int):
        advice.append(f"port should be an integer, got {raw['port']!r}")
    title = "Manifest fields"
    if problems:
        report.add("manifest.fields", title, Status.FAILED, "; ".join(problems + advice))
    elif advice:
        report.add("manifest.fields", title, Status.WARNING, "; ".join(advice))
    else:
        report.add(
            "manifest.fields", title, Status.PASSED, f"name, app ({manifest.app}), spec_version, version, description"
        )
    name = raw.get("name")
    if not name:
        report.add("manifest.name", "Name is an identifier", Status.SKIPPED, "no name in the manifest")
    elif not isinstance(name, str) or not name.isidentifier():
        report.add(
            "manifest.name",
            "Name is an identifier",
            Status.FAILED,
            f"name {name!r} is not a valid Python identifier (letters, digits and underscores, not starting "
            "with a digit): the package, its imports and its image tag are named after it",
        )
    else:
        note = "" if name == directory.name else f" (the directory is named {directory.name!r})"
        report.add("manifest.name", "Name is an identifier", Status.PASSED, f"{name}{note}")
    return manifest


def _check_layout(directory: Path, report: CheckReport) -> None:
    missing = [f for f in ("__init__.py", "README.md") if not (directory / f).is_file()]
    if missing:
        report.add(
            "package.layout",
            "Package files",
            Status.WARNING,
            f"missing {', '.join(missing)}: `__init__.py` makes the directory an importable package and "
            "README.md is the Space's front page (`openenv push` expects both)",
        )
    else:
        report.add("package.layout", "Package files", Status.PASSED, "__init__.py, README.md")


def _check_app(probe: Dict[str, Any], manifest: Optional[EnvManifest], report: CheckReport) -> Optional[Hints]:
    titles = {"app.import": "App imports", "app.create_app": "App built by create_app", "app.models": "Models"}
    if manifest is None:
        for id, title in titles.items():
            report.add(id, title, Status.SKIPPED, "no readable openenv.yaml names the app")
        return None
    error = probe.get("error") or probe.get("app_error")
    if error:
        from .dependencies import missing_module_help

        advice = missing_module_help(str(error), manifest.name, manifest.path)  # a dependency not installed
        detail = f"{manifest.app} did not import:\n{error}" + (f"\n{advice}" if advice else "")
        report.add("app.import", titles["app.import"], Status.FAILED, detail)
        for id in ("app.create_app", "app.models"):
            report.add(id, titles[id], Status.SKIPPED, "the app did not import")
        return None
    app = probe["app"]
    report.add("app.import", titles["app.import"], Status.PASSED, f"{manifest.app} is a {app['type']}")
    server = app.get("server")
    if not app["asgi"] or server is None:
        what = "an ASGI app" if app["asgi"] else "not an ASGI app (not callable)"
        report.add(
            "app.create_app",
            titles["app.create_app"],
            Status.FAILED,
            f"{manifest.app} is {what} but not one built by openenv's create_app (no app.state.openenv_server): "
            "build it with openenv.core.env_server.http_server.create_app(EnvClass, ActionClass, ObservationClass)",
        )
        report.add("app.models", titles["app.models"], Status.SKIPPED, "not an OpenEnv app")
        return None
    env = server["env_class"] or "a factory function"
    report.add(
        "app.create_app",
        titles["app.create_app"],
        Status.PASSED,
        f"environment {env}, env_name {server['env_name']!r}, max_concurrent_envs={server['max_concurrent_envs']}",
    )
    models = server["models"]
    wrong = [
        f"{role} class {m['name']} is not a subclass of openenv's {m['base']}"
        for role, m in models.items()
        if not m["ok"]
    ]
    names = ", ".join(f"{role} {m['name']}" for role, m in models.items())
    if wrong:
        report.add("app.models", titles["app.models"], Status.FAILED, "; ".join(wrong))
    else:
        report.add("app.models", titles["app.models"], Status.PASSED, names)
    return Hints(
        max_sessions=server["max_concurrent_envs"],
        reset_accepts_seed=server["reset_accepts_seed"],
        mcp=server["mcp"],
        env_class=server["env_class"],
    )


def _check_client(directory: Path, probe: Dict[str, Any], report: CheckReport) -> None:
    title = "Client class"
    if not (directory / "client.py").is_file():
        report.add(
            "package.client",
            title,
            Status.FAILED,
            "no client.py: a package ships its typed client there (an EnvClient subclass)",
        )
        return
    if probe.get("error"):
        report.add("package.client", title, Status.SKIPPED, "the import probe did not run (see app.import)")
        return
    error = probe.get("client_error")
    if error:
        report.add("package.client", title, Status.FAILED, f"client.py did not import:\n{error}")
        return
    classes = probe.get("client_classes") or []
    if not classes:
        report.add(
            "package.client",
            title,
            Status.FAILED,
            "client.py defines no subclass of openenv.core.env_client.EnvClient (or MCPToolClient)",
        )
        return
    report.add("package.client", title, Status.PASSED, ", ".join(classes))


def _check_pyproject(directory: Path, report: CheckReport) -> None:
    title = "pyproject.toml"
    path = directory / "pyproject.toml"
    if not path.is_file():
        report.add(
            "package.pyproject",
            title,
            Status.WARNING,
            "no pyproject.toml: the package cannot be pip-installed (nor found by AutoEnv)",
        )
        return
    try:
        import tomllib
    except ImportError:  # Python 3.10
        report.add("package.pyproject", title, Status.SKIPPED, "reading TOML needs Python 3.11 or later")
        return
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        report.add("package.pyproject", title, Status.FAILED, f"{path} is not valid TOML: {exc}")
        return
    project = data.get("project")
    if not isinstance(project, dict) or not project.get("name"):
        report.add("package.pyproject", title, Status.FAILED, "no [project] table with a name")
        return
    name = str(project["name"])
    failures, warnings, facts = [], [], [name]
    deps = [d for d in project.get("dependencies") or [] if isinstance(d, str)]
    framework = [d for d in deps if _requirement_name(d) in ("openenv", "openenv-core")]
    if framework:
        facts.append(f"depends on {framework[0]}")
    else:
        failures.append("does not depend on openenv: installing it will not install the framework it imports")
    if not re.sub(r"[-_.]+", "-", name.lower()).startswith("openenv-"):
        warnings.append(f"project name {name!r} does not start with 'openenv-' (the convention discovery relies on)")
    backend = str((data.get("build-system") or {}).get("build-backend", ""))
    if backend.startswith("setuptools"):
        if _setuptools_ships(data, directory, MANIFEST):
            facts.append(f"{MANIFEST} in package data")
        else:
            warnings.append(
                f"{MANIFEST} is not in [tool.setuptools.package-data]: the installed package will lack it "
                "(AutoEnv discovery reads it)"
            )
    elif backend:
        facts.append(f"build backend {backend} (package data not checked)")
    detail = "; ".join(failures + warnings + facts)
    status = Status.FAILED if failures else Status.WARNING if warnings else Status.PASSED
    report.add("package.pyproject", title, status, detail)


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", match.group(1).lower()) if match else ""


def _setuptools_ships(data: Dict[str, Any], directory: Path, filename: str) -> bool:
    from fnmatch import fnmatch

    setuptools = (data.get("tool") or {}).get("setuptools") or {}
    for patterns in (setuptools.get("package-data") or {}).values():
        if any(isinstance(p, str) and fnmatch(filename, p.split("/")[-1]) for p in patterns or []):
            return True
    manifest_in = directory / "MANIFEST.in"
    if setuptools.get("include-package-data", True) and manifest_in.is_file():
        return filename in manifest_in.read_text() or "*.yaml" in manifest_in.read_text()
    return False


def _check_dockerfile(directory: Path, report: CheckReport) -> None:
    found = [p for p in ("server/Dockerfile", "Dockerfile") if (directory / p).is_file()]
    if found:
        report.add("package.dockerfile", "Dockerfile", Status.PASSED, found[0])
    else:
        report.add(
            "package.dockerfile",
            "Dockerfile",
            Status.WARNING,
            "no server/Dockerfile or Dockerfile: `openenv build`, `openenv push` and Docker providers need one "
            "(the sandbox does not)",
        )
