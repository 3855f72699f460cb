"""Faulty requests and faulty environments over HTTP (and the same environments over /ws), each
found by review and reproduced against a live server before it was fixed."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

import httpx
import pytest
from websockets.asyncio.client import connect

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serialization import MAX_JSON_DEPTH

from .conftest import serve
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
