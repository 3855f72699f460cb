"""The echo environment package: the quick-start, run verbatim against the README's server command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from echo_env import CallToolAction, EchoEnv, ListToolsAction
from echo_env.server.echo_environment import EchoEnvironment

from openenv.core.client_errors import ToolCallError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
from echo_demo import free_port, wait_healthy  # noqa: E402


@pytest.fixture(scope="module")
def echo_url():
    """The echo server started as the README says: `python -m openenv.core.env_server echo_env.server.app:app`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "openenv.core.env_server",
            "echo_env.server.app:app",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd="/",
    )
    try:
        wait_healthy(url, server)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def test_quickstart_prints_what_its_comments_say(echo_url):
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "echo_quickstart.py")],
        env={**os.environ, "OPENENV_URL": echo_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    # The expected lines are the example's own comments, in the order the file runs them.
    expected = [
        line.split("# ", 1)[1].split(" (", 1)[0]
        for line in (EXAMPLES / "echo_quickstart.py").read_text().splitlines()
        if "print(" in line and "# " in line
    ]
    assert len(expected) == 6
    assert out == expected


async def test_tools_and_state_through_the_client(echo_url):
    async with EchoEnv(base_url=echo_url) as env:
        await env.reset()
        listing = await env.step(ListToolsAction())
        assert [t.name for t in listing.observation.tools] == ["echo_message", "echo_with_length"]
        assert listing.reward == 0.0
        result = await env.step(CallToolAction(tool_name="echo_with_length", arguments={"message": "abc"}))
        assert result.observation.result == {"message": "abc", "length": 3}
        assert result.reward == pytest.approx(0.3)
        assert (await env.state()).step_count == 2
        failed = await env.step(CallToolAction(tool_name="echo_message", arguments={}))
        assert failed.observation.error.error_type.value == "invalid_args"
        with pytest.raises(ToolCallError, match="echo_message"):
            await env.call_tool("echo_message")


def test_environment_used_in_process():
    env = EchoEnvironment()
    assert env.reset().echoed_message == "Echo environment ready!"
    observation = env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
    assert observation.result.data == "hi"  # FastMCP's CallToolResult, as in OpenEnv 0.10
    assert observation.reward == pytest.approx(0.2)
    assert env.state.step_count == 1
    from openenv.core.env_server.types import Action

    assert "CallToolAction or ListToolsAction" in env.step(Action()).metadata["error"]


def test_served_from_its_directory_by_the_manifest_app_field():
    """Spec §12.14: the server starts as `uvicorn <app of openenv.yaml>` from the package directory."""
    import httpx
    import yaml

    package = Path(__file__).resolve().parents[1] / "envs" / "echo_env"
    app_path = yaml.safe_load((package / "openenv.yaml").read_text())["app"]
    assert app_path == "server.app:app"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            app_path,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=package,
    )
    try:
        wait_healthy(url, server)
        assert httpx.get(url + "/health").json() == {"status": "healthy"}
        with EchoEnv(base_url=url).sync() as env:
            assert env.reset().observation.echoed_message == "Echo environment ready!"
            assert env.call_tool("echo_message", message="from the manifest") == "from the manifest"
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.internals("uvicorn")
async def test_the_packages_server_entry_point_serves_with_openenvs_runner():
    """`python -m echo_env.server.app` runs through openenv's runner, not bare uvicorn: a 40 MiB
    frame, past the app's 32 MiB limit and uvicorn's own 16 MiB one (which closes the connection
    with 1009), gets a MESSAGE_TOO_LARGE error frame (uncompressed: skipped unread) and the
    connection keeps working."""
    import json

    from websockets.asyncio.client import connect

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "echo_env.server.app", "--port", str(port)], cwd="/")
    try:
        wait_healthy(url, server)
        async with connect(f"ws://127.0.0.1:{port}/ws", max_size=None, open_timeout=30, compression=None) as ws:
            await ws.send('{"type":"reset","data":{}}')
            assert json.loads(await ws.recv())["type"] == "observation"
            await ws.send('{"type":"step","data":{"type":"call_tool","tool_name":"' + "x" * (40 << 20) + '"}}')
            assert json.loads(await ws.recv())["data"]["code"] == "MESSAGE_TOO_LARGE"
            await ws.send(
                json.dumps(
                    {
                        "type": "step",
                        "data": CallToolAction(
                            tool_name="echo_message", arguments={"message": "still here"}
                        ).model_dump(),
                    }
                )
            )
            assert json.loads(await ws.recv())["data"]["observation"]["result"]["data"] == "still here"
    finally:
        server.terminate()
        server.wait(10)


async def test_the_packages_server_entry_point_serves_on_a_unix_socket(tmp_path):
    """`--uds PATH` (openenv's shared `serve_main` command line) serves on that socket, and the
    client reaches it through a `unix://` base_url."""
    import time

    sock = tmp_path / "echo.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "echo_env.server.app", "--uds", str(sock), "--log-level", "warning"], cwd="/"
    )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert server.poll() is None, "the server exited during start-up"
            assert time.monotonic() < deadline, "the socket did not appear within 60 s"
            time.sleep(0.05)
        async with EchoEnv(base_url=f"unix://{sock}") as env:
            await env.reset()
            result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "over a socket"}))
            assert result.observation.result == "over a socket"
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--port", "70000"], "--port must be between 0 and 65535, not 70000"), (["--port", "x"], "invalid int value")],
)
def test_the_packages_server_entry_point_rejects_a_bad_port(args, message):
    out = subprocess.run(
        [sys.executable, "-m", "echo_env.server.app", *args], cwd="/", capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert message in out.stderr
    assert "Serve the echo environment" not in out.stdout  # a usage error, not --help
