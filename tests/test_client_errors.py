"""What a client's exceptions say when it cannot connect or its action is refused: the cause in
words a user can act on, against real servers (or none) on 127.0.0.1 and Unix sockets."""

from __future__ import annotations

import pickle
import socket
import time

import pytest
from echo_env import EchoEnv
from fastapi import WebSocket

from openenv.core.client_errors import ActionValidationError, AuthenticationError
from openenv.core.generic_client import GenericEnvClient

from .conftest import counter_app, serve
from .envs import CounterClient


def _closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_a_refused_connection_says_no_server_answers_and_asks_whether_it_runs():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ConnectionError) as failed:
        async with CounterClient(base_url=url, connect_timeout_s=5) as env:
            await env.reset()
    assert str(failed.value) == f"No server answers at {url.replace('http', 'ws')}/ws (is it running?)"


async def test_a_refused_mcp_session_says_the_same_for_the_mcp_route():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ConnectionError) as failed:
        async with EchoEnv(base_url=url, connect_timeout_s=5, mode="production") as env:
            await env.reset()
    assert str(failed.value) == (f"Could not create an MCP session: no server answers at {url}/mcp (is it running?)"), (
        failed.value
    )


def _unresolvable_host() -> str:
    """A host name no resolver knows (RFC 6761 reserves ``.invalid``); skips the test where no
    resolver answers at all (then a lookup fails with EAI_AGAIN, which is worth a retry)."""
    host = "no-such-host.invalid"
    try:
        socket.getaddrinfo(host, 80)
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_AGAIN:
            pytest.skip("no name server answers here: a failed lookup could pass, so it is retried")
        return host
    pytest.skip(f"{host} resolves here")


CLIENTS = {"GenericEnvClient": GenericEnvClient, "EchoEnv (MCP)": EchoEnv}


async def _connect_failure(cls, url: str) -> ConnectionError:
    """Connect with the default reconnect_timeout_s (30 s); the failure must come well before it."""
    started = time.monotonic()
    with pytest.raises(ConnectionError) as failed:
        async with cls(base_url=url) as env:
            await env.reset()
    assert time.monotonic() - started < 5, f"{cls.__name__} took {time.monotonic() - started:.1f} s to fail on {url}"
    return failed.value


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_a_host_that_does_not_resolve_fails_at_once_naming_it(client):
    host = _unresolvable_host()
    text = str(await _connect_failure(CLIENTS[client], f"http://{host}:8000"))
    assert f"annot resolve the host name {host!r} of " in text and f"{host}:8000/" in text, text
    assert "check the URL" in text, text


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_https_against_a_plain_server_fails_at_once_saying_so(client):
    with serve(counter_app()) as server:
        url = f"https://127.0.0.1:{server.port}"
        text = str(await _connect_failure(CLIENTS[client], url))
    assert "TLS handshake with " in text and f"127.0.0.1:{server.port}/" in text, text
    assert "if the server there speaks plain HTTP, use http:// (not https://)" in text, text


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_a_refused_first_connection_fails_at_once(client):
    url = f"http://127.0.0.1:{_closed_port()}"
    text = str(await _connect_failure(CLIENTS[client], url))
    assert "no server answers at " in text.lower() and url.split("://")[1] in text, text


async def test_a_missing_unix_socket_keeps_its_path_in_the_message(tmp_path):
    path = tmp_path / "gone.sock"
    with pytest.raises(ConnectionError) as failed:
        async with GenericEnvClient(base_url=f"unix://{path}", connect_timeout_s=5) as env:
            await env.reset()
    assert f"No server socket at {path} (is the server running?" in str(failed.value)


async def test_a_wrong_path_prefix_names_the_route_not_a_token():
    with serve(counter_app()) as server:
        client = GenericEnvClient(base_url=server.base_url + "/v1/envs/counter", connect_timeout_s=5)
        with pytest.raises(ConnectionError) as failed:
            await client.reset()
        await client.close()
    assert not isinstance(failed.value, AuthenticationError)
    text = str(failed.value)
    assert "has no such route; check the URL's path" in text and "/v1/envs/counter/ws" in text, text


async def test_an_invalid_action_names_each_failing_field_in_the_message():
    with serve(counter_app()) as server:
        async with GenericEnvClient(base_url=server.base_url) as env:
            await env.reset()
            with pytest.raises(ActionValidationError) as failed:
                await env.step({"delta": "four", "sleep_s": "long", "colour": "red"})
            text = str(failed.value)
            assert "delta: Input should be a valid integer" in text, text
            assert "sleep_s: Input should be a valid number" in text, text
            assert "colour: Extra inputs are not permitted" in text, text
            assert len(failed.value.errors) == 3  # the structured list is still there
            assert str(pickle.loads(pickle.dumps(failed.value))) == text
            assert (await env.step({"delta": 2})).observation["value"] == 2  # the session goes on


def test_a_long_list_of_failures_is_cut_short_and_points_at_errors():
    errors = [{"loc": ["action", f"f{i}"], "msg": "Field required"} for i in range(8)]
    error = ActionValidationError("Invalid message", details={"errors": errors})
    assert str(error).endswith("f4: Field required; 3 more in .errors"), str(error)


async def test_the_apps_own_websocket_routes_still_answer_beside_the_404(caplog):
    app = counter_app()

    @app.websocket("/custom")
    async def custom(websocket: WebSocket):  # a route the environment's author added to the app
        await websocket.accept()
        await websocket.send_text("custom route")
        await websocket.close()

    from websockets.asyncio.client import connect

    with serve(app) as server:
        async with connect(server.base_url.replace("http", "ws") + "/custom") as ws:
            assert await ws.recv() == "custom route"
        client = GenericEnvClient(base_url=server.base_url + "/nowhere", connect_timeout_s=5)
        with pytest.raises(ConnectionError, match="HTTP 404"):
            await client.reset()
        await client.close()
    assert "without completing handshake" not in caplog.text  # a 404 answered, not a handshake left open
