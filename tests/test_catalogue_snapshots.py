"""Every catalogue environment forks, snapshots and restores exactly (issue: fork/snapshot).

For each environment: a seeded episode, a prefix of steps, then ``fork(8)``. Each fork, given the
original's next actions, must give the original's observations and rewards; stepping one fork
must leave the others where they were; and a snapshot restored on a fresh server (same key)
must continue exactly as well. Real servers on 127.0.0.1, each environment's own classes.

A case names the environment's app (built the way its ``server/app.py`` builds it), the reset's
keywords, the prefix and the continuation (action dicts as the wire carries them). An
environment that cannot be exact is listed in ``REFUSED`` with why, and the test checks that it
refuses rather than approximates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from openenv.core.client_errors import NotSupportedError
from openenv.core.env_server.http_server import create_app
from openenv.core.generic_client import GenericEnvClient

from .conftest import serve

KEY = "catalogue-snapshot-key"
FORKS = 8


@dataclasses.dataclass
class Case:
    env: str  # "package.server.module:Class"
    action: str  # "package.models:Action"
    observation: str
    state: str
    reset: Dict[str, Any]
    prefix: List[Dict[str, Any]]
    following: List[Dict[str, Any]]
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)  # create_app keywords ("*_cls": by name)
    factory: Optional[Callable[[], Any]] = None  # instead of the class (an env whose app passes one)
    skip: Optional[Callable[[], Optional[str]]] = None  # why this machine cannot run it (None: it can)

    def app(self) -> Any:
        env = self.factory or _find(self.env)
        options = {"max_concurrent_envs": FORKS + 4, **self.options}
        for key, value in options.items():
            if key.endswith("_cls") and isinstance(value, str):
                options[key] = _find(value)
        return create_app(
            env,
            _find(self.action),
            _find(self.observation),
            env_name=self.env.split(".")[0],
            state_cls=_find(self.state),
            snapshot_key=KEY,
            **options,
        )


def _find(name: str) -> Any:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def _moves(key: str, values: List[Any]) -> List[Dict[str, Any]]:
    return [{key: value} for value in values]


def _tool(name: str, **arguments: Any) -> Dict[str, Any]:
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


def _no_bwrap() -> Optional[str]:
    from openenv.core.containers.runtime.isolation import find_bwrap

    return "bubblewrap is not installed (apt-get install bubblewrap)" if find_bwrap() is None else None


_MCP = "openenv.core.env_server.mcp_types"


CASES: Dict[str, Case] = {
    "coding_env": Case(
        "coding_env.server.coding_environment:CodingEnvironment",
        "coding_env.models:CodeAction",
        "coding_env.models:CodeObservation",
        "coding_env.models:CodeState",
        {"seed": 13},
        _moves("code", ["import random\nprint(random.random())", "print(hash('abc'))"]),
        _moves(
            "code",
            [
                "import random\nprint(random.randrange(10**9), hash('xyz'))",
                "raise SystemExit(3)",  # the last exit code is state too
                "import random\nprint([random.random() for _ in range(3)])",
            ],
        ),
        skip=_no_bwrap,
    ),
    "git_env": Case(
        "git_env.server.git_environment:GitEnvironment",
        f"{_MCP}:CallToolAction",
        f"{_MCP}:CallToolObservation",
        "git_env.models:GitState",
        {"seed": 0, "max_steps": 9},
        [
            _tool("write_file", path="notes/todo.md", content="- fork me\n"),
            _tool("execute_git_command", command="add -A"),
            _tool("execute_git_command", command="commit -m 'Add notes'"),
            _tool("execute_git_command", command="checkout -b feature"),
            _tool("run_command", command="echo more >> notes/todo.md && chmod +x notes/todo.md"),
        ],
        [
            _tool("git_status"),
            _tool("git_diff"),
            _tool("execute_git_command", command="commit -am 'More notes'"),
            _tool("git_log", max_count=5, all_branches=True),  # the step budget runs out: the check runs
        ],
        options={"reset_observation_cls": "git_env.models:GitObservation"},
        skip=_no_bwrap,
    ),
    "grid_world_env": Case(
        "grid_world_env.server.grid_world_environment:GridWorldEnvironment",
        "grid_world_env.models:GridWorldAction",
        "grid_world_env.models:GridWorldObservation",
        "grid_world_env.models:GridWorldState",
        {"seed": 3},
        _moves("action", ["DOWN", "RIGHT", "DOWN"]),
        _moves("action", ["RIGHT", "DOWN", "RIGHT", "UP", "DOWN"]),
    ),
    "maze_env": Case(
        "maze_env.server.maze_environment:MazeEnvironment",
        "maze_env.models:MazeAction",
        "maze_env.models:MazeObservation",
        "maze_env.models:MazeState",
        {"seed": 5},
        _moves("action", [1, 3, 1]),
        _moves("action", [3, 1, 2, 3, 1]),
    ),
    "shell_env": Case(
        "shell_env.server.shell_environment:ShellEnvironment",
        f"{_MCP}:CallToolAction",
        f"{_MCP}:CallToolObservation",
        "shell_env.models:ShellState",
        {"task_id": "sort_unique", "max_steps": 6},
        [
            _tool("run_command", command="mkdir -p out/deep && sort names.txt > out/sorted.txt && chmod 750 out"),
            _tool("run_command", command="ln -s ../sorted.txt out/deep/link && touch -d @1700000000 out/sorted.txt"),
            _tool("write_file", path="out/deep/note.txt", content="half done\n"),
        ],
        [
            _tool("list_dir", path="out/deep"),
            _tool(
                "run_command",
                command="find . -printf '%p %y %m %s %l\\n' | sort && cat out/deep/link && stat -c %Y out/sorted.txt",
            ),
            _tool("read_file", path="out/deep/note.txt"),  # the step budget runs out: the check runs
        ],
        options={"reset_observation_cls": "shell_env.models:ShellObservation"},
        skip=_no_bwrap,
    ),
    "snake_env": Case(
        "snake_env.server.snake_environment:SnakeEnvironment",
        "snake_env.models:SnakeAction",
        "snake_env.models:SnakeObservation",
        "snake_env.models:SnakeState",
        {"seed": 7},
        _moves("action", [0, 1, 0]),
        _moves("action", [0, 2, 0, 0, 1]),
    ),
    "connect4_env": Case(
        "connect4_env.server.connect4_environment:Connect4Environment",
        "connect4_env.models:Connect4Action",
        "connect4_env.models:Connect4Observation",
        "connect4_env.models:Connect4State",
        {"seed": 11},
        _moves("column", [3, 3]),
        _moves("column", [2, 4, 3]),
    ),
}
"""Environments that fork exactly, and the episode each is checked on."""

REFUSED: Dict[str, Tuple[Case, str]] = {}
"""Environments that refuse snapshots, and why they cannot be exact."""


def _trace(results: List[Any]) -> List[Any]:
    return [(r.observation, r.reward, r.done) for r in results]


async def _play(env: Any, actions: List[Dict[str, Any]]) -> List[Any]:
    return [await env.step(action) for action in actions]


def _skip(case: Case) -> None:
    why = case.skip() if case.skip is not None else None
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fork_into_eight_and_restore_elsewhere_continue_exactly(name: str) -> None:
    case = CASES[name]
    _skip(case)
    with serve(case.app()) as server:

        async def fork_and_compare() -> Any:
            async with GenericEnvClient(base_url=server.base_url) as env:
                await env.reset(**case.reset)
                prefix = _trace(await _play(env, case.prefix))
                snapshot = await env.snapshot()
                forks = await env.fork(FORKS)
                expected = _trace(await _play(env, case.following))
                assert expected, "the continuation must have steps"
                for fork in forks:  # one after another: a fork that shared state with another would drift
                    assert _trace(await _play(fork, case.following)) == expected
                assert prefix  # (the prefix ran)
                return snapshot, expected

        snapshot, expected = asyncio.run(fork_and_compare())

        async def forks_are_independent() -> None:
            async with GenericEnvClient(base_url=server.base_url) as env:
                await env.reset(**case.reset)
                await _play(env, case.prefix)
                first, second = await env.fork(2)
                await _play(first, case.following)  # one fork runs ahead...
                # ...and the other still continues from the fork point
                assert _trace(await _play(second, case.following)) == expected

        asyncio.run(forks_are_independent())
    with serve(case.app()) as fresh:

        async def restore_on_a_fresh_server() -> None:
            async with GenericEnvClient(base_url=fresh.base_url) as env:
                await env.restore(snapshot)
                assert _trace(await _play(env, case.following)) == expected

        asyncio.run(restore_on_a_fresh_server())


@pytest.mark.parametrize(
    "name", sorted(REFUSED) or [pytest.param("none", marks=pytest.mark.skip(reason="none refused"))]
)
def test_environments_that_cannot_be_exact_refuse(name: str) -> None:
    case, why = REFUSED[name]
    assert why, "say why it cannot be exact"
    _skip(case)
    with serve(case.app()) as server:

        async def main() -> None:
            async with GenericEnvClient(base_url=server.base_url) as env:
                await env.reset(**case.reset)
                await _play(env, case.prefix)
                with pytest.raises(NotSupportedError):
                    await env.snapshot()
                await _play(env, case.following)  # and the session goes on

        asyncio.run(main())
