"""finqa_env served in a real sandbox (SandboxProvider) and driven through FinQAEnv."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from finqa_env import CallToolAction, FinQAEnv, ListToolsAction
from finqa_env.server.database import load_questions, open_database, run_query
from finqa_env.server.rewards import compute_reward

from openenv.core.client_errors import ActionValidationError, ToolCallError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap

PACKAGE = Path(__file__).resolve().parents[1]
TOOLS = ["get_descriptions", "get_table_info", "sql_query", "submit_answer"]

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


def serve(env_vars: dict) -> Iterator[str]:
    provider = SandboxProvider(str(PACKAGE), env_vars=env_vars)
    base_url = provider.start()
    try:
        provider.wait_for_ready(60)
        yield base_url
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed finqa_env server for the whole module."""
    yield from serve({})


def call(env, tool: str, **arguments):
    return env.step(CallToolAction(tool_name=tool, arguments=arguments))


def rows(result) -> list:
    assert result.observation.error is None, result.observation.error
    return json.loads(result.observation.result)["rows"]


# --- the shipped data -------------------------------------------------------------------------


def test_every_shipped_answer_is_what_its_sql_computes() -> None:
    questions = load_questions()
    assert len(questions) >= 30
    assert len({q["id"] for q in questions}) == len(questions)
    db = open_database()
    for q in questions:
        result = run_query(db, q["sql"])["rows"]
        assert len(result) == 1 and len(result[0]) == 1, q["id"]
        value = result[0][0]
        if q["answer_type"] == "text":
            assert value == q["answer"], q["id"]
        else:
            assert value == pytest.approx(float(q["answer"]), abs=1e-4), q["id"]
            assert compute_reward(str(value), q["answer"], q["answer_type"]) == 1.0, q["id"]


@pytest.mark.parametrize(
    "answer, truth, kind, reward",
    [
        ("\\boxed{1,233.2}", "1233.2", "number", 1.0),
        ("about 1240 million", "1233.2", "number", 1.0),
        ("1250", "1233.2", "number", 0.0),
        ("28.5%", "28.4775", "percent", 1.0),
        ("0.2848", "28.4775", "percent", 1.0),
        ("0.2848%", "28.4775", "percent", 0.0),
        ("(2.4)", "-2.4", "number", 1.0),
        ("2021", "2022", "integer", 0.0),
        ("The answer is \\boxed{Solstice Energy.}", "Solstice Energy", "text", 1.0),
        ("Solstice", "Solstice Energy", "text", 0.0),
        ("no idea", "1233.2", "number", 0.0),
    ],
)
def test_answers_are_scored_by_the_documented_rules(answer: str, truth: str, kind: str, reward: float) -> None:
    assert compute_reward(answer, truth, kind) == reward


# --- through the sandboxed server -------------------------------------------------------------


def test_reset_poses_a_question_and_the_tools_are_upstreams(url: str) -> None:
    with FinQAEnv(base_url=url).sync() as env:
        result = env.reset(question_id="q13", episode_id="ep-1")
        listed = env.step(ListToolsAction())
        state = env.state()
    meta = result.observation.metadata
    assert meta["question"] == "Which Northwind Robotics segment had the highest revenue in 2020?"
    assert (meta["company"], meta["question_id"], meta["available_tools"]) == ("Northwind Robotics", "q13", TOOLS)
    assert (result.done, result.reward) == (False, 0.0)
    assert [t.name for t in listed.observation.tools] == TOOLS
    assert (state.episode_id, state.question_id, state.done, state.ground_truth) == ("ep-1", "q13", False, None)


@pytest.mark.parametrize("question_id", ["q03", "q13", "q16", "q25"])
def test_an_agent_that_runs_the_right_sql_and_submits_wins(url: str, question_id: str) -> None:
    question = next(q for q in load_questions() if q["id"] == question_id)
    with FinQAEnv(base_url=url).sync() as env:
        env.reset(question_id=question_id)
        tables = json.loads(call(env, "get_descriptions", company_name="NWR").observation.result)
        assert [t["table"] for t in tables] == ["companies", "income_statement", "balance_sheet", "segment_revenue"]
        value = rows(call(env, "sql_query", query=question["sql"]))[0][0]
        result = call(env, "submit_answer", answer=f"\\boxed{{{value}}}")
        state = env.state()
    assert (result.reward, result.done) == (1.0, True)
    assert result.observation.metadata["ground_truth"] == question["answer"]
    assert json.loads(result.observation.result)["correct"] is True
    assert (state.done, state.reward, state.tool_calls, state.ground_truth) == (True, 1.0, 3, question["answer"])


def test_a_wrong_answer_scores_zero_and_ends_the_episode(url: str) -> None:
    with FinQAEnv(base_url=url).sync() as env:
        env.reset(question_id="q01")
        result = call(env, "submit_answer", answer="12")
        after = call(env, "sql_query", query="SELECT 1")
    assert (result.reward, result.done) == (0.0, True)
    assert after.done and "the episode is over" in after.observation.error.message


def test_call_tool_outside_step_also_scores_and_ends_the_episode(url: str) -> None:
    with FinQAEnv(base_url=url).sync() as env:
        env.reset(question_id="q02")
        info = json.loads(env.call_tool("get_table_info", table_name="income_statement", company_name="BLF"))
        outcome = json.loads(env.call_tool("submit_answer", answer="131.0"))
        state = env.state()
    assert [c["name"] for c in info["columns"]][:3] == ["company_id", "fiscal_year", "revenue"]
    assert info["fiscal_years"] == [2019, 2023]
    assert outcome == {"submitted_answer": "131.0", "correct": True, "reward": 1.0, "ground_truth": "131.0"}
    assert (state.done, state.reward, state.tool_calls) == (True, 1.0, 2)


@pytest.mark.parametrize(
    "query, error",
    [
        ("DELETE FROM companies", "read-only"),
        ("UPDATE income_statement SET revenue = 0", "read-only"),
        ("INSERT INTO companies VALUES (7, 'X', 'X', 'X', 'X', 2000)", "read-only"),
        ("DROP TABLE companies", "read-only"),
        ("CREATE TABLE t (x)", "read-only"),
        ("PRAGMA writable_schema = ON", "read-only"),
        ("ATTACH DATABASE '/tmp/evil.db' AS evil", "read-only"),
        ("SELECT 1; DELETE FROM companies", "one statement"),
        ("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r", "stopped"),
        ("SELECT revenue FROM no_such_table", "no such table"),
        ("SELECT " + "1 + " * 3000 + "1", "limit is 5000"),
    ],
)
def test_sql_query_refuses_writes_and_bounds_time_and_the_session_goes_on(url: str, query: str, error: str) -> None:
    with FinQAEnv(base_url=url).sync() as env:
        env.reset(question_id="q01")
        refused = call(env, "sql_query", query=query)
        count = rows(call(env, "sql_query", query="SELECT COUNT(*), SUM(revenue) FROM income_statement"))
    assert refused.observation.error is not None and error in refused.observation.error.message
    assert (refused.done, refused.reward) == (False, 0.0)
    assert count[0][0] == 30  # nothing was changed


def test_sql_query_returns_at_most_200_rows(url: str) -> None:
    with FinQAEnv(base_url=url).sync() as env:
        env.reset(question_id="q01")
        result = json.loads(
            call(
                env, "sql_query", query="SELECT a.fiscal_year FROM income_statement a, income_statement b"
            ).observation.result
        )
    assert len(result["rows"]) == 200 and result["truncated"] is True


def test_bad_tool_calls_answer_with_errors(url: str) -> None:
    with FinQAEnv(base_url=url).sync() as env:
        env.reset(question_id="q01")
        unknown_tool = call(env, "drop_everything")
        missing_arg = call(env, "sql_query")
        bad_company = call(env, "get_descriptions", company_name="Acme")
        bad_table = call(env, "get_table_info", table_name="salaries")
        with pytest.raises(ToolCallError):
            env.call_tool("sql_query", query="DELETE FROM companies")
        with pytest.raises(ActionValidationError):
            env.step({"type": "call_tool", "name": "sql_query"})
        ok = call(env, "sql_query", query="SELECT COUNT(*) FROM companies")
    assert unknown_tool.observation.error.error_type == "tool_not_found"
    assert missing_arg.observation.error.error_type == "invalid_args"
    assert "unknown company 'Acme'" in bad_company.observation.error.message
    assert "unknown table 'salaries'" in bad_table.observation.error.message
    assert rows(ok) == [[6]]


def test_an_unknown_question_id_answers_with_an_error_observation(url: str) -> None:
    with FinQAEnv(base_url=url).sync() as env:
        bad = env.reset(question_id="q99")
        refused = call(env, "sql_query", query="SELECT 1")
        good = env.reset(question_id="q05")
    assert bad.done and "unknown question_id 'q99'" in bad.observation.metadata["error"]
    assert "call reset() first" in refused.observation.error.message
    assert not good.done and good.observation.metadata["question_id"] == "q05"


def test_the_same_seed_gives_the_same_questions(url: str) -> None:
    def sequence(env, seed: int) -> list:
        first = env.reset(seed=seed).observation.metadata["question_id"]
        return [first] + [env.reset().observation.metadata["question_id"] for _ in range(4)]

    with FinQAEnv(base_url=url).sync() as a, FinQAEnv(base_url=url).sync() as b:
        assert sequence(a, 5) == sequence(b, 5)
        assert sequence(a, 5) != sequence(a, 6)


def test_the_last_allowed_tool_call_ends_the_episode() -> None:
    for url in serve({"FINQA_MAX_STEPS": "3"}):
        with FinQAEnv(base_url=url).sync() as env:
            env.reset(question_id="q01")
            first = call(env, "get_descriptions")
            second = call(env, "sql_query", query="SELECT 1")
            third = call(env, "sql_query", query="SELECT 2")
            state = env.state()
    assert [first.done, second.done, third.done] == [False, False, True]
    assert third.reward == 0.0 and "max steps (3)" in third.observation.metadata["error"]
    assert (state.done, state.tool_calls, state.ground_truth) == (True, 3, "1233.2")


@pytest.mark.asyncio
async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with FinQAEnv(base_url=url) as a, FinQAEnv(base_url=url) as b:
        await asyncio.gather(a.reset(question_id="q01"), b.reset(question_id="q02"))
        won, _ = await asyncio.gather(
            a.step(CallToolAction(tool_name="submit_answer", arguments={"answer": "1233.2"})),
            b.step(CallToolAction(tool_name="sql_query", arguments={"query": "SELECT 1"})),
        )
        sa, sb = await asyncio.gather(a.state(), b.state())
    assert (won.reward, won.done) == (1.0, True)
    assert (sa.question_id, sa.done, sa.tool_calls) == ("q01", True, 1)
    assert (sb.question_id, sb.done, sb.tool_calls, sb.ground_truth) == ("q02", False, 1, None)


def test_a_random_agent_plays_100_episodes(url: str) -> None:
    rng = random.Random(7)
    tables = ["companies", "income_statement", "balance_sheet", "segment_revenue"]
    rewards = []
    started = time.perf_counter()
    with FinQAEnv(base_url=url).sync() as env:
        for episode in range(100):
            env.reset(seed=episode) if episode % 20 == 0 else env.reset()
            for _ in range(rng.randint(0, 3)):
                table = rng.choice(tables)
                tool, arguments = rng.choice(
                    [
                        ("get_descriptions", {}),
                        ("get_table_info", {"table_name": table}),
                        ("sql_query", {"query": f"SELECT * FROM {table} LIMIT {rng.randint(1, 5)}"}),
                    ]
                )
                result = call(env, tool, **arguments)
                assert result.observation.error is None and not result.done
            result = call(env, "submit_answer", answer=str(rng.choice([0, 1, 2022, 131.0, rng.uniform(0, 3000)])))
            assert result.done and result.reward in (0.0, 1.0)
            rewards.append(result.reward)
    elapsed = time.perf_counter() - started
    print(f"\nfinqa_env: 100 random episodes in {elapsed:.2f} s = {100 / elapsed:.1f} episodes/s")
    assert len(rewards) == 100


def test_the_readme_example_runs_as_written() -> None:
    readme = (PACKAGE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ), check=True
    ).stdout.splitlines()
    assert out == [
        "What was Northwind Robotics' revenue in fiscal year 2022, in millions of US dollars?",
        str(TOOLS),
        "reward: 1.0 done: True",
        "tool calls: 2",
    ]


def test_auto_env_finds_the_installed_package() -> None:
    from openenv import AutoAction, AutoEnv

    assert AutoEnv.get_env_class("finqa") is FinQAEnv
    assert AutoAction.from_env("finqa_env") is CallToolAction


def test_a_restored_snapshot_continues_the_episode_and_the_question_order() -> None:
    """In process: the episode goes on alike, and so do the next resets (the shuffled order, its
    position and its generator are saved); the restoring instance keeps its own database."""
    from finqa_env.server.finqa_environment import FinQAEnvironment

    from openenv.core.env_server.snapshots import SnapshotSeal

    seal = SnapshotSeal()
    original, twin = FinQAEnvironment(max_steps=5), FinQAEnvironment()
    original.reset(seed=4)
    original.step(CallToolAction(tool_name="get_descriptions", arguments={}))
    seal.restore(twin, seal.seal(original))
    assert twin._db is not original._db and twin.max_steps == 5

    def play(env) -> list:
        query = "SELECT name, ticker FROM companies ORDER BY company_id"
        out = [env.step(CallToolAction(tool_name="sql_query", arguments={"query": query}))]
        out.append(env.step(CallToolAction(tool_name="submit_answer", arguments={"answer": "131.0"})))
        trace = [(o.result.data, o.reward, o.done) for o in out] + [env.state.model_dump()]
        for _ in range(len(env.questions) + 2):  # past a reshuffle (a reset draws a new episode id)
            trace.append(env.reset().metadata["question_id"])
        return trace

    assert play(twin) == play(original)
