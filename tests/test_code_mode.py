"""Code mode (``MCPEnvironment.supports_code_mode`` / ``get_callables`` / ``execute_code``): an
agent's code calls the environment's tools by name. Upstream runs it with an in-process ``exec``
(spec §14.17); here it runs in the sandbox of ``openenv.core.tools``, the tools reached back
through the environment, with the same results."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any, Optional

import pytest
from fastmcp import Context, FastMCP

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.types import Action, Observation
from openenv.core.generic_client import GenericEnvClient

from .conftest import serve
from .envs import ToolsOnlyEnv

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


class CodeAction(Action):
    code: str


class CodeEnv(ToolsOnlyEnv):
    """Tools add, later (async), boom and count (which keeps a count in the environment), one
    name per mode ('source'); a CodeAction runs its code in code mode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__(FastMCP("code-tools"))
        self.calls = 0

        @self.mcp_server.tool
        def add(a: int, b: int = 0) -> int:
            return a + b

        @self.mcp_server.tool
        async def later(n: int) -> int:
            await asyncio.sleep(0)
            return n * 2

        @self.mcp_server.tool
        def boom() -> int:
            raise ValueError("kaboom")

        @self.mcp_server.tool
        def count() -> int:
            self.calls += 1
            return self.calls

        @self.tool(mode="production", name="source")
        def production() -> str:
            return "production"

        @self.tool(mode="simulation", name="source")
        def simulation() -> str:
            return "simulation"

    def _step_impl(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return self.execute_code(action.code, timeout_s=timeout_s)


def plain_exec(code: str, callables: dict) -> dict:
    """What upstream's execute_code does: exec in this process, the tools as globals."""
    scope: dict = {}
    try:
        exec(code, dict(callables), scope)
    except SyntaxError as exc:
        return {"error": f"Syntax error: {exc}"}
    except Exception as exc:
        return {"error": str(exc)}
    return {"result": scope.get("result")}


CASES = {
    "tool calls": "result = add(2, b=3) + add(a=1)",
    "a loop over a tool": "result = [add(i, i) for i in range(4)]",
    "plain Python": "import math\nresult = {'pi': round(math.pi, 3), 'n': len('abc')}",
    "no result": "x = add(1)",
    "syntax error": "result = (",
    "runtime error": "result = 1 / 0",
    "failing tool": "result = boom()",
    "unknown tool": "result = nope(1)",
    "caught tool failure": "try:\n    boom()\nexcept ValueError as e:\n    result = 'caught ' + str(e)",
    "no arguments": "result = add()",
    "too few arguments": "result = add(1) + later()",
    "too many arguments": "result = add(1, 2, 3)",
    "twice the same argument": "result = add(1, a=2)",
}


@pytest.fixture(scope="module")
def env():
    environment = CodeEnv()
    environment._mode = "simulation"
    yield environment
    environment.close()


def test_mcp_environments_support_code_mode_with_the_tools_of_their_mode(env):
    assert env.supports_code_mode is True
    assert set(env.get_callables()) == {"add", "later", "boom", "count", "source"}
    assert env.get_callables()["source"]() == "simulation"


@pytest.mark.parametrize("case", sorted(CASES))
def test_code_mode_gives_what_upstreams_exec_gives(env, case):
    code = CASES[case]
    observation = env.execute_code(code)
    assert observation.done is False and observation.reward == 0.0
    assert observation.metadata == plain_exec(code, env.get_callables()), case


def test_a_syntax_error_says_it_is_one(env):
    """Python's own text for a syntax error (\"'(' was never closed\") does not name its kind."""
    observation = env.execute_code("result = (")
    assert observation.metadata["error"].startswith("Syntax error: ")
    assert "was never closed" in observation.metadata["error"]
    indented = env.execute_code("  result = 1")
    assert indented.metadata["error"].startswith("Syntax error: unexpected indent")


class ContextToolEnv(ToolsOnlyEnv):
    """A tool with a parameter the server fills in (a FastMCP ``Context``): not in its schema."""

    def __init__(self) -> None:
        super().__init__(FastMCP("context-tools"))

        @self.mcp_server.tool
        def whoami(note: str, ctx: Context) -> str:
            return f"{ctx!r}: {note}"

    def _step_impl(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return self.execute_code(action.code, timeout_s=timeout_s)


def test_code_cannot_set_the_parameters_the_server_fills_in():
    """Over MCP, ``ctx`` is not an argument a caller may send; a plain ``exec`` of the raw function
    (upstream's code mode) lets the agent's code pass anything there, by keyword or position."""
    environment = ContextToolEnv()
    try:
        raw = environment.get_callables()
        for code in ("result = whoami('hi', ctx='admin')", "result = whoami('hi', 'admin')"):
            assert plain_exec(code, raw) == {"result": "'admin': hi"}  # the attack, without the guard
            error = environment.execute_code(code).metadata["error"]
            assert "whoami() got an unexpected keyword argument 'ctx'" in error or "positional arguments" in error
    finally:
        environment.close()


def test_async_tools_are_awaited_and_tools_run_in_the_environment(env):
    before = env.calls
    assert env.execute_code("result = later(4) + count() * 0 + count() * 0").metadata == {"result": 8}
    assert env.calls == before + 2  # the tool ran here, on the environment, not in the sandbox


def test_a_runaway_program_is_stopped_by_the_timeout(env):
    observation = env.execute_code("while True:\n    pass", timeout_s=1)
    assert observation.metadata == {"error": "the code timed out after 1 s and was killed"}


@pytest.mark.parametrize("mode", ["production", "simulation"])
def test_code_mode_over_a_live_server_honours_the_servers_mode(mode):
    app = create_app(CodeEnv, CodeAction, Observation, env_name="code", mode=mode, max_concurrent_envs=2)
    with serve(app) as server, GenericEnvClient(base_url=server.base_url).sync() as client:
        client.reset()
        step = client.step({"code": "result = [source(), add(20, 22), count(), count()]"})
        assert step.observation["metadata"] == {"result": [mode, 42, 1, 2]}
        step = client.step({"code": "result = count()"})  # the same session's environment
        assert step.observation["metadata"] == {"result": 3}
        step = client.step({"code": "result = boom()"})
        assert step.observation["metadata"] == {"error": "kaboom"}


ATTACK = """
import os, socket
found = {}
try:
    with open(SECRET_PATH) as secret:
        found["file"] = secret.read()
except OSError as exc:
    found["file"] = None
try:
    socket.create_connection(("127.0.0.1", HOST_PORT), timeout=2).close()
    found["network"] = True
except OSError:
    found["network"] = False
try:
    os.kill(SERVER_PID, 0)  # plain exec: the same call with a signal would end the server
    found["process"] = True
except OSError:
    found["process"] = False
found["environ"] = "HOST_SECRET" in os.environ
result = found
"""


def test_the_agents_code_reaches_neither_host_files_network_nor_the_server_process(env, tmp_path, monkeypatch):
    """The same code, run by a plain exec as upstream's execute_code does, reads the host's file,
    connects to the host's port, finds the server process and its environment: see the last
    assertion. In our sandbox it gets none of them."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the answer key")
    monkeypatch.setenv("HOST_SECRET", "1")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # the kernel completes a connection into the backlog: no accept needed
    try:
        where = f"SECRET_PATH = {str(secret)!r}\nHOST_PORT = {listener.getsockname()[1]}\nSERVER_PID = {os.getpid()}\n"
        code = where + ATTACK
        sandboxed = env.execute_code(code).metadata
        assert sandboxed == {"result": {"file": None, "network": False, "process": False, "environ": False}}
        assert plain_exec(code, env.get_callables()) == {
            "result": {"file": "the answer key", "network": True, "process": True, "environ": True}
        }
    finally:
        listener.close()


class GradedCodeEnv(CodeEnv):
    GRADER_TOOLS = ("count",)  # the grader's: the agent's code must not reach it (docs/roles.md)


def test_the_agents_code_never_reaches_the_graders_tools():
    environment = GradedCodeEnv()
    try:
        assert "count" in environment.get_callables()  # (the environment has it)
        reached = environment.execute_code("result = count()")
        assert "count" in str(reached.metadata.get("error")) and environment.calls == 0
        assert environment.execute_code("result = add(1, 2)").metadata == {"result": 3}
    finally:
        environment.close()
