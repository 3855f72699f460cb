"""The bearer token in front of every route but /health, on live servers: HTTP, /ws, WS /mcp,
POST /mcp, our clients and the official MCP SDK client."""

from __future__ import annotations

import asyncio
import json
import pickle

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from openenv.core import AuthenticationError
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from .conftest import counter_app, serve, until
from .envs import CounterAction, CounterClient, ToolEnv

TOKEN = "s3cret-token-for-the-tests-0123456789"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
WRONG = {"Authorization": "Bearer not-the-token-at-all-000"}


def _ws_url(server, path: str = "/ws") -> str:
    return server.base_url.replace("http", "ws", 1) + path


def test_every_route_but_health_needs_the_token() -> None:
    from .envs import TRACKER

    app = counter_app(auth_token=TOKEN)
    with serve(app) as server:
        url = server.base_url
        assert httpx.get(f"{url}/health").status_code == 200
        for method, path, body in [
            ("GET", "/schema", None),
            ("GET", "/metadata", None),
            ("GET", "/docs", None),
            ("GET", "/openapi.json", None),
            ("POST", "/reset", {}),
            ("POST", "/step", {"action": {"delta": 1}}),
            ("GET", "/state", None),
            ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
            ("GET", "/list_environments", None),
            ("POST", "/counter/num_tasks", {}),
        ]:
            built = TRACKER.created
            for headers in (None, WRONG, {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}):
                response = httpx.request(method, url + path, json=body, headers=headers)
                assert response.status_code == 401, (path, headers)
                assert response.headers["www-authenticate"] == "Bearer"
                assert response.json()["code"] == "UNAUTHORIZED"
            assert TRACKER.created == built, path  # no environment was built for a refused call
            assert httpx.request(method, url + path, json=body, headers=GOOD).status_code != 401, path
            lower = {"authorization": f"bearer  {TOKEN}"}  # header and scheme in any case
            assert httpx.request(method, url + path, json=body, headers=lower).status_code != 401, path
        assert "requires a token" in httpx.get(f"{url}/schema").json()["detail"]
        assert "did not accept" in httpx.get(f"{url}/schema", headers=WRONG).json()["detail"]
        assert TRACKER.created > 0  # the calls with the token did build environments


async def test_a_websocket_without_the_token_is_refused_in_its_handshake() -> None:
    app = counter_app(auth_token=TOKEN)
    openenv = app.state.openenv_server
    with serve(app) as server:
        for path in ("/ws", "/mcp"):
            for headers in (None, WRONG):
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(_ws_url(server, path), additional_headers=headers):
                        pass
                assert refused.value.response.status_code == 401
                assert json.loads(refused.value.response.body)["code"] == "UNAUTHORIZED"
        assert openenv.active_sessions == 0
        async with connect(_ws_url(server), additional_headers=GOOD) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(await ws.recv())["type"] == "observation"
        await until(lambda: openenv.active_sessions == 0)


async def test_our_client_says_what_is_missing_and_works_with_the_header() -> None:
    with serve(counter_app(auth_token=TOKEN)) as server:
        client = CounterClient(base_url=server.base_url)
        with pytest.raises(AuthenticationError) as refused:
            await client.reset()
        assert isinstance(refused.value, ConnectionError) and refused.value.status == 401
        message = str(refused.value)
        assert "HTTP 401" in message and "requires a token" in message and "headers=" in message
        assert TOKEN not in message
        copy = pickle.loads(pickle.dumps(refused.value))
        assert (type(copy), str(copy), copy.status) == (AuthenticationError, message, 401)
        await client.close()

        async with CounterClient(base_url=server.base_url, headers=GOOD) as client:
            await client.reset()
            assert (await client.step(CounterAction(delta=4))).observation.value == 4
        with CounterClient(base_url=server.base_url, headers=GOOD).sync() as client:
            client.reset()
            assert client.step(CounterAction(delta=2)).observation.value == 2
        with pytest.raises(AuthenticationError, match="did not accept"):
            with CounterClient(base_url=server.base_url, headers=WRONG).sync() as client:
                client.reset()


def _tool_app(**kwargs):
    return create_app(ToolEnv, CallToolAction, CallToolObservation, env_name="tools", **kwargs)


async def test_mcp_clients_send_the_token_as_a_header() -> None:
    import mcp

    from openenv.core.mcp_client import MCPToolClient

    with serve(_tool_app(auth_token=TOKEN)) as server:
        async with MCPToolClient(base_url=server.base_url, headers=GOOD) as client:
            assert "add" in {tool.name for tool in await client.list_tools()}
            assert await client.call_tool("add", a=2, b=3) == 5
        with pytest.raises(AuthenticationError, match="HTTP 401"):
            async with MCPToolClient(base_url=server.base_url) as client:
                await client.list_tools()

        url = server.base_url + "/mcp"
        if hasattr(mcp, "Client"):  # mcp >= 2: headers go on its HTTP client
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            async with httpx2.AsyncClient(headers=GOOD) as http_client:
                async with mcp.Client(streamable_http_client(url, http_client=http_client)) as session:
                    result = await session.call_tool("add", {"a": 20, "b": 22})
        else:  # mcp 1.x
            from mcp.client.streamable_http import streamablehttp_client

            async with streamablehttp_client(url, headers=GOOD) as (read, write, _):
                async with mcp.ClientSession(read, write) as session:
                    await session.initialize()
                    result = await session.call_tool("add", {"a": 20, "b": 22})
        assert result.content[0].text == "42"


def test_the_token_comes_from_the_environment_and_must_be_a_real_one(monkeypatch) -> None:
    monkeypatch.setenv("OPENENV_AUTH_TOKEN", TOKEN)
    with serve(counter_app(auth_token="the-apps-own-token-0123456789")) as server:  # the variable wins
        assert httpx.get(f"{server.base_url}/schema").status_code == 401
        assert httpx.get(f"{server.base_url}/schema", headers=GOOD).status_code == 200
    monkeypatch.setenv("OPENENV_AUTH_TOKEN", "")  # empty: no token
    with serve(counter_app()) as server:
        assert httpx.get(f"{server.base_url}/schema").status_code == 200
    monkeypatch.setenv("OPENENV_AUTH_TOKEN", "short")
    with pytest.raises(ValueError, match=r"OPENENV_AUTH_TOKEN must be at least 16 characters.*secrets"):
        counter_app()
    monkeypatch.delenv("OPENENV_AUTH_TOKEN")
    with pytest.raises(ValueError, match="auth_token must be printable ASCII"):
        counter_app(auth_token="a token with spaces in it")
    with pytest.raises(TypeError, match="auth_token must be a str"):
        counter_app(auth_token=12345678901234567890)


def test_only_get_and_head_of_health_are_open_and_refusals_close_the_connection() -> None:
    import socket

    with serve(counter_app(auth_token=TOKEN)) as server:
        url = server.base_url
        for method in ("HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
            response = httpx.request(method, f"{url}/health", content=b"x" * 1000)
            assert response.status_code == 401, method
            assert response.headers["connection"] == "close"
        # two Authorization headers are refused, whichever of them holds the token
        for pair in ([GOOD["Authorization"], "Bearer wrong"], ["Bearer wrong", GOOD["Authorization"]]):
            with socket.create_connection((server.host, server.port)) as raw:
                head = "".join(f"Authorization: {value}\r\n" for value in pair)
                raw.sendall(f"GET /schema HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode())
                assert raw.recv(65536).startswith(b"HTTP/1.1 401"), pair
        # a body sent without the token is not read: the refusal comes while it is still on its way
        with socket.create_connection((server.host, server.port)) as raw:
            raw.sendall(b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 30000000\r\n\r\n" + b"{" * 1000)
            assert raw.recv(65536).startswith(b"HTTP/1.1 401")


async def test_a_refused_handshake_is_not_logged_as_an_error_of_the_app() -> None:
    import logging

    records = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    for ws in ("auto", "websockets-sansio"):  # ours (the runner's default) and uvicorn's own
        records.clear()
        with serve(counter_app(auth_token=TOKEN), **({} if ws == "auto" else {"ws": ws})) as server:
            # (after start-up: building uvicorn's config resets its loggers' handlers)
            logging.getLogger("uvicorn.error").addHandler(handler)
            try:
                for path in ("/ws", "/mcp", "/health"):
                    with pytest.raises(InvalidStatus) as refused:
                        async with connect(_ws_url(server, path)):
                            pass
                    assert refused.value.response.status_code == 401, path
                logging.getLogger("uvicorn.error").error("the handler sees uvicorn's errors")
            finally:
                logging.getLogger("uvicorn.error").removeHandler(handler)
        assert [r.getMessage() for r in records] == ["the handler sees uvicorn's errors"], ws


async def test_a_websocket_path_with_no_route_is_a_404_not_a_refused_token() -> None:
    from openenv.core.generic_client import GenericEnvClient

    for app, headers in ((counter_app(), None), (counter_app(auth_token=TOKEN), GOOD)):
        with serve(app) as server:  # a WebSocket on a path with no route: 404, token or not
            client = GenericEnvClient(base_url=server.base_url + "/nowhere", headers=headers)
            with pytest.raises(ConnectionError) as failed:
                await client.reset()
            assert not isinstance(failed.value, AuthenticationError) and "HTTP 404" in str(failed.value)
            await client.close()
            with pytest.raises(InvalidStatus) as refused:
                async with connect(_ws_url(server, "/nowhere/ws"), additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 404
            assert b"no WebSocket route at /nowhere/ws" in refused.value.response.body


def test_a_refused_token_on_a_path_with_no_route_is_still_a_401() -> None:
    with serve(counter_app(auth_token=TOKEN)) as server:  # the token is checked before the routes

        async def attempt() -> int:
            with pytest.raises(InvalidStatus) as refused:
                async with connect(_ws_url(server, "/nowhere/ws")):
                    pass
            return refused.value.response.status_code

        assert asyncio.run(attempt()) == 401


# --- pages of other sites (edges.middleware.SameOrigin) --------------------------------------------

EVIL = "http://evil.example"


async def test_a_browser_page_of_another_site_is_refused_without_a_token() -> None:
    """What a browser sends for another site's page (its Origin): the handshake and the POSTs are
    refused 403 and no environment is built; GETs pass (a cross-site page cannot read their
    answers); clients that send no Origin, and the server's own page, are served."""
    from .envs import TRACKER

    app = counter_app()
    openenv = app.state.openenv_server
    with serve(app) as server:
        url = server.base_url
        own = url  # the server's own origin, as its web page sends it
        built = TRACKER.created
        for path in ("/ws", "/mcp"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(_ws_url(server, path), origin=EVIL):
                    pass
            assert refused.value.response.status_code == 403
            answer = json.loads(refused.value.response.body)
            assert answer["code"] == "FORBIDDEN_ORIGIN" and "OPENENV_ALLOWED_ORIGINS" in answer["detail"]
        rpc = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}})
        for origin in (EVIL, "null", own.replace("127.0.0.1", "localhost"), own.rsplit(":", 1)[0] + ":1"):
            for path, body in (("/mcp", rpc), ("/reset", "{}"), ("/step", '{"action": {"delta": 1}}')):
                headers = {"origin": origin, "content-type": "text/plain"}
                response = httpx.post(url + path, content=body, headers=headers)
                assert response.status_code == 403, (origin, path)
                assert response.json()["code"] == "FORBIDDEN_ORIGIN"
        assert TRACKER.created == built and openenv.active_sessions == 0
        assert httpx.get(url + "/schema", headers={"origin": EVIL}).status_code == 200
        for origin in (own, None):
            async with connect(_ws_url(server), origin=origin) as ws:
                await ws.send(json.dumps({"type": "reset", "data": {}}))
                assert json.loads(await ws.recv())["type"] == "observation"
            headers = {"origin": own} if origin else {}
            assert httpx.post(url + "/reset", json={}, headers=headers).status_code == 200
        await until(lambda: openenv.active_sessions == 0)


def test_behind_a_proxy_the_pages_own_origin_is_the_forwarded_host(monkeypatch) -> None:
    """A proxy that rewrites Host names the page's host in X-Forwarded-Host: once that name is
    one the server is known by (OPENENV_ALLOWED_HOSTS), its own page may POST."""
    proxied = {"origin": "https://space.example.org", "x-forwarded-host": "space.example.org"}
    with serve(counter_app()) as server:
        refused = httpx.post(server.base_url + "/reset", json={}, headers=proxied)
        assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN_HOST"
    monkeypatch.setenv("OPENENV_ALLOWED_HOSTS", "space.example.org")
    with serve(counter_app()) as server:
        assert httpx.post(server.base_url + "/reset", json={}, headers=proxied).status_code == 200


# --- names the server is not known by (DNS rebinding; edges.middleware.SameOrigin) ------------------

REBOUND = "rebind.example"


async def test_a_page_of_a_name_rebound_to_this_machine_is_refused() -> None:
    """What a browser sends once a page's name has been turned to 127.0.0.1 (DNS rebinding): Host
    and Origin both name the page's site, so the origin check alone would take the page for the
    server's own. The handshakes and the POSTs are refused 403 FORBIDDEN_HOST, naming the setting,
    and no environment is built; a client that is no browser (no Origin) may use any name."""
    from .envs import TRACKER

    app = counter_app()
    openenv = app.state.openenv_server
    with serve(app) as server:
        port = server.port
        host = f"{REBOUND}:{port}"
        page = {"host": host, "origin": f"http://{host}"}
        built = TRACKER.created
        for path in ("/ws", "/mcp"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(_ws_url(server, path), origin=page["origin"], additional_headers={"host": host}):
                    pass
            assert refused.value.response.status_code == 403
            answer = json.loads(refused.value.response.body)
            assert answer["code"] == "FORBIDDEN_HOST" and "OPENENV_ALLOWED_HOSTS" in answer["detail"]
        rpc = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}})
        for path, body in (("/mcp", rpc), ("/reset", "{}"), ("/step", '{"action": {"delta": 1}}')):
            response = httpx.post(server.base_url + path, content=body, headers={**page, "content-type": "text/plain"})
            assert response.status_code == 403 and response.json()["code"] == "FORBIDDEN_HOST", path
        # a proxy's X-Forwarded-Host is checked too: a page cannot hide its name behind a known Host
        forwarded = {"origin": page["origin"], "x-forwarded-host": host}
        assert httpx.post(server.base_url + "/reset", json={}, headers=forwarded).status_code == 403
        assert TRACKER.created == built and openenv.active_sessions == 0
        # names no one else can point here pass, with the page's own origin
        for name in ("localhost", "127.0.0.1", "[::1]", "10.1.2.3"):
            own = {"host": f"{name}:{port}", "origin": f"http://{name}:{port}"}
            assert httpx.post(server.base_url + "/reset", json={}, headers=own).status_code == 200, name
        # a trainer (no Origin) reaching the server by a container's service name, say
        assert (
            httpx.post(server.base_url + "/reset", json={}, headers={"host": f"env-service:{port}"}).status_code == 200
        )
        await until(lambda: openenv.active_sessions == 0)


@pytest.mark.parametrize(
    "setting, name, allowed",
    [
        ("rebind.example", "rebind.example", True),
        ("rebind.example", "other.example", False),
        (".example.org", "env.example.org", True),
        (".example.org", "example.org", True),
        (".example.org", "badexample.org", False),
        ("*", "anything.example", True),
    ],
)
def test_allowed_hosts_name_the_names_browsers_may_use(monkeypatch, setting: str, name: str, allowed: bool) -> None:
    monkeypatch.setenv("OPENENV_ALLOWED_HOSTS", setting)
    with serve(counter_app()) as server:
        page = {"host": f"{name}:{server.port}", "origin": f"http://{name}:{server.port}"}
        response = httpx.post(server.base_url + "/reset", json={}, headers=page)
        assert response.status_code == (200 if allowed else 403)


def test_a_spaces_own_name_is_known(monkeypatch) -> None:
    """Hugging Face sets SPACE_HOST in a Space's container: its playground works without a setting."""
    monkeypatch.setenv("SPACE_HOST", "someone-echo.hf.space")
    with serve(counter_app()) as server:
        page = {"origin": "https://someone-echo.hf.space", "host": "someone-echo.hf.space"}
        assert httpx.post(server.base_url + "/reset", json={}, headers=page).status_code == 200


@pytest.mark.parametrize("bad", ["http://env.example.org", "env.example.org:8000", "env example", "a/b"])
def test_an_allowed_host_that_does_not_parse_is_refused(monkeypatch, bad: str) -> None:
    monkeypatch.setenv("OPENENV_ALLOWED_HOSTS", bad)
    with pytest.raises(ValueError, match="OPENENV_ALLOWED_HOSTS must be"):
        counter_app()


def test_allowed_origins_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("OPENENV_ALLOWED_ORIGINS", "https://trainer.example.org, HTTP://127.0.0.1:9000")
    with serve(counter_app()) as server:
        for origin, status in (("https://trainer.example.org", 200), ("http://127.0.0.1:9000", 200), (EVIL, 403)):
            assert httpx.post(server.base_url + "/reset", json={}, headers={"origin": origin}).status_code == status
    monkeypatch.setenv("OPENENV_ALLOWED_ORIGINS", "*")
    with serve(counter_app()) as server:
        assert httpx.post(server.base_url + "/reset", json={}, headers={"origin": EVIL}).status_code == 200
    for bad in ("evil.example", "ftp://x.example", "https://x.example/path"):
        monkeypatch.setenv("OPENENV_ALLOWED_ORIGINS", bad)
        with pytest.raises(ValueError, match="OPENENV_ALLOWED_ORIGINS must be"):
            counter_app()
