"""Error answers carry an environment's exception text only for clients on this machine (spec
§14.19), over /ws, HTTP and /mcp, on live servers. A client elsewhere is simulated the way a
reverse proxy makes one: uvicorn takes ``X-Forwarded-For`` from a proxy on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Optional

import httpx
import pytest
from websockets.asyncio.client import connect

from openenv.core.client_errors import EnvironmentExecutionError
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from .conftest import counter_app, serve
from .envs import CounterAction, CounterClient, LegacyToolEnv

REMOTE = {"X-Forwarded-For": "203.0.113.7"}  # a documentation address: not this machine
TEXT = "the step failed on purpose"  # what CounterEnv's failing step raises
INCIDENT = re.compile(r"incident ([0-9a-f]{8})")


class _ExplodingToolEnv(LegacyToolEnv):
    def step(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Any:
        if isinstance(action, CallToolAction) and action.tool_name == "explode":
            raise RuntimeError("cannot open /srv/keys/private.pem")
        return super().step(action, timeout_s, **kwargs)


def _tool_app(**kwargs: Any) -> Any:
    return create_app(_ExplodingToolEnv, CallToolAction, CallToolObservation, env_name="exploding", **kwargs)


async def _ws_failure(server: Any, headers: Optional[dict] = None) -> dict:
    """The error frame of a failing step; the same socket then steps again."""
    async with connect(server.base_url.replace("http", "ws") + "/ws", additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "reset", "data": {}}))
        assert json.loads(await ws.recv())["type"] == "observation"
        await ws.send(json.dumps({"type": "step", "data": {"delta": 1, "fail": True}}))
        frame = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "step", "data": {"delta": 2}}))
        assert json.loads(await ws.recv())["data"]["observation"]["value"] == 2
    assert frame["type"] == "error"
    return frame["data"]


def _http_failure(server: Any, headers: Optional[dict] = None) -> dict:
    response = httpx.post(server.base_url + "/step", json={"action": {"fail": True}}, headers=headers)
    assert response.status_code == 500
    body = response.json()
    assert body["code"] == "EXECUTION_ERROR"
    return body


def _mcp_failure(server: Any, headers: Optional[dict] = None) -> dict:
    request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "explode", "arguments": {}}}
    response = httpx.post(server.base_url + "/mcp", json=request, headers=headers)
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == 7 and body["error"]["code"] == -32603
    return body["error"]


def _logged(caplog: pytest.LogCaptureFixture, incident: str) -> logging.LogRecord:
    (record,) = [r for r in caplog.records if incident in r.getMessage()]
    return record


async def test_a_remote_client_gets_the_type_and_an_incident_the_log_gets_the_text(caplog) -> None:
    caplog.set_level(logging.ERROR)
    with serve(counter_app()) as server:
        data = await _ws_failure(server, REMOTE)
        assert data["code"] == "EXECUTION_ERROR" and data["exception"] == "ValueError"
        assert TEXT not in data["message"] and data["message"].startswith("ValueError raised in the environment")
        record = _logged(caplog, INCIDENT.search(data["message"]).group(1))
        assert record.exc_info is not None and TEXT in str(record.exc_info[1])

        body = _http_failure(server, REMOTE)
        assert TEXT not in body["detail"] and INCIDENT.search(body["detail"])
        assert _logged(caplog, INCIDENT.search(body["detail"]).group(1)).exc_info is not None

        async with CounterClient(base_url=server.base_url, headers=REMOTE) as client:
            await client.reset()
            with pytest.raises(EnvironmentExecutionError) as raised:
                await client.step(CounterAction(delta=1, fail=True))
            assert TEXT not in str(raised.value) and INCIDENT.search(str(raised.value))
            assert (await client.step(CounterAction(delta=3))).observation.value == 3

    with serve(_tool_app()) as server:
        error = _mcp_failure(server, REMOTE)
        assert "private.pem" not in error["message"] and error["message"].startswith("RuntimeError raised")
        assert "private.pem" in str(_logged(caplog, INCIDENT.search(error["message"]).group(1)).exc_info[1])


@pytest.mark.parametrize("uds", [False, True], ids=["loopback", "unix_socket"])
async def test_a_client_on_this_machine_gets_the_text(uds: bool) -> None:
    with serve(counter_app(), uds=uds) as server:
        async with CounterClient(base_url=server.base_url) as client:
            await client.reset()
            with pytest.raises(EnvironmentExecutionError) as raised:
                await client.step(CounterAction(delta=1, fail=True))
            assert TEXT in str(raised.value) and "incident" not in str(raised.value)
        if not uds:
            data = await _ws_failure(server)
            assert data["message"] == TEXT and data["exception"] == "ValueError"
            assert _http_failure(server)["detail"] == TEXT
    if not uds:
        with serve(_tool_app()) as server:
            assert _mcp_failure(server)["message"] == "cannot open /srv/keys/private.pem"


async def test_the_setting_decides_for_every_client(monkeypatch) -> None:
    with serve(counter_app(error_details=False)) as server:
        assert TEXT not in (await _ws_failure(server))["message"]
        assert TEXT not in _http_failure(server)["detail"]
    with serve(counter_app(error_details=True)) as server:
        assert (await _ws_failure(server, REMOTE))["message"] == TEXT
        assert _http_failure(server, REMOTE)["detail"] == TEXT
    monkeypatch.setenv("OPENENV_ERROR_DETAILS", "0")
    with serve(_tool_app()) as server:
        assert "private.pem" not in _mcp_failure(server)["message"]
    monkeypatch.setenv("OPENENV_ERROR_DETAILS", "1")
    with serve(_tool_app()) as server:
        assert "private.pem" in _mcp_failure(server, REMOTE)["message"]
    monkeypatch.setenv("OPENENV_ERROR_DETAILS", "auto")
    with serve(counter_app()) as server:
        assert TEXT not in (await _ws_failure(server, REMOTE))["message"]
        assert (await _ws_failure(server))["message"] == TEXT


def test_a_bad_setting_is_refused_when_the_app_is_built(monkeypatch) -> None:
    monkeypatch.setenv("OPENENV_ERROR_DETAILS", "sometimes")
    with pytest.raises(ValueError, match="OPENENV_ERROR_DETAILS must be 1, 0 or auto"):
        counter_app()
    monkeypatch.delenv("OPENENV_ERROR_DETAILS")
    with pytest.raises(TypeError, match="error_details must be True, False or None"):
        counter_app(error_details="yes")


def test_local_addresses() -> None:
    from openenv.core.env_server.error_details import peer_is_local

    local = [None, ("127.0.0.1", 5), ("127.8.0.1", 5), ("::1", 5), ("::ffff:127.0.0.1", 5), ("testclient", 1)]
    remote = [("203.0.113.7", 5), ("10.0.0.2", 5), ("0.0.0.0", 5), ("::ffff:10.0.0.2", 5), ("localhost.evil", 5)]
    assert [peer_is_local({"client": c}) for c in local] == [True] * len(local)
    assert [peer_is_local({"client": c}) for c in remote] == [False] * len(remote)
