"""The base install (``pip install openenv``) has no FastMCP: plain environments serve and are
driven all the same, and MCPEnvironment says which extra brings it instead of turning into None.

FastMCP is hidden from a subprocess (``sys.modules["fastmcp"] = None`` makes its import fail as
on a machine without it); everything else is the real server and client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SERVE_WITHOUT_FASTMCP = """
import sys
sys.modules["fastmcp"] = None
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.runner import BackgroundServer
from openenv import GenericEnvClient

class Act(Action):
    n: int = 0

class Obs(Observation):
    total: int = 0

class Adder(Environment):
    def __init__(self):
        self.total = 0
    def reset(self, seed=None, episode_id=None, **kw):
        self.total = 0
        return Obs()
    def step(self, action, timeout_s=None, **kw):
        self.total += action.n
        return Obs(total=self.total)
    @property
    def state(self):
        return State(step_count=0)

app = create_app(Adder, Act, Obs, env_name="adder")
with BackgroundServer(app) as server:
    with GenericEnvClient(base_url=server.base_url).sync() as env:
        env.reset()
        print(env.step({"n": 2}).observation["total"], env.step({"n": 3}).observation["total"])
print("fastmcp" in sys.modules and sys.modules["fastmcp"] is not None)
"""


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_a_plain_environment_serves_and_steps_without_fastmcp() -> None:
    done = _run(SERVE_WITHOUT_FASTMCP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "5", "False"]


def test_mcp_environment_without_fastmcp_names_the_extra_to_install() -> None:
    done = _run(
        'import sys; sys.modules["fastmcp"] = None\n'
        "import openenv.core.env_server as server\n"
        "try:\n"
        "    server.MCPEnvironment\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('resolved to', server.MCPEnvironment)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "MCPEnvironment needs FastMCP" in done.stdout
    assert "pip install 'openenv[core]'" in done.stdout
