"""The server's settings (openenv.core.env_server.settings): every OPENENV_* variable typed, one
precedence (a variable that is set wins over the argument, the argument over the default), bad
values refused with a message naming the variable; and what a served app does with them."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from openenv.core.env_server.limits import ServerLimits
from openenv.core.env_server.settings import ServerSettings
from openenv.core.env_server.types import ServerMode

from .conftest import counter_app, serve

TOKEN = "a-token-of-enough-length-1234"


def test_defaults_with_nothing_set() -> None:
    settings = ServerSettings.resolve({})
    assert settings.mode is ServerMode.SIMULATION
    assert settings.max_sessions is None and settings.step_timeout_s is None and settings.worker_threads is None
    assert settings.error_details is None and settings.auth_token is None
    assert settings.limits == ServerLimits()
    assert settings.gc_tuning is None  # the runner decides (see below)


@pytest.mark.parametrize(
    ("field", "variable", "raw", "argument", "from_variable"),
    [
        ("mode", "OPENENV_MODE", "production", "simulation", ServerMode.PRODUCTION),
        ("max_sessions", "OPENENV_MAX_SESSIONS", "7", 3, 7),
        ("step_timeout_s", "OPENENV_STEP_TIMEOUT_S", "2.5", 9.0, 2.5),
        ("worker_threads", "OPENENV_WORKER_THREADS", "5", 2, 5),
        ("error_details", "OPENENV_ERROR_DETAILS", "0", True, False),
        ("auth_token", "OPENENV_AUTH_TOKEN", TOKEN, "x" * 20, TOKEN),
        ("session_id_prefix", "OPENENV_SESSION_ID_PREFIX", "w3", "w0", "w3"),
    ],
)
def test_a_variable_that_is_set_wins_over_the_argument(field, variable, raw, argument, from_variable) -> None:
    assert getattr(ServerSettings.resolve({variable: raw}, **{field: argument}), field) == from_variable
    given = getattr(ServerSettings.resolve({}, **{field: argument}), field)  # no variable: the argument
    assert given == (ServerMode(argument) if field == "mode" else argument)
    blank = getattr(ServerSettings.resolve({variable: "  "}, **{field: argument}), field)  # blank: not set
    assert blank == given


def test_limits_follow_the_same_rule_field_by_field() -> None:
    mine = ServerLimits(max_message_mb=4, header_timeout_s=3)
    settings = ServerSettings.resolve({"OPENENV_MAX_MESSAGE_MB": "8"}, limits=mine)
    assert settings.limits.max_message_mb == 8  # the variable wins
    assert settings.limits.header_timeout_s == 3  # the argument's other fields stay
    assert ServerSettings.resolve({}, limits=mine, max_message_size_mb=2).limits.max_message_mb == 2
    assert ServerSettings.resolve({"OPENENV_MAX_MESSAGE_MB": "8"}, max_message_size_mb=2).limits.max_message_mb == 8
    assert ServerLimits.from_env({"OPENENV_HEADER_TIMEOUT_S": "1"}, header_timeout_s=5).header_timeout_s == 1


@pytest.mark.parametrize(
    ("variable", "raw", "says"),
    [
        ("OPENENV_MODE", "staging", "must be one of simulation, production"),
        ("OPENENV_MAX_SESSIONS", "0", "at least 1"),
        ("OPENENV_MAX_SESSIONS", "many", "whole number"),
        ("OPENENV_STEP_TIMEOUT_S", "soon", "number of seconds"),
        ("OPENENV_STEP_TIMEOUT_S", "-1", "at least 0"),
        ("OPENENV_STEP_TIMEOUT_S", "inf", "finite"),
        ("OPENENV_WORKER_THREADS", "1.5", "whole number"),
        ("OPENENV_ERROR_DETAILS", "maybe", "1, 0 or auto"),
        ("OPENENV_LIBRARY_INTERNALS", "off-ish", "1 or 0"),
        ("OPENENV_GC_TUNING", "2", "1 or 0"),
        ("OPENENV_MAX_MESSAGE_MB", "big", "number of MiB"),
        ("OPENENV_MAX_CONNECTIONS_PER_CLIENT", "2.5", "whole number"),
        ("OPENENV_SESSION_ID_PREFIX", "w-1", "no '-'"),
        ("OPENENV_SESSION_ID_PREFIX", "w" * 33, "1 to 32 letters"),
        ("OPENENV_SESSION_ID_PREFIX", "wörker", "letters, digits or underscores"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(variable, raw, says) -> None:
    with pytest.raises(ValueError) as caught:
        ServerSettings.resolve({variable: raw})
    assert variable in str(caught.value) and says in str(caught.value) and repr(raw) in str(caught.value)


def test_bad_arguments_are_refused_as_strictly() -> None:
    with pytest.raises(ValueError, match="max_sessions"):
        ServerSettings.resolve({}, max_sessions=0)
    with pytest.raises(ValueError, match="step_timeout_s"):
        ServerSettings.resolve({}, step_timeout_s=float("nan"))
    with pytest.raises(TypeError, match="error_details"):
        ServerSettings.resolve({}, error_details="yes")
    with pytest.raises(TypeError, match="unknown server setting"):
        ServerSettings.resolve({}, max_sesions=3)


def test_every_session_id_a_server_makes_starts_with_its_prefix(monkeypatch) -> None:
    """What lets the front of several server processes route a call by its session id alone."""
    monkeypatch.setenv("OPENENV_SESSION_ID_PREFIX", "w7")
    with serve(counter_app()) as server:
        with httpx.Client(base_url=server.base_url, timeout=10) as http:
            created = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"})
            session_id = created.json()["result"]["session_id"]
            assert session_id.startswith("w7-") and len(session_id) == len("w7-") + 36
            assert http.get("/state", params={"session_id": session_id}).status_code == 200
            assert http.get("/openenv/capacity").json() == {"active_sessions": 1, "max_sessions": 4}
    monkeypatch.delenv("OPENENV_SESSION_ID_PREFIX")
    with serve(counter_app()) as server:
        created = httpx.post(
            server.base_url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}, timeout=10
        )
        uuid.UUID(created.json()["result"]["session_id"])  # a plain uuid: no prefix


def test_a_step_timeout_of_zero_means_none() -> None:
    assert ServerSettings.resolve({"OPENENV_STEP_TIMEOUT_S": "0"}, step_timeout_s=5).step_timeout_s is None


def test_an_app_reads_its_settings_once_when_made(monkeypatch) -> None:
    """The variables in force when create_app runs decide; changing them later does not."""
    monkeypatch.setenv("OPENENV_MAX_SESSIONS", "3")
    monkeypatch.setenv("OPENENV_STEP_TIMEOUT_S", "4")
    app = counter_app(max_concurrent_envs=2, step_timeout_s=9)
    monkeypatch.setenv("OPENENV_MAX_SESSIONS", "1")
    server = app.state.openenv_server
    assert server.max_concurrent_envs == 3
    assert server.manager.step_timeout_s == 4
    assert server.settings.max_sessions == 3


def test_a_token_from_the_variable_guards_a_live_server(monkeypatch) -> None:
    monkeypatch.setenv("OPENENV_AUTH_TOKEN", TOKEN)
    with serve(counter_app(auth_token="another-token-of-enough-length")) as server:
        refused = httpx.post(server.base_url + "/reset", json={})
        assert refused.status_code == 401
        wrong = httpx.post(
            server.base_url + "/reset", json={}, headers={"Authorization": "Bearer another-token-of-enough-length"}
        )
        assert wrong.status_code == 401
        ok = httpx.post(server.base_url + "/reset", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200, ok.text


def test_production_mode_from_the_variable_drops_the_http_episode_routes(monkeypatch) -> None:
    monkeypatch.setenv("OPENENV_MODE", "production")
    with serve(counter_app(mode="simulation")) as server:
        assert httpx.post(server.base_url + "/reset", json={}).status_code in (404, 405)
        assert json.loads(httpx.get(server.base_url + "/health").text)["status"] == "healthy"


def _served_process_state(**env: str) -> tuple:
    """The garbage collector's thresholds while a counter app is served, and the scheduling
    policy of the thread that runs its steps."""
    import gc
    import os

    import pytest as _pytest

    mp = _pytest.MonkeyPatch()
    try:
        for name, value in env.items():
            mp.setenv(name, value)
        app = counter_app()
    finally:
        mp.undo()
    policy_seen = []

    from .envs import CounterEnv

    original = CounterEnv.step

    def step(self, action, timeout_s=None, request_id=None):  # type: ignore[no-untyped-def]
        policy_seen.append(os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None)
        return original(self, action, timeout_s, request_id)

    CounterEnv.step = step  # type: ignore[method-assign]
    try:
        with serve(app) as server:
            thresholds = gc.get_threshold()
            httpx.post(server.base_url + "/step", json={"action": {"delta": 1}}).raise_for_status()
    finally:
        CounterEnv.step = original  # type: ignore[method-assign]
    return thresholds, policy_seen[0]


def test_process_wide_tuning_is_off_unless_asked_for() -> None:
    import gc
    import os

    before = gc.get_threshold()
    thresholds, policy = _served_process_state()
    assert thresholds == before, "serving changed the garbage collector's thresholds unasked"
    if hasattr(os, "SCHED_BATCH"):
        assert policy == os.sched_getscheduler(0), "a worker ran under another scheduling policy unasked"
    tuned, batch_policy = _served_process_state(OPENENV_GC_TUNING="1", OPENENV_SCHED_BATCH="1")
    assert tuned == (10_000, 10, 10)
    assert gc.get_threshold() == before  # given back once the server stopped
    if hasattr(os, "SCHED_BATCH") and os.sched_getscheduler(0) == os.SCHED_OTHER:
        assert batch_policy == os.SCHED_BATCH


def test_the_runner_tunes_the_process_it_owns_unless_told_not_to(monkeypatch) -> None:
    import gc

    from openenv.core.env_server.serving.runner import owned_process_gc

    before = gc.get_threshold()
    with owned_process_gc(counter_app()):  # what run_server and `openenv serve` wrap serving in
        assert gc.get_threshold() == (10_000, 10, 10)
    assert gc.get_threshold() == before
    monkeypatch.setenv("OPENENV_GC_TUNING", "0")
    with owned_process_gc(counter_app()):
        assert gc.get_threshold() == before
    monkeypatch.setenv("OPENENV_GC_TUNING", "1")  # the app does it itself, while it is served
    with owned_process_gc(counter_app()):
        assert gc.get_threshold() == before
