"""Every catalogue environment forks, snapshots and restores exactly (issue: fork/snapshot).

For each environment: a seeded episode, a prefix of steps, then ``fork(8)``. Each fork, given the
original's next actions, must give the original's observations and rewards; stepping one fork
must leave the others where they were; and a snapshot restored on a fresh server (same key)
must continue exactly as well; after the continuation, each session's state must be the
original's too (unless the case says its state holds what no two sessions share). Real servers
on 127.0.0.1, each environment's own classes.

A case names the environment's app (built the way its ``server/app.py`` builds it), the reset's
keywords, the prefix and the continuation (action dicts as the wire carries them; ``{"$reset":
{...}}`` resets with those keywords instead, for state that reaches over episodes). An
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
    seen: Optional[Callable[[Dict[str, Any]], Any]] = None  # what of an observation must be equal (default: all)
    compare_state: bool = True  # the state after the continuation must be the original's too

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


def _no_bubblewrap() -> Optional[str]:
    from openenv.core.containers.runtime.isolation import find_bwrap

    return None if find_bwrap() else "bubblewrap is not installed (apt-get install bubblewrap)"


def _without_timing(observation: Dict[str, Any]) -> Dict[str, Any]:
    """A REPL observation but the seconds its code took (wall-clock time)."""
    result = {k: v for k, v in observation["result"].items() if k != "execution_time"}
    return {**observation, "result": result}


def _tool(name: str, **arguments: Any) -> Dict[str, Any]:
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


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
        skip=_no_bubblewrap,
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
        skip=_no_bubblewrap,
    ),
    "chess_env": Case(
        "chess_env.server.chess_environment:ChessEnvironment",
        "chess_env.models:ChessAction",
        "chess_env.models:ChessObservation",
        "chess_env.models:ChessState",
        {"seed": 9, "opponent": "minimax", "opponent_depth": 2},  # its ties are broken by the seeded generator
        _moves("move", ["b2b3", "g2g4", "b1a3", "d2d3"]),
        _moves("move", ["Bb2", "e9e9", "f1h3", "f2f3", "Kf1", "f1g2"]),  # SAN, an illegal move, UCI
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
    "echo_env": Case(
        "echo_env.server.echo_environment:EchoEnvironment",
        "openenv.core.env_server.mcp_types:CallToolAction",
        "openenv.core.env_server.mcp_types:CallToolObservation",
        "openenv.core.env_server.types:State",
        {"episode_id": "echo-1"},
        [{"tool_name": "echo_message", "arguments": {"message": m}} for m in ("hi", "there")],
        [
            {"tool_name": "echo_with_length", "arguments": {"message": "forked"}},
            {"tool_name": "echo_message", "arguments": {"message": "again"}},
            {"tool_name": "no_such_tool", "arguments": {}},
        ],
        options={"reset_observation_cls": _find("echo_env.models:EchoObservation")},
    ),
    "finqa_env": Case(
        "finqa_env.server.finqa_environment:FinQAEnvironment",
        "openenv.core.env_server.mcp_types:CallToolAction",
        "openenv.core.env_server.mcp_types:CallToolObservation",
        "finqa_env.models:FinQAState",
        {"seed": 2},
        [
            {"tool_name": "get_descriptions", "arguments": {}},
            {"tool_name": "get_table_info", "arguments": {"table_name": "income_statement", "company_name": "NWR"}},
        ],
        [
            {"tool_name": "sql_query", "arguments": {"query": "SELECT ticker, name FROM companies ORDER BY ticker"}},
            {"tool_name": "sql_query", "arguments": {"query": "DROP TABLE companies"}},  # refused: a tool error
            {"tool_name": "submit_answer", "arguments": {"answer": "131.0"}},  # ends the episode
            {"tool_name": "get_descriptions", "arguments": {}},  # after the end: refused
        ],
        options={"reset_observation_cls": _find("openenv.core.env_server.types:Observation")},
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
    "gymnasium_env": Case(  # CartPole's physics and TimeLimit's counter: truncated at step 8, and stepped past it
        "gymnasium_env.server.gymnasium_environment:ClassicControlEnvironment",
        "gymnasium_env.models:GymnasiumAction",
        "gymnasium_env.models:GymnasiumObservation",
        "gymnasium_env.models:GymnasiumState",
        {"seed": 3, "env_id": "CartPole-v1", "max_episode_steps": 8},
        _moves("action", [1, 0, 1]),
        _moves("action", [1, 1, 0, 0, 1, 0, 1]),
    ),
    "gymnasium_env:FrozenLake": Case(  # toy-text, as OPENENV_GYMNASIUM_ENV_IDS serves it: a slippery lake draws from np_random
        "gymnasium_env.server.gymnasium_environment:ClassicControlEnvironment",
        "gymnasium_env.models:GymnasiumAction",
        "gymnasium_env.models:GymnasiumObservation",
        "gymnasium_env.models:GymnasiumState",
        {"seed": 8, "env_id": "FrozenLake-v1", "is_slippery": True},
        _moves("action", [2, 1, 2]),
        _moves("action", [1, 2, 1, 1, 2, 2, 1]),
        factory=lambda: _find("gymnasium_env.server.gymnasium_environment:ClassicControlEnvironment")(
            env_ids=["FrozenLake-v1"], make_kwargs=["is_slippery"]
        ),
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
    "openspiel_env": Case(  # pig: dice (the chance RNG) and a random bot (its own RNG) between the agent's turns
        "openspiel_env.server.openspiel_environment:OpenSpielEnvironment",
        "openspiel_env.models:OpenSpielAction",
        "openspiel_env.models:OpenSpielObservation",
        "openspiel_env.models:OpenSpielState",
        {"seed": 4, "game_name": "pig", "game_params": {"winscore": 30}},
        _moves("action_id", [0, 0, 0, 1]),
        _moves("action_id", [0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0]),  # to the end, and past it
    ),
    "repl_env": Case(  # a function, a seeded random module, a set of strings, a file: replayed in a fresh worker
        "repl_env.server.repl_environment:REPLEnvironment",
        "repl_env.models:REPLAction",
        "repl_env.models:REPLObservation",
        "repl_env.models:REPLState",
        {"task_id": "sum_numbers"},
        [
            {"code": "nums = [int(x) for x in context.split(',')]"},
            {
                "code": "def double(x):\n    return 2 * x\nimport random\nrandom.seed(7)\nwords = {'kiwi', 'fig', 'pear', 'plum'}"
            },
            {"code": "open('notes.txt', 'w').write(str(random.random()))\ndouble"},
        ],
        [
            {"code": "print(sorted(words), double(len(nums)), random.random())"},
            {"code": "print(open('notes.txt').read())"},
            {"code": "undefined_name"},
            {"code": "total = sum(nums)\nprint(f'FINAL_VAR(total)')"},
            {"code": "print('after the end')"},
        ],
        skip=_no_bubblewrap,
        seen=_without_timing,
        compare_state=False,  # its state holds the seconds the code took (the observations are compared without them)
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
        skip=_no_bubblewrap,
    ),
    "reasoning_gym_env": Case(
        "reasoning_gym_env.server.reasoning_gym_environment:ReasoningGymEnvironment",
        "reasoning_gym_env.models:ReasoningGymAction",
        "reasoning_gym_env.models:ReasoningGymObservation",
        "reasoning_gym_env.models:ReasoningGymState",
        {
            "dataset_name": "composite",
            "dataset_specs": [{"name": "leg_counting", "weight": 2}, {"name": "chain_sum", "weight": 1}],
            "seed": 13,
            "size": 5,
        },
        [{"answer": "4"}, {"$reset": {"episode_id": "e1"}}],  # answered; the next question of the dataset
        # answers, the next questions (wrapping around after size), a second answer refused
        [
            {"answer": "12"},
            *[item for n in range(2, 6) for item in ({"$reset": {"episode_id": f"e{n}"}}, {"answer": "7"})],
            {"answer": "7"},
        ],
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
    "textarena_env": Case(
        "textarena_env.server.textarena_environment:TextArenaEnvironment",
        "textarena_env.models:TextArenaAction",
        "textarena_env.models:TextArenaObservation",
        "textarena_env.models:TextArenaState",
        {"seed": 3, "game": "Wordle-v0"},  # the seed draws the secret word
        _moves("message", ["[crane]", "[slate]"]),
        # a repeated guess and a move without brackets (invalid), then guesses to the last turn
        _moves("message", ["[crane]", "[pious]", "no move", "[hello]", "[world]", "[fight]"]),
    ),
}
"""Environments that fork exactly, and the episode each is checked on."""

REFUSED: Dict[str, Tuple[Case, str]] = {
    "repl_env:background": (
        Case(
            "repl_env.server.repl_environment:REPLEnvironment",
            "repl_env.models:REPLAction",
            "repl_env.models:REPLObservation",
            "repl_env.models:REPLState",
            {"task_id": "sum_numbers"},
            [{"code": "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()"}],
            [{"code": "print(len(context))"}],
            skip=_no_bubblewrap,
        ),
        "the code left a thread running: when background work acts cannot be replayed",
    ),
    "openspiel_env:stones_and_gems": (
        Case(
            "openspiel_env.server.openspiel_environment:OpenSpielEnvironment",
            "openspiel_env.models:OpenSpielAction",
            "openspiel_env.models:OpenSpielObservation",
            "openspiel_env.models:OpenSpielState",
            {"seed": 1, "game_name": "stones_and_gems"},
            _moves("action_id", [3, 2]),
            _moves("action_id", [4, 0]),
        ),
        "a sampled-stochastic OpenSpiel game: its chance is drawn inside the engine, whose generator "
        "OpenSpiel's serialisation does not carry",
    ),
}
"""Environments that refuse snapshots, and why they cannot be exact."""


def _trace(results: List[Any], case: Optional[Case] = None) -> List[Any]:
    seen = case.seen if case is not None and case.seen is not None else (lambda observation: observation)
    return [(seen(r.observation), r.reward, r.done) for r in results]


async def _play(env: Any, actions: List[Dict[str, Any]]) -> List[Any]:
    return [await (env.reset(**action["$reset"]) if "$reset" in action else env.step(action)) for action in actions]


async def _final_state(case: Case, env: Any) -> Any:
    return await env.state() if case.compare_state else None


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
                prefix = _trace(await _play(env, case.prefix), case)
                snapshot = await env.snapshot()
                forks = await env.fork(FORKS)
                expected = _trace(await _play(env, case.following), case)
                assert expected, "the continuation must have steps"
                final = await _final_state(case, env)
                for fork in forks:  # one after another: a fork that shared state with another would drift
                    assert _trace(await _play(fork, case.following), case) == expected
                    assert await _final_state(case, fork) == final
                assert prefix  # (the prefix ran)
                return snapshot, expected, final

        snapshot, expected, final = asyncio.run(fork_and_compare())

        async def forks_are_independent() -> None:
            async with GenericEnvClient(base_url=server.base_url) as env:
                await env.reset(**case.reset)
                await _play(env, case.prefix)
                first, second = await env.fork(2)
                await _play(first, case.following)  # one fork runs ahead...
                # ...and the other still continues from the fork point
                assert _trace(await _play(second, case.following), case) == expected

        asyncio.run(forks_are_independent())
    with serve(case.app()) as fresh:

        async def restore_on_a_fresh_server() -> None:
            async with GenericEnvClient(base_url=fresh.base_url) as env:
                await env.restore(snapshot)
                assert _trace(await _play(env, case.following), case) == expected
                assert await _final_state(case, env) == final

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


def test_every_catalogue_environment_is_covered() -> None:
    """Each package of envs/ forks exactly (CASES); REFUSED lists configurations that refuse."""
    from .test_catalogue import PACKAGES

    assert {name.split(":")[0] for name in CASES} == set(PACKAGES)
    assert {name.split(":")[0] for name in REFUSED} <= set(PACKAGES)
