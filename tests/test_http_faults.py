"""Faulty requests and faulty environments over HTTP (and the same environments over /ws), each
found by review and reproduced against a live server before it was fixed."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

import httpx
import pydantic
import pytest
from websockets.asyncio.client import connect

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serialization import MAX_JSON_DEPTH

from .conftest import counter_app, serve, until
from .envs import CounterAction, CounterEnv, CounterObservation, CounterState


class FaultAction(CounterAction):
    mode: str = "ok"


class FaultEnv(CounterEnv):
    """``mode`` picks a fault: a NaN reward, infinite metadata, an invalid observation."""

    def step(self, action: FaultAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:  # type: ignore[override]
        if action.mode == "nan":
            return CounterObservation(value=1, reward=math.nan, metadata={"score": math.nan, "best": math.inf})
        if action.mode == "bad_observation":
            return CounterObservation(value="not a number")  # a ValidationError inside the environment
        return super().step(action)


def fault_app(**kwargs: Any) -> Any:
    return create_app(FaultEnv, FaultAction, CounterObservation, state_cls=CounterState, **kwargs)


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def fault_server():
    with serve(fault_app(max_message_size_mb=1)) as server:
        yield server


@pytest.fixture
def http(fault_server):
    with httpx.Client(base_url=fault_server.base_url, timeout=30) as client:
        yield client


@pytest.mark.parametrize(
    "body",
    [
        '{"seed": NaN}',
        '{"seed": -Infinity}',
        '{"action": {}, "timeout_s": NaN}',
        '{"action": {"mode": NaN}}',
        '{"action": {"mode": "ok", "bogus": Infinity}}',
    ],
)
def test_invalid_input_holding_nan_is_a_json_422_and_the_connection_keeps_working(http, body):
    route = "/reset" if '"seed"' in body else "/step"
    response = http.post(route, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/json"
    detail = strict_json(response.text)["detail"]
    assert detail and all("loc" in error for error in detail)
    assert http.get("/health").status_code == 200  # the same keep-alive connection


async def test_nan_and_infinity_in_observations_are_written_as_null_over_http_and_ws(http, fault_server):
    response = http.post("/step", json={"action": {"mode": "nan"}})
    assert response.status_code == 200
    body = strict_json(response.text)
    assert body["reward"] is None and body["metadata"] == {"score": None, "best": None}
    async with connect(fault_server.base_url.replace("http://", "ws://") + "/ws") as ws:
        await ws.send('{"type":"reset"}')
        await ws.recv()
        await ws.send('{"type":"step","data":{"mode":"nan"}}')
        frame = strict_json(await ws.recv())["data"]
        assert frame["reward"] is None
        assert frame["metadata"] == frame["observation"]["metadata"] == {"score": None, "best": None}
        await ws.send('{"type":"step","data":{"mode":NaN}}')  # the error frame echoes the input
        error = strict_json(await ws.recv())["data"]
        assert error["code"] == "VALIDATION_ERROR" and error["errors"][0]["input"] is None


async def test_an_invalid_observation_built_by_the_environment_is_its_error_not_the_clients(http, fault_server):
    response = http.post("/step", json={"action": {"mode": "bad_observation"}})
    assert response.status_code == 500
    assert response.json()["code"] == "EXECUTION_ERROR"
    async with connect(fault_server.base_url.replace("http://", "ws://") + "/ws") as ws:
        await ws.send('{"type":"reset"}')
        await ws.recv()
        await ws.send('{"type":"step","data":{"mode":"bad_observation"}}')
        error = json.loads(await ws.recv())["data"]
        assert error["code"] == "EXECUTION_ERROR" and error["exception"] == "ValidationError"
        await ws.send('{"type":"step","data":{}}')
        assert json.loads(await ws.recv())["data"]["observation"]["value"] == 1


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"x": value}
    return value


@pytest.mark.parametrize("route", ["/reset", "/step", "/mcp"])
def test_request_bodies_past_the_message_limit_are_refused_before_they_are_read(http, route):
    blob = "x" * (2 * 1024 * 1024)  # the server's limit is 1 MiB
    body = json.dumps({"action": {"metadata": {"blob": blob}}, "seed": 1})
    response = http.post(route, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    if route == "/mcp":
        assert response.json()["error"]["code"] == -32600
    else:
        assert response.json()["code"] == "MESSAGE_TOO_LARGE"

    def chunks():  # no Content-Length: the server counts what arrives
        for start in range(0, len(body), 256 * 1024):
            yield body[start : start + 256 * 1024].encode()

    assert http.post(route, content=chunks(), headers={"content-type": "application/json"}).status_code == 413
    assert http.post("/step", json={"action": {"delta": 2}}).json()["observation"]["value"] == 2


@pytest.mark.parametrize("route", ["/reset", "/step"])
def test_request_bodies_nested_past_the_json_depth_limit_are_a_400_like_ws_frames(http, route):
    body = (
        {"action": {"metadata": _deep(MAX_JSON_DEPTH + 5)}}
        if route == "/step"
        else {"extra": _deep(MAX_JSON_DEPTH + 5)}
    )
    response = http.post(route, json=body)
    assert response.status_code == 400
    assert response.json()["code"] == "INVALID_JSON" and "nesting" in response.json()["detail"]
    shallow = {"action": {"metadata": _deep(MAX_JSON_DEPTH - 5)}}
    assert http.post("/step", json=shallow).status_code == 200


async def test_the_state_of_an_async_environment_is_read_off_the_loop_under_the_step_timeout():
    import asyncio
    import threading
    import time

    from .envs import AsyncCounterEnv

    class SlowStateEnv(AsyncCounterEnv):
        entered = threading.Event()

        @property
        def state(self) -> CounterState:
            SlowStateEnv.entered.set()
            time.sleep(0.6)  # a blocking property on an environment whose steps are async
            return super().state

    app = create_app(SlowStateEnv, CounterAction, CounterObservation, state_cls=CounterState, step_timeout_s=0.2)
    with serve(app) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            state = asyncio.ensure_future(http.get("/state"))
            await until(SlowStateEnv.entered.is_set)  # the property now blocks its thread
            began = time.monotonic()
            assert (await http.get("/health")).status_code == 200
            assert time.monotonic() - began < 0.3  # the loop was not blocked by the property
            response = await state
            assert response.status_code == 504 and response.json()["code"] == "TIMEOUT"


class OddEnv(CounterEnv):
    """Task methods and metadata of the wrong kinds; a step taking **kwargs."""

    def list_splits(self) -> Any:
        return None

    def num_tasks(self, split: str) -> Any:
        return "three"

    def get_task(self, split: str, index: int) -> Any:
        return object() if split == "object" else {"score": math.nan}

    def get_task_range(self, split: str, start: Optional[int] = None, stop: Optional[int] = None) -> Any:
        return 5

    def get_metadata(self) -> Any:
        return {"name": "odd", "description": "metadata given as a dict"}

    def step(self, action: CounterAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:  # type: ignore[override]
        observation = super().step(action)
        observation.metadata = {"extras": sorted(kwargs)}
        return observation

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CounterObservation:  # type: ignore[override]
        observation = super().reset(seed=seed, episode_id=episode_id)
        observation.metadata = {"extras": sorted(kwargs)}
        return observation


@pytest.fixture(scope="module")
def odd_http():
    app = create_app(OddEnv, CounterAction, CounterObservation, env_name="odd", state_cls=CounterState)
    with serve(app) as server, httpx.Client(base_url=server.base_url, timeout=10) as client:
        yield client


@pytest.mark.parametrize(
    ("method", "route", "body", "complaint"),
    [
        ("get", "/odd/splits", None, "list_splits() returned NoneType, not a list"),
        ("post", "/odd/num_tasks", {"split": "train"}, "num_tasks() returned str, not an int"),
        ("post", "/odd/task_range", {"split": "train"}, "get_task_range() returned int, not a list"),
        ("post", "/odd/task", {"split": "object", "index": 0}, "not JSON serializable"),
    ],
)
def test_task_methods_returning_the_wrong_kind_are_a_json_500(odd_http, method, route, body, complaint):
    response = odd_http.request(method, route, json=body)
    assert response.status_code == 500
    assert response.json()["code"] == "EXECUTION_ERROR" and complaint in response.json()["detail"]


def test_a_task_holding_nan_is_sent_with_null(odd_http):
    response = odd_http.post("/odd/task", json={"split": "train", "index": 0})
    assert response.status_code == 200 and strict_json(response.text) == {"task": {"score": None}}


def test_metadata_given_as_a_dict_is_served(odd_http):
    body = odd_http.get("/metadata").json()
    assert (body["name"], body["description"]) == ("odd", "metadata given as a dict")


def test_body_keys_naming_positional_parameters_are_not_passed_to_kwargs(odd_http):
    response = odd_http.post("/step", json={"action": {}, "self": 1, "action_extra": 2})
    assert response.status_code == 200, response.text
    assert response.json()["metadata"] == {"extras": ["action_extra"]}
    response = odd_http.post("/reset", json={"self": 1, "flavour": "x"})
    assert response.status_code == 200, response.text
    assert response.json()["metadata"] == {"extras": ["flavour"]}


async def test_stateless_calls_wait_a_bounded_time_for_a_slot_behind_a_slow_one(monkeypatch):
    import asyncio

    from openenv.core.env_server import sessions

    from .envs import TRACKER

    monkeypatch.setattr(sessions, "TEMPORARY_WAIT_S", 0.3)
    with serve(counter_app(max_concurrent_envs=1)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            slow = asyncio.ensure_future(http.post("/step", json={"action": {"sleep_s": 1.0}}))
            await until(lambda: TRACKER.threads)  # the slow step runs, holding the only slot
            waiting = await http.post("/step", json={"action": {}})
            assert waiting.status_code == 503 and waiting.json()["code"] == "CAPACITY_REACHED"
            assert "stateless" in waiting.json()["detail"]
            assert (await slow).status_code == 200
            assert (await http.post("/step", json={"action": {}})).status_code == 200


async def test_a_client_leaving_a_stateless_call_frees_its_slot_at_once():
    import time

    from .envs import TRACKER

    with serve(counter_app(max_concurrent_envs=1)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/step", json={"action": {"sleep_s": 1.0}}, timeout=0.2)  # then hangs up
            began = time.monotonic()
            response = await http.post("/step", json={"action": {"delta": 3}})
            assert response.status_code == 200 and response.json()["observation"]["value"] == 3
            assert time.monotonic() - began < 0.6  # not queued behind the abandoned call
            await until(lambda: TRACKER.alive == 0)  # the abandoned call's environment closed once it returned
            assert TRACKER.created == 2


async def test_a_client_leaving_a_slow_call_on_a_single_thread_environment_delays_others_not_refuses_them():
    import asyncio

    from .envs import SingleThreadEnv

    with serve(counter_app(SingleThreadEnv, max_concurrent_envs=1)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/step", json={"action": {"sleep_s": 0.8}}, timeout=0.2)
            response = await http.post("/step", json={"action": {"delta": 2}})  # waits for the thread
            assert response.status_code == 200 and response.json()["observation"]["value"] == 2
            await asyncio.sleep(0)


async def test_a_client_leaving_a_call_on_a_named_session_lets_it_finish():
    import asyncio

    from .envs import AsyncCounterEnv

    class TwoPhaseEnv(AsyncCounterEnv):
        async def step_async(self, action: CounterAction, timeout_s: Optional[float] = None) -> CounterObservation:  # type: ignore[override]
            self._state.value += 100  # half a move: undone below, unless interrupted
            await asyncio.sleep(action.sleep_s)
            self._state.value -= 100
            return self.step(action.model_copy(update={"sleep_s": 0.0}))

    app = create_app(TwoPhaseEnv, CounterAction, CounterObservation, state_cls=CounterState, max_concurrent_envs=2)
    with serve(app) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            create = {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}
            session_id = (await http.post("/mcp", json=create)).json()["result"]["session_id"]
            await http.post("/reset", json={"session_id": session_id})
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/step", json={"session_id": session_id, "action": {"sleep_s": 0.6}}, timeout=0.2)

            def state() -> dict:  # mid-step: value 100, step_count 0
                return httpx.get(server.base_url + "/state", params={"session_id": session_id}, timeout=5).json()

            await until(lambda: state().get("step_count") == 1)
            final = state()
            assert (final["value"], final["step_count"]) == (1, 1)  # the step ran to its end


class OddBody(pydantic.BaseModel):
    n: int

    @pydantic.field_validator("n")
    @classmethod
    def odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError("n must be odd")
        return value


def test_a_validator_error_on_an_apps_own_route_is_still_a_422():
    app = counter_app()

    @app.post("/odd")
    async def odd(body: OddBody) -> dict:
        return {"n": body.n}

    with serve(app) as server, httpx.Client(base_url=server.base_url, timeout=10) as http:
        response = http.post("/odd", json={"n": 2})
        assert response.status_code == 422 and "n must be odd" in response.text
        assert http.post("/odd", json={"n": 3}).json() == {"n": 3}


def test_task_methods_may_return_numpy_arrays_and_integers():
    np = pytest.importorskip("numpy")

    class NumpyTasks(CounterEnv):
        def num_tasks(self, split: str) -> Any:
            return np.int64(3)

        def list_tasks(self, split: str) -> Any:
            return np.arange(3)

        def get_task_range(self, split: str, start: Optional[int] = None, stop: Optional[int] = None) -> Any:
            return np.arange(3)[start:stop]

    app = create_app(NumpyTasks, CounterAction, CounterObservation, env_name="np", state_cls=CounterState)
    with serve(app) as server, httpx.Client(base_url=server.base_url, timeout=10) as http:
        assert http.post("/np/num_tasks", json={"split": "train"}).json() == {"num_tasks": 3}
        assert http.post("/np/tasks", json={"split": "train"}).json()["tasks"] == [0, 1, 2]
        assert http.post("/np/task_range", json={"split": "train", "start": 1}).json() == {"tasks": [1, 2]}


@pytest.mark.parametrize("levels", [250, 400])
def test_bodies_nested_past_the_json_parsers_own_limit_are_refused_too(http, levels):
    response = http.post("/step", json={"action": {"metadata": _deep(levels)}})
    assert response.status_code == 400 and response.json()["code"] == "INVALID_JSON"


def test_a_deeply_nested_mcp_body_is_a_json_rpc_parse_error():
    with serve(fault_app()) as server, httpx.Client(base_url=server.base_url, timeout=10) as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": _deep(MAX_JSON_DEPTH + 5)}
        response = http.post("/mcp", json=body)
        assert response.status_code == 200 and response.json()["error"]["code"] == -32700
