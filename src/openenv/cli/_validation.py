"""The checks behind ``openenv validate``: OpenEnv's ``check_env``.

A package is checked statically (its manifest, layout, ``pyproject.toml``, Dockerfile, and its app
and client, imported in a child process so that a broken package cannot hurt the caller), then at
run time against a server started in a sandbox. A URL is checked at run time only. Run-time checks
speak HTTP and the ``/ws`` protocol frame by frame, the way any client (ours or upstream's) relies
on them.

Every check ends ``passed``, ``warning``, ``failed`` or ``skipped`` with a sentence saying why; a
:class:`Report` passes when none failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from openenv.core.manifest import MANIFEST, EnvManifest, ManifestError
from openenv.core.utils import within

Progress = Callable[[str], None]

SEED = 1234
OTHER_SEED = 4321
_PROBE_MARK = "OPENENV-VALIDATE-PROBE:"
_MCP_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


class Status(str, Enum):
    PASSED = "passed"
    WARNING = "warning"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass
class Check:
    """The outcome of one check: a stable ``id``, a human ``title``, and why it ended as it did."""

    id: str
    title: str
    status: Status
    detail: str = ""

    def to_dict(self) -> Dict[str, str]:
        return {"id": self.id, "title": self.title, "status": self.status.value, "detail": self.detail}


@dataclass
class Report:
    """What ``openenv validate`` found; ``passed`` is true when no check failed."""

    target: str
    kind: str  # "package" or "url"
    name: Optional[str] = None
    checks: List[Check] = field(default_factory=list)

    def add(self, id: str, title: str, status: Status, detail: str = "") -> Check:
        check = Check(id, title, status, detail)
        self.checks.append(check)
        return check

    def get(self, id: str) -> Optional[Check]:
        return next((c for c in self.checks if c.id == id), None)

    @property
    def passed(self) -> bool:
        return not any(c.status is Status.FAILED for c in self.checks)

    def counts(self) -> Dict[str, int]:
        return {s.value: sum(c.status is s for c in self.checks) for s in Status}

    def to_dict(self) -> Dict[str, Any]:
        return {
            "target": self.target,
            "kind": self.kind,
            "name": self.name,
            "passed": self.passed,
            "summary": self.counts(),
            "checks": [c.to_dict() for c in self.checks],
        }


def _quiet(_: str) -> None:
    pass


# --- entry points --------------------------------------------------------------------------------


def validate_package(
    path: Path,
    *,
    timeout_s: float = 30.0,
    runtime: bool = True,
    isolation: str = "sandbox",
    action: Optional[Dict[str, Any]] = None,
    progress: Progress = _quiet,
) -> Report:
    """Check the environment package at ``path``; with ``runtime``, also serve it in a sandbox
    (``isolation="none"``: a plain process) and check the live server. The server is always stopped."""
    directory = path.expanduser().resolve()
    report = Report(target=str(directory), kind="package", name=directory.name)
    manifest = _check_manifest(directory, report)
    if manifest is not None:
        report.name = manifest.name
    _check_layout(directory, report)
    progress(f"Importing {manifest.app if manifest else 'the client'} in a child process ...")
    probe = _run_probe(directory, manifest.app if manifest else None, timeout_s)
    hints = _check_app(probe, manifest, report)
    _check_client(directory, probe, report)
    _check_pyproject(directory, report)
    _check_dockerfile(directory, report)
    if not runtime:
        return report
    if hints is None:
        reason = "no openenv.yaml to serve" if manifest is None else "the app did not import (see app.import)"
        _skip_rest(report, reason)
        return report
    from openenv.core.containers.runtime.sandbox import SandboxProvider

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
            hint = " (pass --no-sandbox to run it without one)" if "bwrap" in str(exc) else ""
            report.add("server.start", "Server starts", Status.FAILED, f"{type(exc).__name__}: {exc}{hint}")
            _skip_rest(report, "the server did not start")
            return report
        elapsed = time.monotonic() - started
        report.add("server.start", "Server starts", Status.PASSED, f"ready {where} in {elapsed:.1f} s at {url}")
        progress(f"Server ready in {elapsed:.1f} s; checking it ...")
        _run(_ServerProbe(url, report, hints, timeout_s, action).run())
    finally:
        if provider is not None:
            progress("Stopping the server ...")
            provider.stop()
    return report


def validate_url(
    url: str, *, timeout_s: float = 30.0, action: Optional[Dict[str, Any]] = None, progress: Progress = _quiet
) -> Report:
    """Check the running server at ``url`` (``http(s)://...`` or ``unix:///path.sock``)."""
    report = Report(target=url, kind="url")
    progress(f"Checking the server at {url} ...")
    _run(_ServerProbe(url, report, _Hints(), timeout_s, action, send_token=True).run())
    return report


def _run(coro: Any) -> Any:
    from openenv.core.utils import run_async_safely

    return run_async_safely(coro)


def _skip_rest(report: Report, reason: str) -> None:
    """Mark every run-time check not run yet as skipped."""
    done = {c.id for c in report.checks}
    if report.kind == "url":  # nothing was started
        done.add("server.start")
    for id, title in _RUNTIME_CHECKS:
        if id not in done:
            report.add(id, title, Status.SKIPPED, reason)


_RUNTIME_CHECKS = [
    ("server.start", "Server starts"),
    ("http.health", "GET /health"),
    ("http.metadata", "GET /metadata"),
    ("http.schema", "GET /schema"),
    ("mcp.tools", "MCP tools/list"),
    ("ws.round_trip", "reset / step / state over /ws"),
    ("ws.invalid_action", "Invalid action answered, connection kept"),
    ("ws.seed_determinism", "Same seed, same episode"),
    ("ws.concurrent_sessions", "Concurrent sessions are independent"),
]


# --- static checks -------------------------------------------------------------------------------


def _check_manifest(directory: Path, report: Report) -> Optional[EnvManifest]:
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


def _check_layout(directory: Path, report: Report) -> None:
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


def _check_app(probe: Dict[str, Any], manifest: Optional[EnvManifest], report: Report) -> Optional[_Hints]:
    titles = {"app.import": "App imports", "app.create_app": "App built by create_app", "app.models": "Models"}
    if manifest is None:
        for id, title in titles.items():
            report.add(id, title, Status.SKIPPED, "no readable openenv.yaml names the app")
        return None
    error = probe.get("error") or probe.get("app_error")
    if error:
        from openenv.cli._dependencies import missing_module_help

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
    return _Hints(
        max_sessions=server["max_concurrent_envs"],
        reset_accepts_seed=server["reset_accepts_seed"],
        mcp=server["mcp"],
        env_class=server["env_class"],
    )


def _check_client(directory: Path, probe: Dict[str, Any], report: Report) -> None:
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


def _check_pyproject(directory: Path, report: Report) -> None:
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


def _check_dockerfile(directory: Path, report: Report) -> None:
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


# --- the import probe (runs in a child process) --------------------------------------------------


def _run_probe(directory: Path, app: Optional[str], timeout_s: float) -> Dict[str, Any]:
    """Import the app and the client in a child process; what it found, or ``{"error": why}``."""
    argv = [sys.executable, "-m", __name__, "probe", str(directory), app or ""]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run(
            argv, cwd=directory, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return {"error": f"importing took longer than {timeout_s:g} s (raise --timeout if it is just slow)"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(_PROBE_MARK):
            return json.loads(line[len(_PROBE_MARK) :])
    tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
    return {"error": f"the import process exited with code {done.returncode}:\n{tail}"}


def _format_error(exc: BaseException) -> str:
    import traceback

    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(lines).rstrip()
    return "\n".join(text.splitlines()[-12:])


def _probe(directory: str, app_path: str) -> Dict[str, Any]:
    import contextlib

    found: Dict[str, Any] = {}
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the result
        if app_path:
            try:
                from openenv.core.containers.runtime._serve import _import_app

                found["app"] = _describe_app(_import_app(app_path, directory))
            except BaseException as exc:
                found["app_error"] = _format_error(exc)
        if os.path.isfile(os.path.join(directory, "client.py")):
            try:
                found["client_classes"] = _client_classes(directory)
            except BaseException as exc:
                found["client_error"] = _format_error(exc)
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


# --- run-time checks -----------------------------------------------------------------------------


@dataclass
class _Hints:
    """What importing the app told about it (nothing, for a URL)."""

    max_sessions: Optional[int] = None
    reset_accepts_seed: Optional[bool] = None
    mcp: Optional[bool] = None
    env_class: Optional[str] = None


class _Broken(Exception):
    """The connection failed (closed, timed out, or sent something that is not a JSON object)."""


_TOKEN_HINT = " (the server wants a token: set OPENENV_AUTH_TOKEN; validate sends it to servers on this machine only)"


def _auth_headers(endpoint: Any) -> Dict[str, str]:
    """The bearer token of ``$OPENENV_AUTH_TOKEN``, for a server named by URL on this machine (a
    loopback address, ``localhost`` or a Unix socket) that requires one; never sent elsewhere,
    where it may not be that server's (a ``*.localhost`` name may be looked up in DNS)."""
    token = os.environ.get("OPENENV_AUTH_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token and endpoint.is_certainly_local else {}


class _Frames:
    """One ``/ws`` connection, spoken to frame by frame."""

    def __init__(self, endpoint: Any, timeout_s: float, headers: Dict[str, str]) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.headers = headers
        self.ws: Any = None

    async def __aenter__(self) -> _Frames:
        from websockets.asyncio.client import connect, unix_connect

        url = self.endpoint.ws_url + "/ws"
        options: Dict[str, Any] = dict(
            open_timeout=self.timeout_s,
            max_size=100 * 1024 * 1024,
            compression=None,
            additional_headers=self.headers or None,
        )
        try:
            if self.endpoint.uds:
                self.ws = await unix_connect(self.endpoint.uds, uri=url, **options)
            else:
                self.ws = await connect(url, proxy=None if self.endpoint.is_loopback else True, **options)
        except Exception as exc:
            raise _Broken(f"could not open {url}: {exc}") from None
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.ws is not None:
            try:
                await within(self.ws.close(), 5.0)
            except Exception:
                pass

    async def ask(self, frame: Dict[str, Any]) -> Dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        what = f"a {frame.get('type')} frame"
        try:
            await self.ws.send(json.dumps(frame))
            raw = await within(self.ws.recv(), self.timeout_s)
        except asyncio.TimeoutError:
            raise _Broken(f"no answer to {what} within {self.timeout_s:g} s") from None
        except ConnectionClosed as exc:
            # A server may refuse a connection with one error frame and close it (a capacity
            # refusal, say): that frame is the answer, though our send found the socket closed.
            try:
                raw = await within(self.ws.recv(), 1.0)
            except (asyncio.TimeoutError, ConnectionClosed):
                raise _Broken(f"the server closed the connection on {what} ({exc})") from None
        try:
            reply = json.loads(raw)
        except (TypeError, ValueError):
            raise _Broken(f"the answer to {what} is not JSON: {str(raw)[:200]!r}") from None
        if not isinstance(reply, dict):
            raise _Broken(f"the answer to {what} is not a JSON object: {str(raw)[:200]!r}")
        return reply


class _Refused(Exception):
    """The server answered with an error frame where it should not have."""

    def __init__(self, reply: Dict[str, Any]) -> None:
        data = reply.get("data") if isinstance(reply.get("data"), dict) else {}
        self.code = str(data.get("code", ""))
        self.message = str(data.get("message", reply))
        super().__init__(f"{self.message} (code {self.code or 'none'})")


def _observation(reply: Dict[str, Any], what: str) -> Dict[str, Any]:
    """The data of an observation frame; raises :class:`_Refused` or ``ValueError`` (bad shape)."""
    if reply.get("type") == "error":
        raise _Refused(reply)
    if reply.get("type") != "observation":
        raise ValueError(f"{what} was answered with a {reply.get('type')!r} frame, not 'observation'")
    data = reply.get("data")
    problems = []
    if not isinstance(data, dict):
        problems.append("data is not an object")
    else:
        if not isinstance(data.get("observation"), dict):
            problems.append("data.observation is not an object")
        if not isinstance(data.get("done"), bool):
            problems.append("data.done is not a boolean")
        reward = data.get("reward")
        if reward is not None and not isinstance(reward, (int, float)):
            problems.append(f"data.reward is {type(reward).__name__}, not a number or null")
    if problems:
        raise ValueError(f"the observation frame answering {what} is malformed: {'; '.join(problems)}")
    return data  # type: ignore[return-value]


def _comparable(data: Optional[Dict[str, Any]]) -> Any:
    """What must repeat under the same seed: the observation (less its metadata), reward, done."""
    if data is None:
        return None
    observation = {k: v for k, v in (data.get("observation") or {}).items() if k != "metadata"}
    return {"observation": observation, "reward": data.get("reward"), "done": data.get("done")}


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else str(key))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path or 'value'}: {_short(a)} vs {_short(b)}"


def _fields(data: Dict[str, Any]) -> str:
    names = [k for k in data if k != "metadata"]
    return ", ".join(names) if names else "no fields"


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _ServerProbe:
    """Runs the run-time checks against one server, adding them to the report in order."""

    def __init__(
        self,
        base_url: str,
        report: Report,
        hints: _Hints,
        timeout_s: float,
        action: Optional[Dict[str, Any]],
        send_token: bool = False,
    ) -> None:
        from openenv.core.utils import parse_endpoint

        self.endpoint = parse_endpoint(base_url)
        # A server validate started itself (a package) has no token: the user's is not its business.
        self.headers = _auth_headers(self.endpoint) if send_token else {}
        self.report = report
        self.hints = hints
        self.timeout_s = timeout_s
        self.explicit_action = action
        self.schema: Dict[str, Any] = {}
        self.tools: List[Dict[str, Any]] = []
        self.action: Optional[Dict[str, Any]] = None  # a step action the server accepted
        self.main: Optional[_Frames] = None

    def _http(self) -> Any:
        import httpx

        headers = self.headers
        if self.endpoint.uds:
            transport = httpx.AsyncHTTPTransport(uds=self.endpoint.uds)
            return httpx.AsyncClient(
                base_url=self.endpoint.http_url, transport=transport, timeout=self.timeout_s, headers=headers
            )
        return httpx.AsyncClient(
            base_url=self.endpoint.http_url,
            timeout=self.timeout_s,
            trust_env=not self.endpoint.is_loopback,
            headers=headers,
        )

    async def run(self) -> None:
        async with self._http() as http:
            if not await self._health(http):
                _skip_rest(self.report, "the server did not answer GET /health")
                return
            await self._metadata(http)
            await self._schema(http)
            try:
                async with _Frames(self.endpoint, self.timeout_s, self.headers) as main:
                    self.main = main
                    await self._mcp_tools(http)
                    if await self._round_trip():
                        await self._invalid_action()
                        await self._determinism()
                        await self._concurrency()
            except _Broken as exc:
                if self.report.get("ws.round_trip") is None:
                    self.report.add("ws.round_trip", "reset / step / state over /ws", Status.FAILED, str(exc))
        _skip_rest(self.report, "needs a working reset/step round trip over /ws")

    async def _session(self) -> _Frames:
        """The main connection, opened again if an earlier check broke it."""
        assert self.main is not None
        from websockets.protocol import State

        if self.main.ws is None or self.main.ws.state is not State.OPEN:
            await self.main.__aexit__()
            await self.main.__aenter__()
        return self.main

    # --- HTTP ------------------------------------------------------------------------------------

    async def _get(self, http: Any, path: str) -> Tuple[Optional[Any], str]:
        try:
            response = await http.get(path)
        except Exception as exc:
            return None, f"GET {path} failed: {type(exc).__name__}: {exc}"
        if response.status_code != 200:
            hint = _TOKEN_HINT if response.status_code == 401 else ""
            return None, f"GET {path} answered HTTP {response.status_code}: {response.text[:200]}{hint}"
        try:
            return response.json(), ""
        except ValueError:
            return None, f"GET {path} did not answer JSON: {response.text[:200]!r}"

    async def _health(self, http: Any) -> bool:
        body, error = await self._get(http, "/health")
        if error:
            self.report.add("http.health", "GET /health", Status.FAILED, error)
            return False
        if not isinstance(body, dict) or body.get("status") != "healthy":
            self.report.add(
                "http.health", "GET /health", Status.FAILED, f'expected {{"status": "healthy"}}, got {body}'
            )
        else:
            self.report.add("http.health", "GET /health", Status.PASSED, "healthy")
        return True

    async def _metadata(self, http: Any) -> None:
        body, error = await self._get(http, "/metadata")
        missing = [] if error else [k for k in ("name", "description") if not isinstance(body.get(k), str)]
        if error or missing:
            detail = error or f"name and description must be strings; missing or wrong: {', '.join(missing)}"
            self.report.add("http.metadata", "GET /metadata", Status.FAILED, detail)
            return
        if self.report.name is None:
            self.report.name = body["name"]
        version = f" {body['version']}" if body.get("version") else ""
        self.report.add("http.metadata", "GET /metadata", Status.PASSED, f"{body['name']}{version}")

    async def _schema(self, http: Any) -> None:
        body, error = await self._get(http, "/schema")
        if not error:
            bad = [k for k in ("action", "observation", "state") if not _is_object_schema(body.get(k))]
            if bad:
                error = f"{', '.join(bad)} missing or not a JSON schema of an object"
        if error:
            self.report.add("http.schema", "GET /schema", Status.FAILED, error)
            return
        self.schema = body
        parts = []
        for key in ("action", "observation", "state"):
            required = body[key].get("required") or []
            parts.append(
                f"{key} {body[key].get('title', '?')}" + (f" (requires {', '.join(required)})" if required else "")
            )
        self.report.add("http.schema", "GET /schema", Status.PASSED, "; ".join(parts))

    # --- MCP -------------------------------------------------------------------------------------

    def _looks_mcp(self) -> bool:
        if self.hints.mcp:
            return True
        properties = (self.schema.get("action") or {}).get("properties") or {}
        return "tool_name" in properties or (properties.get("type") or {}).get("const") in ("call_tool", "list_tools")

    async def _mcp_tools(self, http: Any) -> None:
        title = "MCP tools/list"
        expected = self._looks_mcp()
        over_http, http_error = await self._tools_over_http(http)
        if not expected:
            if over_http:
                names = ", ".join(t.get("name", "?") for t in over_http)
                self.report.add("mcp.tools", title, Status.PASSED, f"POST /mcp lists {names}")
                self.tools = over_http
            else:
                self.report.add("mcp.tools", title, Status.SKIPPED, "not an MCP environment")
            return
        try:
            over_ws, ws_error = await self._tools_over_ws()
        except _Broken as exc:
            over_ws, ws_error = [], f"the /ws mcp frame failed: {exc}"
        problems = [e for e in (ws_error, http_error) if e]
        if problems:
            self.report.add("mcp.tools", title, Status.FAILED, "; ".join(problems))
            return
        names = [t.get("name") for t in over_ws]
        if names != [t.get("name") for t in over_http]:
            self.report.add(
                "mcp.tools",
                title,
                Status.WARNING,
                f"/ws lists {names} but POST /mcp lists {[t.get('name') for t in over_http]}",
            )
        else:
            joined = ", ".join(str(n) for n in names) or "no tools"
            self.report.add("mcp.tools", title, Status.PASSED, f"{joined} (over /ws and POST /mcp)")
        self.tools = over_ws

    async def _tools_over_http(self, http: Any) -> Tuple[List[Dict[str, Any]], str]:
        try:
            response = await http.post("/mcp", json=_MCP_LIST)
            return _tools_of(response.json(), "POST /mcp")
        except Exception as exc:
            return [], f"POST /mcp tools/list failed: {type(exc).__name__}: {exc}"

    async def _tools_over_ws(self) -> Tuple[List[Dict[str, Any]], str]:
        session = await self._session()
        reply = await session.ask({"type": "mcp", "data": _MCP_LIST})
        if reply.get("type") != "mcp":
            return [], f"the /ws mcp frame was answered with {_short(reply, 200)}"
        return _tools_of(reply.get("data"), "the /ws mcp frame")

    # --- the /ws protocol ------------------------------------------------------------------------

    def _step_action(self) -> Tuple[Dict[str, Any], str]:
        """A step action to send, and where it came from."""
        if self.explicit_action is not None:
            return self.explicit_action, "given with --action"
        action_schema = self.schema.get("action") or {}
        properties = action_schema.get("properties") or {}
        if self.tools and "tool_name" in properties:
            tool = self.tools[0]
            input_schema = tool.get("inputSchema") or tool.get("input_schema") or {}
            action: Dict[str, Any] = {"tool_name": tool.get("name"), "arguments": _example(input_schema, input_schema)}
            if "type" in properties:
                action = {"type": "call_tool", **action}
            return action, f"generated: a call of the tool {tool.get('name')!r}"
        return _example(action_schema, action_schema) or {}, "generated from the action schema"

    async def _round_trip(self) -> bool:
        title = "reset / step / state over /ws"
        session = await self._session()
        action, origin = self._step_action()
        try:
            reset = _observation(await session.ask({"type": "reset", "data": {}}), "reset")
            step_reply = await session.ask({"type": "step", "data": action})
            try:
                step = _observation(step_reply, f"step {_short(action)}")
            except _Refused as exc:
                if self.explicit_action is not None:
                    raise
                self.report.add(
                    "ws.round_trip",
                    title,
                    Status.WARNING,
                    f"reset worked, but the server refused the step action {_short(action)} ({origin}): {exc}; "
                    "pass a valid action with --action '<json>' to run the step checks",
                )
                return False
            state = await session.ask({"type": "state"})
        except (_Refused, ValueError) as exc:
            self.report.add("ws.round_trip", title, Status.FAILED, str(exc))
            return False
        if state.get("type") != "state" or not isinstance(state.get("data"), dict):
            self.report.add(
                "ws.round_trip", title, Status.FAILED, f"a state frame was answered with {_short(state, 200)}"
            )
            return False
        self.action = action
        notes = self._undeclared_fields(reset, "reset_observation") + self._undeclared_fields(step, "observation")
        detail = (
            f"reset -> observation with {_fields(reset['observation'])}; step {_short(action, 80)} ({origin}) -> "
            f"reward {step.get('reward')}, done {step['done']}; state with {_fields(state['data'])}"
        )
        if notes:
            self.report.add("ws.round_trip", title, Status.WARNING, "; ".join(notes) + f". {detail}")
        else:
            self.report.add("ws.round_trip", title, Status.PASSED, detail)
        return True

    def _undeclared_fields(self, data: Dict[str, Any], key: str) -> List[str]:
        schema = self.schema.get(key) or self.schema.get("observation") or {}
        properties = schema.get("properties")
        if not isinstance(properties, dict) or schema.get("additionalProperties") is not False:
            return []
        extra = sorted(k for k in data["observation"] if k not in properties)
        if not extra:
            return []
        return [f"the {key.replace('_', ' ')} has fields /schema does not declare: {', '.join(extra)}"]

    async def _invalid_action(self) -> None:
        title = "Invalid action answered, connection kept"
        assert self.action is not None
        bad, why = _invalid_variant(self.action, self.schema.get("action") or {})
        session = await self._session()
        try:
            reply = await session.ask({"type": "step", "data": bad})
        except _Broken as exc:
            self.report.add(
                "ws.invalid_action",
                title,
                Status.FAILED,
                f"after an invalid action ({why}): {exc}. The server must answer with an error frame and keep "
                "the connection (and its episode) open",
            )
            return
        if reply.get("type") != "error":
            self.report.add(
                "ws.invalid_action",
                title,
                Status.FAILED,
                f"the server accepted an invalid action ({why}) and answered a {reply.get('type')!r} frame; "
                "it must answer with an error frame (code VALIDATION_ERROR)",
            )
            return
        code = (reply.get("data") or {}).get("code")
        try:
            _observation(await session.ask({"type": "step", "data": self.action}), "the step after the error")
        except (_Broken, _Refused, ValueError) as exc:
            self.report.add(
                "ws.invalid_action",
                title,
                Status.FAILED,
                f"the invalid action ({why}) got an error frame ({code}), but a valid step on the same "
                f"connection then failed: {exc}",
            )
            return
        detail = f"{why} -> error frame {code}; a valid step on the same connection then worked"
        if code == "VALIDATION_ERROR":
            self.report.add("ws.invalid_action", title, Status.PASSED, detail)
        else:
            self.report.add("ws.invalid_action", title, Status.WARNING, f"{detail} (VALIDATION_ERROR expected)")

    async def _episode(self, seed: Optional[int]) -> Tuple[Any, Any]:
        """Reset (with ``seed``) and step once; the comparable parts of both answers."""
        session = await self._session()
        data = {"seed": seed} if seed is not None else {}
        reset = _observation(await session.ask({"type": "reset", "data": data}), f"reset {_short(data)}")
        try:
            step = _observation(await session.ask({"type": "step", "data": self.action}), "step")
        except _Refused:  # e.g. the episode ended at reset: compare resets alone
            step = None
        return _comparable(reset), _comparable(step)

    async def _determinism(self) -> None:
        title = "Same seed, same episode"
        try:
            first = await self._episode(SEED)
            second = await self._episode(SEED)
            if first == second:
                other = await self._episode(OTHER_SEED)
                unseeded = [await self._episode(None), await self._episode(None)]
        except (_Refused, ValueError, _Broken) as exc:
            self.report.add("ws.seed_determinism", title, Status.FAILED, f"a seeded reset failed: {exc}")
            return
        if first != second:
            if first[0] != second[0]:
                which, difference = "reset", _first_difference(first[0], second[0])
            else:
                which, difference = "first step after reset", _first_difference(first[1], second[1])
            self.report.add("ws.seed_determinism", title, Status.FAILED, self._unseeded(which, difference))
            return
        if other == first and all(u == first for u in unseeded):
            takes = " (its reset takes no seed)" if self.hints.reset_accepts_seed is False else ""
            self.report.add(
                "ws.seed_determinism",
                title,
                Status.PASSED,
                f"deterministic regardless of the seed{takes}: every reset and first step gave the same observations",
            )
        elif other != first:
            self.report.add(
                "ws.seed_determinism",
                title,
                Status.PASSED,
                f"seed={SEED} twice gave the same reset and first step; seed={OTHER_SEED} a different episode",
            )
        else:
            self.report.add(
                "ws.seed_determinism",
                title,
                Status.PASSED,
                f"seed={SEED} twice gave the same reset and first step (seed={OTHER_SEED} gave the same too)",
            )

    def _unseeded(self, which: str, difference: str) -> str:
        env = self.hints.env_class or "the environment"
        text = (
            f"two episodes started with reset(seed={SEED}) differ at the {which} ({difference}): the environment "
            "is random but does not take its randomness from the seed, so episodes cannot be reproduced. "
        )
        if self.hints.reset_accepts_seed is False:
            return text + (
                f"{env}.reset() has no `seed` parameter, so the server drops the seed before calling it: add "
                "`seed: Optional[int] = None` to reset() and draw every random choice from a generator made "
                "from it (random.Random(seed), numpy.random.default_rng(seed))"
            )
        if self.hints.reset_accepts_seed:
            return text + (
                f"{env}.reset() receives the seed but does not use it for all its randomness: draw every random "
                "choice from a generator made from the seed (random.Random(seed), numpy.random.default_rng(seed)), "
                "not from the global `random` module, time or os.urandom"
            )
        return text + (
            "Make reset(seed=...) create the environment's random generator from the seed "
            "(random.Random(seed), numpy.random.default_rng(seed)) and draw every random choice from it"
        )

    async def _concurrency(self) -> None:
        title = "Concurrent sessions are independent"
        declared = self.hints.max_sessions
        if declared is not None and declared < 2:
            self.report.add(
                "ws.concurrent_sessions",
                title,
                Status.SKIPPED,
                f"the app serves one session at a time (max_concurrent_envs={declared})",
            )
            return
        assert self.action is not None
        try:
            first = await self._session()
            async with _Frames(self.endpoint, self.timeout_s, self.headers) as second:
                reply = await second.ask({"type": "reset", "data": {"seed": SEED}})
                if reply.get("type") == "error" and (reply.get("data") or {}).get("code") == "CAPACITY_REACHED":
                    message = (reply.get("data") or {}).get("message", "")
                    if declared is None:
                        self.report.add(
                            "ws.concurrent_sessions",
                            title,
                            Status.SKIPPED,
                            f"the server serves one session at a time (a second one was refused: {message})",
                        )
                    else:
                        self.report.add(
                            "ws.concurrent_sessions",
                            title,
                            Status.FAILED,
                            f"the app declares max_concurrent_envs={declared}, but a second session was refused: "
                            f"{message}",
                        )
                    return
                _observation(reply, "reset of a second session")
                _observation(await first.ask({"type": "reset", "data": {"seed": SEED}}), "reset")
                before = await second.ask({"type": "state"})
                _observation(await first.ask({"type": "step", "data": self.action}), "step")
                after = await second.ask({"type": "state"})
                stepped = await first.ask({"type": "state"})
                if before != after:
                    self.report.add(
                        "ws.concurrent_sessions",
                        title,
                        Status.FAILED,
                        "stepping one session changed the state of another "
                        f"({_first_difference(before.get('data'), after.get('data'))}): sessions must not share "
                        "an environment instance or module-level state",
                    )
                    return
                both = await asyncio.gather(
                    first.ask({"type": "step", "data": self.action}), second.ask({"type": "step", "data": self.action})
                )
                for reply in both:
                    _observation(reply, "a step run in parallel with another session's")
        except (_Broken, _Refused, ValueError) as exc:
            self.report.add("ws.concurrent_sessions", title, Status.FAILED, f"with two sessions open: {exc}")
            return
        limit = f" (max_concurrent_envs={declared})" if declared else ""
        note = "" if stepped != before else "; the state does not change on step, so this says little"
        self.report.add(
            "ws.concurrent_sessions",
            title,
            Status.PASSED,
            f"two sessions at once{limit}: a step in one left the other's state unchanged, and parallel steps "
            f"were both answered{note}",
        )


def _tools_of(rpc: Any, where: str) -> Tuple[List[Dict[str, Any]], str]:
    if not isinstance(rpc, dict):
        return [], f"{where} answered {_short(rpc, 200)}"
    if rpc.get("error"):
        return [], f"{where} answered a JSON-RPC error: {(rpc['error'] or {}).get('message')}"
    tools = (rpc.get("result") or {}).get("tools")
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("name") for t in tools):
        return [], f"{where} did not answer a list of named tools: {_short(rpc, 200)}"
    return tools, ""


def _is_object_schema(schema: Any) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "object" or isinstance(schema.get("properties"), dict))


def _resolve(schema: Dict[str, Any], root: Dict[str, Any]) -> Dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return target if isinstance(target, dict) else {}
    return schema


def _example(schema: Dict[str, Any], root: Dict[str, Any], depth: int = 0) -> Any:
    """The smallest value that validates against ``schema`` (required fields only)."""
    schema = _resolve(schema, root)
    if depth > 8:
        return None
    if "const" in schema:
        return schema["const"]
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = [o for o in schema.get(key) or [] if _resolve(o, root).get("type") != "null"]
        if options:
            return _example(options[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {name: _example(properties.get(name, {}), root, depth + 1) for name in schema.get("required") or []}
    if kind == "array":
        item = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [_example(item, root, depth + 1) for _ in range(int(schema.get("minItems", 0)))]
    if kind == "string":
        return "a" * int(schema.get("minLength", 0))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        value = low + 1 if "exclusiveMinimum" in schema and "minimum" not in schema else low
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    return None


def _invalid_variant(action: Dict[str, Any], schema: Dict[str, Any]) -> Tuple[Any, str]:
    """An action the server must refuse, and a description of what is wrong with it."""
    if schema.get("additionalProperties") is False:
        return {**action, "openenv_validate_unknown_field": 1}, "an action with an unknown field"
    properties = schema.get("properties") or {}
    for name in schema.get("required") or []:
        kind = (properties.get(name) or {}).get("type")
        if kind in ("string", "integer", "number", "boolean", "array"):
            return {**action, name: {"not": "valid"}}, f"an action whose {name!r} is an object, not {kind}"
    return [action], "an action that is a list, not an object"


def _probe_main(argv: List[str]) -> None:
    """``python -m openenv.cli._validation probe DIR APP``: print what importing found."""
    if len(argv) != 3 or argv[0] != "probe":
        sys.exit("usage: python -m openenv.cli._validation probe PACKAGE_DIR APP")
    result = _probe(argv[1], argv[2])
    sys.stdout.write(_PROBE_MARK + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _probe_main(sys.argv[1:])
