"""``openenv validate`` against real packages, real sandboxes and real servers.

Broken packages are copies of ``fixtures/dice_env`` (a complete, valid package) with one thing
broken, so each test shows that one defect is found and reported.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from fastapi import FastAPI, WebSocket

from openenv.cli.__main__ import main
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.env_server.types import Action, Observation, State

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "envs" / "echo_env"
DICE = Path(__file__).resolve().parent / "fixtures" / "dice_env"
OPENENV = Path(sys.executable).parent / "openenv"

needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)

RUNTIME_CHECKS = [
    "server.start",
    "http.health",
    "http.metadata",
    "http.schema",
    "ws.round_trip",
    "ws.invalid_action",
    "ws.seed_determinism",
    "ws.snapshot",
    "ws.concurrent_sessions",
]


def validate(capsys: Any, *args: str) -> Tuple[int, str, str]:
    code = main(["validate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def validate_json(capsys: Any, *args: str) -> Tuple[int, Dict[str, Any]]:
    code, out, _ = validate(capsys, *args, "--json")
    return code, json.loads(out)  # stdout holds the report and nothing else


def statuses(report: Dict[str, Any]) -> Dict[str, str]:
    return {check["id"]: check["status"] for check in report["checks"]}


def detail(report: Dict[str, Any], id: str) -> str:
    return next(check["detail"] for check in report["checks"] if check["id"] == id)


def dice_copy(tmp_path: Path, files: Optional[Dict[str, Optional[str]]] = None) -> Path:
    """A copy of the dice package; ``files`` replaces (or, with None, deletes) some of its files."""
    target = tmp_path / "dice_env"
    shutil.copytree(DICE, target, ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in (files or {}).items():
        if text is None:
            (target / name).unlink()
        else:
            (target / name).write_text(textwrap.dedent(text))
    return target


def manifest_without(field: str) -> str:
    lines = (DICE / "openenv.yaml").read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith(f"{field}:"))


# --- whole packages in the sandbox ---------------------------------------------------------------


@needs_bwrap
def test_the_echo_env_passes_static_and_runtime_checks_in_a_sandbox(capsys):
    code, report = validate_json(capsys, str(ECHO))
    assert code == 0 and report["passed"] is True
    assert report["kind"] == "package" and report["name"] == "echo_env"
    found = statuses(report)
    for id in [*RUNTIME_CHECKS, "mcp.tools", "manifest.fields", "app.import", "app.create_app", "package.client"]:
        assert found[id] == "passed", (id, detail(report, id))
    assert "echo_message" in detail(report, "mcp.tools")
    assert detail(report, "server.start").startswith("ready in a sandbox")
    # its reset ignores the seed, but it is not random: that passes, with a note
    assert "regardless of the seed" in detail(report, "ws.seed_determinism")
    assert found["package.dockerfile"] == "passed" and found["package.layout"] == "passed"
    assert report["summary"] == {"passed": len(found), "warning": 0, "failed": 0, "skipped": 0}


@needs_bwrap
def test_a_complete_package_with_a_seeded_random_env_passes_without_warnings(capsys):
    code, report = validate_json(capsys, str(DICE))
    assert code == 0
    assert report["summary"] == {"passed": 20, "warning": 0, "failed": 0, "skipped": 1}
    assert statuses(report)["mcp.tools"] == "skipped"  # not an MCP environment
    assert "seed=4321 a different episode" in detail(report, "ws.seed_determinism")
    assert "max_concurrent_envs=4" in detail(report, "ws.concurrent_sessions")


@needs_bwrap
def test_the_human_report_is_a_table_with_a_summary_and_progress_on_stderr(capsys):
    code, out, err = validate(capsys, str(DICE))
    assert code == 0
    for id in RUNTIME_CHECKS:
        assert id in out
    assert "20 passed, 0 failed, 0 warnings, 1 skipped: PASSED" in out
    assert "Starting dice_env in a sandbox" in err and "Stopping the server" in err
    lines = out.splitlines()
    assert not any(ch in out for ch in "┏┃│└━"), out  # no box to wrap badly
    for id in RUNTIME_CHECKS:  # one check a line: its mark, its id, its detail
        assert any(line.startswith("✓ passed") and f" {id} " in line for line in lines), id


UNSEEDED = """\
    import random
    from typing import Any, Optional

    from openenv.core.env_server.interfaces import Environment
    from models import DiceAction, DiceObservation, DiceState


    class DiceEnvironment(Environment[DiceAction, DiceObservation, DiceState]):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = DiceState()

        def reset(self, {params}) -> DiceObservation:
            dice = [random.randint(1, 1_000_000) for _ in range(3)]  # the global generator: seed or not
            self._state = DiceState(step_count=0, dice=dice)
            return DiceObservation(dice=dice)

        def step(self, action: DiceAction, **kwargs: Any) -> DiceObservation:
            self._state.step_count += 1
            return DiceObservation(dice=self._state.dice)

        @property
        def state(self) -> DiceState:
            return self._state
"""


@needs_bwrap
@pytest.mark.parametrize(
    "params, why",
    [
        ("seed: Optional[int] = None, **kwargs: Any", "receives the seed but does not use it for all its randomness"),
        ("episode_id: Optional[str] = None", "has no `seed` parameter, so the server drops the seed"),
    ],
    ids=["seed-unused", "no-seed-parameter"],
)
def test_an_env_whose_reset_ignores_the_seed_fails_and_the_report_says_why(capsys, tmp_path, params, why):
    package = dice_copy(tmp_path, {"server/dice_environment.py": UNSEEDED.format(params=params)})
    code, report = validate_json(capsys, str(package))
    assert code == 1 and report["passed"] is False
    assert statuses(report)["ws.seed_determinism"] == "failed"
    text = detail(report, "ws.seed_determinism")
    assert "two episodes started with reset(seed=1234) differ at the reset (observation.dice[0]:" in text
    assert "DiceEnvironment.reset() " + why in text
    assert "random.Random(seed)" in text
    # nothing else is wrong with it
    assert [c["id"] for c in report["checks"] if c["status"] == "failed"] == ["ws.seed_determinism"]


SLOW_STEP = """\
    import time
    from typing import Any, Optional

    from openenv.core.env_server.interfaces import Environment
    from models import DiceAction, DiceObservation, DiceState


    class DiceEnvironment(Environment[DiceAction, DiceObservation, DiceState]):
        def __init__(self) -> None:
            super().__init__()
            self._state = DiceState()

        def reset(self, seed: Optional[int] = None, **kwargs: Any) -> DiceObservation:
            return DiceObservation(dice=[1, 2, 3])

        def step(self, action: DiceAction, **kwargs: Any) -> DiceObservation:
            time.sleep(120)
            return DiceObservation(dice=[1, 2, 3])

        @property
        def state(self) -> DiceState:
            return self._state
"""


def _popen_taking_ctrl_c(args: List[str], **options: Any) -> subprocess.Popen:
    """Popen whose child takes SIGINT even when these tests run with it ignored.

    A command started with ``&`` from a script (no job control) ignores SIGINT and passes that on
    to what it starts; Python keeps an inherited SIG_IGN, as it should. A handler set here is reset
    to the default in the child on exec, so the child's Python installs its own Ctrl-C handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **options)
    finally:
        signal.signal(signal.SIGINT, previous)


def _signal_masks(pid: int) -> str:
    """The process's blocked, ignored and caught signal masks, as /proc shows them."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return str(exc)
    return ", ".join(line.replace("\t", " ") for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def _server_dirs(owner: int) -> List[Path]:
    found = []
    for directory in Path("/tmp").glob("openenv-server-*"):
        try:
            if int((directory / "owner").read_text()) == owner:
                found.append(directory)
        except (OSError, ValueError):
            continue
    return found


@needs_bwrap
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_validation_stops_the_server_it_started(tmp_path, sig):
    app = (DICE / "server" / "app.py").read_text().replace("max_concurrent_envs=4", "max_concurrent_envs=1")
    package = dice_copy(tmp_path, {"server/dice_environment.py": SLOW_STEP, "server/app.py": app})
    process = _popen_taking_ctrl_c(
        [str(OPENENV), "validate", str(package), "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints where every thread is
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:  # the step now sleeps in the server
            if "checking it" in line:
                break
        time.sleep(0.5)
        assert len(_server_dirs(process.pid)) == 1
        signals = _signal_masks(process.pid)
        process.send_signal(sig)
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            # Tell a lost signal from a lost cancellation: a second Ctrl-C interrupts asyncio.run at once.
            process.send_signal(signal.SIGINT)
            try:
                second = f"a second SIGINT ended it with {process.wait(5)}"
            except subprocess.TimeoutExpired:
                second = "a second SIGINT did not end it either"
                process.send_signal(signal.SIGABRT)
                process.wait(10)
            pytest.fail(
                f"validate did not exit within 30 s of {sig.name} ({signals}); {second}; "
                f"stderr:\n{process.stderr.read()}"
            )
        assert code == 130, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert _server_dirs(process.pid) == []


# --- static defects ------------------------------------------------------------------------------


def test_a_missing_manifest_field_fails_with_the_field_named(capsys, tmp_path):
    package = dice_copy(tmp_path, {"openenv.yaml": manifest_without("name")})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 1 and report["passed"] is False
    found = statuses(report)
    assert found["manifest.fields"] == "failed"
    assert "required field(s) missing: name (would default to the directory name 'dice_env')" in detail(
        report, "manifest.fields"
    )
    assert found["manifest.name"] == "skipped"
    assert report["summary"]["failed"] == 1
    assert report["summary"]["passed"] == sum(s == "passed" for s in found.values())
    assert "server.start" not in found  # --no-runtime


def test_missing_recommended_fields_only_warn(capsys, tmp_path):
    package = dice_copy(tmp_path, {"openenv.yaml": manifest_without("description")})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 0
    assert statuses(report)["manifest.fields"] == "warning"
    assert "recommended field(s) missing: description" in detail(report, "manifest.fields")


def test_a_manifest_that_is_not_yaml_fails(capsys, tmp_path):
    package = dice_copy(tmp_path, {"openenv.yaml": "name: [dice_env\n"})
    code, report = validate_json(capsys, str(package))
    assert code == 1
    found = statuses(report)
    assert found["manifest.valid"] == "failed" and "not valid YAML" in detail(report, "manifest.valid")
    # nothing says which app to serve: the app and run-time checks are skipped, not guessed
    assert found["app.import"] == "skipped" and found["server.start"] == "skipped"


def test_a_directory_without_a_manifest_fails(capsys, tmp_path):
    code, report = validate_json(capsys, str(tmp_path), "--no-runtime")
    assert code == 1
    assert statuses(report)["manifest.present"] == "failed"
    assert "no openenv.yaml" in detail(report, "manifest.present")


def test_a_name_that_is_not_an_identifier_fails(capsys, tmp_path):
    manifest = (DICE / "openenv.yaml").read_text().replace("name: dice_env", "name: dice-env")
    package = dice_copy(tmp_path, {"openenv.yaml": manifest})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 1
    assert statuses(report)["manifest.name"] == "failed"
    assert "'dice-env' is not a valid Python identifier" in detail(report, "manifest.name")


BROKEN_IMPORT = """\
    import openenv_validate_missing_dependency  # noqa: F401

    from server.dice_environment import DiceEnvironment
"""


def test_an_app_that_does_not_import_fails_and_the_report_shows_the_import_error(capsys, tmp_path):
    package = dice_copy(tmp_path, {"server/app.py": BROKEN_IMPORT})
    code, out, _ = validate(capsys, str(package))
    assert code == 1
    assert "✗ failed" in out and "app.import" in out
    assert "ModuleNotFoundError: No module named 'openenv_validate_missing_dependency'" in out
    assert 'File "' in out and "server/app.py" in out  # the traceback, not only its last line
    assert "FAILED" in out.splitlines()[-1]


def test_a_dependency_that_is_not_installed_is_named_with_the_command_that_installs_it(capsys, tmp_path):
    pyproject = (DICE / "pyproject.toml").read_text()
    declared = pyproject.replace('["openenv>=0.10"]', '["openenv>=0.10", "openenv-validate-missing-dependency>=2"]')
    assert declared != pyproject
    package = dice_copy(tmp_path, {"server/app.py": BROKEN_IMPORT, "pyproject.toml": declared})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 1
    why = detail(report, "app.import")
    assert "No module named 'openenv_validate_missing_dependency'" in why
    assert "from its dependency openenv-validate-missing-dependency>=2" in why
    assert f"install -e {package}" in why


def test_an_installed_package_is_validated_by_its_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where no directory is called echo
    code, report = validate_json(capsys, "echo", "--no-runtime")
    assert code == 0, report
    assert Path(report["target"]) == ECHO.resolve() and report["name"] == "echo_env"


def test_an_app_that_does_not_import_skips_the_runtime_checks(capsys, tmp_path):
    package = dice_copy(tmp_path, {"server/app.py": BROKEN_IMPORT})
    code, report = validate_json(capsys, str(package))
    assert code == 1
    found = statuses(report)
    assert found["app.import"] == "failed"
    assert all(found[id] == "skipped" for id in RUNTIME_CHECKS)
    assert detail(report, "server.start") == "the app did not import (see app.import)"


def test_an_app_that_hangs_while_importing_is_stopped_at_the_timeout(capsys, tmp_path):
    package = dice_copy(tmp_path, {"server/app.py": "import time\ntime.sleep(60)\n"})
    started = time.monotonic()
    code, report = validate_json(capsys, str(package), "--timeout", "2")
    assert time.monotonic() - started < 20
    assert code == 1
    assert "importing took longer than 2 s" in detail(report, "app.import")


def test_an_asgi_app_not_built_by_create_app_fails(capsys, tmp_path):
    plain = """\
        async def app(scope, receive, send):
            pass
    """
    package = dice_copy(tmp_path, {"server/app.py": plain})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 1
    assert statuses(report)["app.import"] == "passed"
    assert statuses(report)["app.create_app"] == "failed"
    assert "not one built by openenv's create_app" in detail(report, "app.create_app")


def test_models_that_are_not_openenv_models_fail(capsys, tmp_path):
    app = """\
        from pydantic import BaseModel

        from openenv.core.env_server.http_server import create_app
        from server.dice_environment import DiceEnvironment
        from models import DiceObservation


        class LooseAction(BaseModel):
            reroll: list


        app = create_app(DiceEnvironment, LooseAction, DiceObservation)
    """
    package = dice_copy(tmp_path, {"server/app.py": app})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 1
    assert statuses(report)["app.models"] == "failed"
    assert "action class LooseAction is not a subclass of openenv's Action" in detail(report, "app.models")


def test_a_client_module_without_an_env_client_fails(capsys, tmp_path):
    package = dice_copy(tmp_path, {"client.py": "class DiceEnv:\n    pass\n", "__init__.py": ""})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 1
    assert statuses(report)["package.client"] == "failed"
    assert "defines no subclass of openenv.core.env_client.EnvClient" in detail(report, "package.client")


def test_a_package_without_client_module_fails(capsys, tmp_path):
    package = dice_copy(tmp_path, {"client.py": None, "__init__.py": ""})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 1
    assert "no client.py" in detail(report, "package.client")


def test_a_pyproject_that_does_not_depend_on_openenv_fails(capsys, tmp_path):
    pyproject = (DICE / "pyproject.toml").read_text().replace('dependencies = ["openenv>=0.10"]', "dependencies = []")
    package = dice_copy(tmp_path, {"pyproject.toml": pyproject})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 1
    assert statuses(report)["package.pyproject"] == "failed"
    assert "does not depend on openenv" in detail(report, "package.pyproject")


def test_pyproject_conventions_only_warn(capsys, tmp_path):
    pyproject = (
        (DICE / "pyproject.toml")
        .read_text()
        .replace('name = "openenv-dice-env"', 'name = "dice"')
        .replace('dice_env = ["openenv.yaml", "README.md"]', 'dice_env = ["README.md"]')
    )
    package = dice_copy(tmp_path, {"pyproject.toml": pyproject})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 0
    assert statuses(report)["package.pyproject"] == "warning"
    text = detail(report, "package.pyproject")
    assert "does not start with 'openenv-'" in text and "openenv.yaml is not in [tool.setuptools.package-data]" in text


def test_a_package_without_a_dockerfile_passes_with_a_warning(capsys, tmp_path):
    package = dice_copy(tmp_path, {"server/Dockerfile": None})
    code, report = validate_json(capsys, str(package), "--no-runtime")
    assert code == 0 and report["passed"] is True
    assert statuses(report)["package.dockerfile"] == "warning"


# --- usage ---------------------------------------------------------------------------------------


def test_a_target_that_does_not_exist_is_a_usage_error(capsys, tmp_path):
    code, out, err = validate(capsys, str(tmp_path / "nowhere"))
    assert code == 2 and out == ""
    assert "is not a directory" in err


@pytest.mark.parametrize("action", ["{not json", "[1, 2]"])
def test_an_action_that_is_not_a_json_object_is_a_usage_error(capsys, action):
    code, _, err = validate(capsys, str(DICE), "--action", action)
    assert code == 2
    assert "--action" in err


# --- servers given by URL ------------------------------------------------------------------------


class CoinAction(Action):
    flips: int = 1


class CoinObservation(Observation):
    heads: int = 0


class CoinState(State):
    heads: int = 0


class CoinEnv(Environment[CoinAction, CoinObservation, CoinState]):
    """Counts heads in coin flips drawn from a generator seeded at reset."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True

    def __init__(self) -> None:
        import random

        super().__init__()
        self._random = random.Random()
        self._state = CoinState()

    def reset(self, seed: Optional[int] = None, **kwargs: Any) -> CoinObservation:
        import random

        self._random = random.Random(seed)
        self._state = CoinState(step_count=0, heads=0)
        return CoinObservation(heads=0)

    def step(self, action: CoinAction, **kwargs: Any) -> CoinObservation:
        self._state.step_count += 1
        self._state.heads += sum(self._random.random() < 0.5 for _ in range(action.flips))
        return CoinObservation(heads=self._state.heads)

    @property
    def state(self) -> CoinState:
        return self._state


def coin_app(max_concurrent_envs: int) -> FastAPI:
    return create_app(
        CoinEnv, CoinAction, CoinObservation, state_cls=CoinState, max_concurrent_envs=max_concurrent_envs
    )


def test_a_running_server_given_by_url_passes_the_runtime_checks(capsys):
    with BackgroundServer(coin_app(4)) as server:
        code, report = validate_json(capsys, server.base_url)
    assert code == 0 and report["passed"] is True
    assert report["kind"] == "url" and report["name"] == "CoinEnv"
    found = statuses(report)
    assert "manifest.present" not in found and "server.start" not in found  # nothing to read or start
    for id in RUNTIME_CHECKS[1:]:
        assert found[id] == "passed", (id, detail(report, id))
    # the reset observation is the same for every seed, but the first step shows the seed at work
    assert "seed=4321 a different episode" in detail(report, "ws.seed_determinism")
    assert found["mcp.tools"] == "skipped"


def test_a_server_that_wants_a_token_is_validated_with_openenv_auth_token(capsys, monkeypatch):
    token = "validate-token-0123456789abcdef"
    with BackgroundServer(
        create_app(CoinEnv, CoinAction, CoinObservation, state_cls=CoinState, auth_token=token)
    ) as server:
        monkeypatch.delenv("OPENENV_AUTH_TOKEN", raising=False)
        code, report = validate_json(capsys, server.base_url)
        assert code == 1 and statuses(report)["http.health"] == "passed"  # /health is open
        assert "HTTP 401" in detail(report, "http.metadata") and "set OPENENV_AUTH_TOKEN" in detail(
            report, "http.metadata"
        )
        monkeypatch.setenv("OPENENV_AUTH_TOKEN", token)
        code, report = validate_json(capsys, server.base_url)
    assert code == 0 and report["passed"] is True, report


def test_a_package_validate_serves_itself_is_not_sent_the_users_token(tmp_path, capsys, monkeypatch):
    """The package is the code under test (the sandbox exists for it): the user's token is not
    its business. Its app here refuses, on every route, any request carrying a token."""
    app = (DICE / "server" / "app.py").read_text() + textwrap.dedent(
        """

        @app.middleware("http")
        async def refuse_tokens(request, call_next):
            from fastapi.responses import JSONResponse

            if "authorization" in request.headers:
                return JSONResponse({"detail": "a token reached the package"}, status_code=418)
            return await call_next(request)
        """
    )
    package = dice_copy(tmp_path, {"server/app.py": app})
    monkeypatch.setenv("OPENENV_AUTH_TOKEN", "users-own-token-0123456789abcdef")
    code, report = validate_json(capsys, str(package), "--no-sandbox")
    assert code == 0 and report["passed"] is True, report


def test_the_token_is_sent_only_to_servers_on_this_machine(monkeypatch):
    from openenv.cli._validation import _auth_headers
    from openenv.core.utils import parse_endpoint

    monkeypatch.setenv("OPENENV_AUTH_TOKEN", "validate-token-0123456789abcdef")
    sent = {"Authorization": "Bearer validate-token-0123456789abcdef"}
    for url in ("http://127.0.0.1:8000", "http://localhost:1", "unix:///tmp/env.sock", "http://[::1]:9"):
        assert _auth_headers(parse_endpoint(url)) == sent, url
    for url in ("https://someone.hf.space", "http://192.0.2.7:8000", "http://env.localhost:8000"):
        assert _auth_headers(parse_endpoint(url)) == {}, url


def test_an_explicit_action_is_the_one_stepped(capsys):
    with BackgroundServer(coin_app(4)) as server:
        code, report = validate_json(capsys, server.base_url, "--action", '{"flips": 5}')
    assert code == 0
    assert '{"flips": 5} (given with --action)' in detail(report, "ws.round_trip")


def test_a_server_with_one_session_at_a_time_skips_the_concurrency_check(capsys):
    with BackgroundServer(coin_app(1)) as server:
        code, report = validate_json(capsys, server.base_url)
    assert code == 0
    assert statuses(report)["ws.concurrent_sessions"] == "skipped"
    assert "one session at a time (a second one was refused: Server at capacity" in detail(
        report, "ws.concurrent_sessions"
    )


def test_a_server_that_is_not_there_fails_its_health_check_and_skips_the_rest(capsys):
    with BackgroundServer(coin_app(1)) as server:
        url = server.base_url  # a port that was just closed
    code, report = validate_json(capsys, url, "--timeout", "5")
    assert code == 1
    found = statuses(report)
    assert found["http.health"] == "failed" and "GET /health failed" in detail(report, "http.health")
    assert all(found[id] == "skipped" for id in RUNTIME_CHECKS[2:])


def sloppy_server_app() -> FastAPI:
    """A hand-written server that speaks the /ws protocol but hangs up on a bad action."""
    app = FastAPI()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}

    @app.get("/health")
    def health() -> Dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata")
    def metadata() -> Dict[str, str]:
        return {"name": "sloppy", "description": "drops the connection on bad input"}

    @app.get("/schema")
    def schema_route() -> Dict[str, Any]:
        return {"action": schema, "observation": {"type": "object", "properties": {}}, "state": {"type": "object"}}

    @app.websocket("/ws")
    async def ws(socket: WebSocket) -> None:
        await socket.accept()
        while True:
            frame = json.loads(await socket.receive_text())
            if frame["type"] == "state":
                await socket.send_json({"type": "state", "data": {"step_count": 0}})
            elif set(frame.get("data") or {}) - {"n", "seed"}:
                await socket.close()
                return
            else:
                await socket.send_json({"type": "observation", "data": {"observation": {}, "reward": 0, "done": False}})

    return app


def test_a_server_that_hangs_up_on_an_invalid_action_fails(capsys):
    with BackgroundServer(sloppy_server_app()) as server:
        code, report = validate_json(capsys, server.base_url)
    assert code == 1
    found = statuses(report)
    assert found["ws.round_trip"] == "passed"
    assert found["ws.invalid_action"] == "failed"
    assert "the server closed the connection" in detail(report, "ws.invalid_action")
    assert "must answer with an error frame and keep the connection" in detail(report, "ws.invalid_action")


def test_the_installed_command_exits_with_the_report_verdict(tmp_path):
    package = dice_copy(tmp_path, {"openenv.yaml": manifest_without("app")})
    done = subprocess.run(
        [str(OPENENV), "validate", str(package), "--no-runtime", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert statuses(report)["manifest.fields"] == "failed"
    assert "app (would default to 'server.app:app')" in detail(report, "manifest.fields")
