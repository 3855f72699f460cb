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
from .envs import CounterAction, CounterClient, CounterEnv, CounterObservation, LegacyToolEnv, ToolsOnlyEnv

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
    caplog.set_level(logging.WARNING)  # a ValueError is a client's mistake: a warning (test_error_logging)
    with serve(counter_app()) as server:
        data = await _ws_failure(server, REMOTE)
        assert data["code"] == "EXECUTION_ERROR" and data["exception"] == "ValueError"
        assert TEXT not in data["message"] and data["message"].startswith("ValueError raised in the environment")
        assert TEXT in _logged(caplog, INCIDENT.search(data["message"]).group(1)).getMessage()

        body = _http_failure(server, REMOTE)
        assert TEXT not in body["detail"] and INCIDENT.search(body["detail"])
        assert TEXT in _logged(caplog, INCIDENT.search(body["detail"]).group(1)).getMessage()

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

    def scope(client, **headers):
        return {"client": client, "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}

    here = ("127.0.0.1", 5)
    local = [
        scope(None),
        scope(here),
        scope(("127.8.0.1", 5)),
        scope(("::1", 5)),
        scope(("::ffff:127.0.0.1", 5)),
        scope(("testclient", 1)),
        scope(here, x_forwarded_for="127.0.0.1"),
        scope(None, x_forwarded_for="127.0.0.1, ::1", x_real_ip="127.0.0.2"),
        scope(here, forwarded='for=127.0.0.1;proto=http, for="[::1]:4711"'),
    ]
    remote = [
        scope(("203.0.113.7", 5)),
        scope(("10.0.0.2", 5)),
        scope(("0.0.0.0", 5)),
        scope(("::ffff:10.0.0.2", 5)),
        scope(("localhost.evil", 5)),
        scope(None, x_forwarded_for="203.0.113.7"),  # a proxy in front of a Unix socket
        scope(here, x_forwarded_for="127.0.0.1, 203.0.113.7"),  # a client's own header, then the proxy's
        scope(here, x_forwarded_for="testclient"),
        scope(here, x_real_ip="198.51.100.1"),
        scope(here, forwarded='for="[2001:db8::1]:4711"'),
        scope(here, forwarded="for=192.0.2.60;proto=http;by=203.0.113.43"),
        scope(here, forwarded="for=unknown"),
        scope(("testclient", 1), forwarded="for=_hidden"),
    ]
    assert [peer_is_local(s) for s in local] == [True] * len(local)
    assert [peer_is_local(s) for s in remote] == [False] * len(remote)


async def test_a_proxy_uvicorn_does_not_trust_still_names_its_client() -> None:
    """A proxy in front of a Unix socket, or on a loopback address other than uvicorn's trusted
    127.0.0.1 and ::1 (a sidecar's 127.0.0.6), sends X-Forwarded-For that uvicorn ignores."""
    with serve(counter_app(), uds=True) as server:
        async with CounterClient(base_url=server.base_url, headers=REMOTE) as client:
            await client.reset()
            with pytest.raises(EnvironmentExecutionError) as raised:
                await client.step(CounterAction(delta=1, fail=True))
            assert TEXT not in str(raised.value) and INCIDENT.search(str(raised.value))
    with serve(counter_app()) as server:
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.6")) as sidecar:
            for headers, shown in ((REMOTE, False), (None, True)):
                response = sidecar.post(server.base_url + "/step", json={"action": {"fail": True}}, headers=headers)
                assert (response.json()["detail"] == TEXT) is shown


async def test_the_environment_variable_overrides_the_apps_choice(monkeypatch) -> None:
    monkeypatch.setenv("OPENENV_ERROR_DETAILS", "0")  # what `openenv serve --host 0.0.0.0` sets
    with serve(counter_app(error_details=True)) as server:
        assert TEXT not in _http_failure(server)["detail"]
    monkeypatch.setenv("OPENENV_ERROR_DETAILS", "auto")
    with serve(counter_app(error_details=True)) as server:
        assert TEXT not in _http_failure(server, REMOTE)["detail"]
        assert _http_failure(server)["detail"] == TEXT


def test_openenvs_own_messages_reach_remote_clients_as_json_rpc() -> None:
    """A session that cannot be made over POST /mcp initialize (an environment not safe for two
    sessions, found when the first is built) is a JSON-RPC error in OpenEnv's words."""

    class Unsafe(CounterEnv):
        SUPPORTS_CONCURRENT_SESSIONS = False

    def factory():  # a function: the class is known only once it has built an instance
        return Unsafe()

    app = create_app(factory, CounterAction, CounterObservation, env_name="unsafe", max_concurrent_envs=2)
    with serve(app) as server:
        request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        response = httpx.post(server.base_url + "/mcp", json=request, headers=REMOTE)
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["code"] == -32000 and "SUPPORTS_CONCURRENT_SESSIONS" in error["message"]


class _UncheckedObservationEnv(CounterEnv):
    def step(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Any:
        return CounterObservation.model_construct(value=1, done="token=s3cr3t", reward=None, metadata={})


def test_an_invalid_observation_is_the_environments_error_not_the_clients() -> None:
    app = create_app(_UncheckedObservationEnv, CounterAction, CounterObservation, env_name="unchecked")
    with serve(app) as server:
        for headers, shown in ((REMOTE, False), (None, True)):
            response = httpx.post(server.base_url + "/step", json={"action": {"delta": 1}}, headers=headers)
            assert response.status_code == 500 and response.json()["code"] == "EXECUTION_ERROR"
            assert ("s3cr3t" in response.json()["detail"]) is shown
            assert response.json()["detail"].startswith("ValidationError")


def _failing_listing_env():
    from fastmcp import FastMCP
    from fastmcp.server.middleware import Middleware

    class FailingListing(Middleware):
        async def on_list_tools(self, context, call_next):
            raise RuntimeError("cannot read /srv/keys/tools.yaml")

    class Listing(ToolsOnlyEnv):
        def __init__(self) -> None:
            super().__init__(FastMCP("listing", middleware=[FailingListing()]))

    return Listing


async def test_a_failing_tool_listing_says_what_failed_only_to_local_clients() -> None:
    from openenv.core.env_server.mcp_types import ListToolsAction

    listing = _failing_listing_env()
    used_directly = await listing().step_async(ListToolsAction())  # no request answered: the log has it
    assert used_directly.metadata["error_type"] == "list_tools_failed"
    assert "/srv/keys" not in used_directly.metadata["error"] and INCIDENT.search(used_directly.metadata["error"])
    with serve(create_app(listing, CallToolAction, CallToolObservation, env_name="listing")) as server:
        for headers, shown in ((REMOTE, False), (None, True)):
            async with connect(server.base_url.replace("http", "ws") + "/ws", additional_headers=headers) as ws:
                await ws.send(json.dumps({"type": "step", "data": {"type": "list_tools"}}))
                metadata = json.loads(await ws.recv())["data"]["observation"]["metadata"]
            http = httpx.post(server.base_url + "/step", json={"action": {"type": "list_tools"}}, headers=headers)
            for seen in (metadata, http.json()["observation"]["metadata"]):
                assert seen["error_type"] == "list_tools_failed"
                assert ("/srv/keys" in seen["error"]) is shown and (INCIDENT.search(seen["error"]) is None) is shown


class _Wrapper(CounterEnv):
    """A sync environment (run in a worker thread, which has not the request's context) that asks
    an inner MCP environment for its tools."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _failing_listing_env()()

    def step(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Any:
        from openenv.core.env_server.mcp_types import ListToolsAction

        listed = self.inner.step(ListToolsAction())
        return CounterObservation(value=0, metadata=dict(listed.metadata))


def test_an_answer_built_outside_the_requests_context_keeps_the_text_in_the_log() -> None:
    with serve(create_app(_Wrapper, CounterAction, CounterObservation, env_name="wrapper")) as server:
        for headers in (REMOTE, None):
            response = httpx.post(server.base_url + "/step", json={"action": {"delta": 1}}, headers=headers)
            error = response.json()["observation"]["metadata"]["error"]
            assert "/srv/keys" not in error and INCIDENT.search(error)


class _OwnOpenEnvError(__import__("openenv.core.env_server.exceptions", fromlist=["x"]).OpenEnvError):
    """An environment's own subclass of OpenEnv's base exception: its text is the environment's."""


class _RaisingOwnError(CounterEnv):
    def step(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Any:
        raise _OwnOpenEnvError("cannot reach postgres://admin:hunter2@db")


def test_only_openenvs_own_exception_classes_pass_as_they_are() -> None:
    with serve(create_app(_RaisingOwnError, CounterAction, CounterObservation, env_name="own")) as server:
        remote = _http_failure(server, REMOTE)["detail"]
        assert "hunter2" not in remote and remote.startswith("_OwnOpenEnvError raised in the environment")
        assert "hunter2" in _http_failure(server)["detail"]
