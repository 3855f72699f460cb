"""The HTTP routes, against a live server."""

from __future__ import annotations

import httpx
import pytest

from openenv.core.env_server.exceptions import ConcurrencyConfigurationError
from openenv.core.env_server.http_server import HTTPEnvServer, create_app, create_fastapi_app
from openenv.core.env_server.types import ConcurrencyConfig
from openenv.core.generic_client import GenericEnvClient

from .conftest import counter_app, serve, until
from .envs import TRACKER, CounterAction, CounterEnv, CounterObservation, SerialEnv, make_counter


@pytest.fixture
def http(counter_server):
    with httpx.Client(base_url=counter_server.base_url, timeout=10) as client:
        yield client


def test_health(http):
    response = http.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "healthy"}


def test_capacity_counts_the_open_sessions(counter_server):
    url = counter_server.base_url
    assert httpx.get(url + "/openenv/capacity").json() == {
        "active_sessions": 0,
        "max_sessions": 4,
    }
    with GenericEnvClient(base_url=url).sync() as env:
        env.reset()
        assert httpx.get(url + "/openenv/capacity").json()["active_sessions"] == 1


def test_schema_has_action_observation_state_and_reset_observation(http):
    body = http.get("/schema").json()
    assert set(body) == {"action", "observation", "state", "reset_observation"}
    assert body["action"]["additionalProperties"] is False
    assert set(body["action"]["properties"]) == {"metadata", "delta", "sleep_s", "fail"}
    assert body["state"]["additionalProperties"] is True
    assert body["reset_observation"] == body["observation"]


def test_metadata_defaults_to_the_class_name(http):
    assert http.get("/metadata").json() == {
        "name": "CounterEnv",
        "description": "CounterEnv environment",
        "readme_content": None,
        "version": "1.0.0",
        "author": None,
        "documentation_url": None,
    }


def test_openapi_has_a_string_version_and_all_simulation_routes(http):
    spec = http.get("/openapi.json").json()
    assert spec["info"]["version"] == "1.0.0"
    assert spec["info"]["title"] == "OpenEnv Environment HTTP API"
    assert {"/health", "/schema", "/metadata", "/reset", "/step", "/state", "/mcp", "/list_environments"} <= set(
        spec["paths"]
    )
    assert http.get("/docs").status_code == 200


def test_production_mode_has_no_http_reset_step_state():
    with serve(counter_app(mode="production")) as server, httpx.Client(base_url=server.base_url) as http:
        paths = set(http.get("/openapi.json").json()["paths"])
        assert not {"/reset", "/step", "/state"} & paths
        assert {"/health", "/schema", "/metadata", "/mcp"} <= paths
        assert http.post("/reset", json={}).status_code in (404, 405)


def test_invalid_mode_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="simulation, production"):
        counter_app(mode="staging")


def test_http_reset_response_shape(http):
    body = http.post("/reset", json={"seed": 2}).json()
    assert body == {
        "observation": {"metadata": {"seed": 2}, "value": 2},
        "reward": 0.0,
        "done": False,
        "metadata": {"seed": 2},
    }
    body = http.post("/reset").json()  # no body at all
    assert body == {"observation": {"metadata": {}, "value": 0}, "reward": 0.0, "done": False, "metadata": None}


async def test_http_step_coerces_reward_to_float_and_is_stateless(http):
    body = http.post("/step", json={"action": {"delta": 3}}).json()
    assert body == {"observation": {"metadata": {}, "value": 3}, "reward": 3.0, "done": False, "metadata": None}
    assert isinstance(body["reward"], float)
    # a second call gets a fresh environment
    assert http.post("/step", json={"action": {"delta": 3}}).json()["observation"]["value"] == 3
    # every throw-away environment is closed, soon after its answer (in a worker)
    await until(lambda: TRACKER.alive == 0)


def test_http_step_forwards_accepted_extras(http):
    body = http.post("/step", json={"action": {"delta": 1}, "request_id": "r-1", "unknown": 5}).json()
    assert body["metadata"] == {"request_id": "r-1"}


@pytest.mark.parametrize(
    "body, loc",
    [
        ({"seed": -1}, ["body", "seed"]),
        ({"episode_id": "x" * 256}, ["body", "episode_id"]),
    ],
)
def test_http_reset_validation_is_422(http, body, loc):
    response = http.post("/reset", json=body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == loc


@pytest.mark.parametrize(
    "body, loc",
    [
        ({}, ["body", "action"]),
        ({"action": {"delta": 1}, "timeout_s": 0}, ["body", "timeout_s"]),
        ({"action": {"delta": 1}, "request_id": "x" * 256}, ["body", "request_id"]),
    ],
)
def test_http_step_request_validation_is_422(http, body, loc):
    response = http.post("/step", json=body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == loc


def test_http_step_action_errors_are_422_relative_to_the_action(http):
    response = http.post("/step", json={"action": {"bogus": 1}})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail[0]["type"] == "extra_forbidden"
    assert detail[0]["loc"] == ["bogus"]


def test_http_env_exception_is_500_with_a_code(http):
    response = http.post("/step", json={"action": {"fail": True}})
    assert response.status_code == 500
    assert response.json() == {"detail": "the step failed on purpose", "code": "EXECUTION_ERROR"}
    assert http.get("/health").status_code == 200


def test_http_state_is_a_fresh_environment_state(http):
    assert http.get("/state").json() == {"episode_id": None, "step_count": 0, "value": 0}


def test_http_calls_can_target_a_session_for_stateful_episodes(http):
    session_id = http.post("/mcp", json={"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}).json()[
        "result"
    ]["session_id"]
    http.post("/reset", json={"session_id": session_id, "start": 4})
    http.post("/step", json={"session_id": session_id, "action": {"delta": 2}})
    assert http.get("/state", params={"session_id": session_id}).json() == {
        "episode_id": "episode",
        "step_count": 1,
        "value": 6,
    }
    assert http.get("/state", params={"session_id": "nope"}).json()["code"] == "SESSION_ERROR"


def test_task_api_routes(http):
    assert http.get("/list_environments").json() == ["counter"]
    assert http.get("/counter/splits").json() == [
        {"name": "train", "type": "train"},
        {"name": "holdout", "type": "validation"},
    ]
    assert http.get("/COUNTER/splits").status_code == 200  # case-insensitive
    assert http.post("/counter/num_tasks", json={"split": "train"}).json() == {"num_tasks": 3}
    assert http.post("/counter/task", json={"split": "train", "index": 1}).json() == {
        "task": {"split": "train", "index": 1}
    }
    assert http.post("/counter/task_range", json={"split": "train", "start": 1}).json() == {
        "tasks": [{"split": "train", "index": 1}, {"split": "train", "index": 2}]
    }


def test_task_api_errors(http):
    assert http.get("/other/splits").json() == {"detail": "unknown environment 'other'"}
    assert http.get("/other/splits").status_code == 404
    response = http.post("/counter/task", json={"split": "train", "index": 9})
    assert (response.status_code, response.json()) == (400, {"detail": "Invalid task index"})
    response = http.post("/counter/tasks", json={"split": "train"})
    assert (response.status_code, response.json()) == (
        501,
        {"detail": "list_tasks is not supported for this environment"},
    )
    assert http.post("/counter/tasks", json={"split": "train", "extra": 1}).status_code == 422


def test_an_instance_is_refused_with_advice():
    with pytest.raises(TypeError, match=r"^env must be a callable .* not an instance \(e\.g\., CounterEnv\(\)\)"):
        HTTPEnvServer(CounterEnv(), CounterAction, CounterObservation)


def test_both_concurrency_arguments_are_refused():
    with pytest.raises(ValueError, match="either"):
        HTTPEnvServer(
            CounterEnv, CounterAction, CounterObservation, max_concurrent_envs=2, concurrency_config=ConcurrencyConfig()
        )


def test_concurrency_needs_the_env_to_declare_it():
    with pytest.raises(ConcurrencyConfigurationError, match="SUPPORTS_CONCURRENT_SESSIONS"):
        create_app(SerialEnv, CounterAction, CounterObservation, max_concurrent_envs=4)
    # one session is always fine
    create_fastapi_app(SerialEnv, CounterAction, CounterObservation)


def test_factory_functions_are_not_called_at_construction():
    server = HTTPEnvServer(make_counter, CounterAction, CounterObservation, max_concurrent_envs=4)
    assert TRACKER.created == 0
    assert server.env_name == "make_counter"
    assert server.get_capacity_status().model_dump() == {"active_sessions": 0, "max_sessions": 4}
