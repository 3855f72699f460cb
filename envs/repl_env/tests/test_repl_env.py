"""repl_env served in a real bubblewrap sandbox and driven through REPLEnv.

Each session's interpreter is its own sandboxed worker process, started by the (itself
sandboxed) server; the tests look at those workers from the host.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from repl_env import REPLAction, REPLEnv, REPLObservation
from repl_env.server.repl_environment import answers_match, load_tasks

from openenv.core.client_errors import ActionValidationError, NotSupportedError, ServerError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime._linux import descendants
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.generic_client import GenericEnvClient
from openenv.testing import wait_for

PACKAGE = Path(__file__).resolve().parents[1]
TIMEOUT_S = 2
TASKS = {task["id"]: task for task in load_tasks()}

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed repl_env server for the whole module."""
    provider = SandboxProvider(str(PACKAGE), env_vars={"REPL_TIMEOUT_S": str(TIMEOUT_S)})
    provider.start()
    try:
        provider.wait_for_ready(60)
        assert provider.base_url is not None
        yield provider.base_url
    finally:
        provider.stop()


@pytest.fixture
def env(url: str) -> Iterator:
    with REPLEnv(base_url=url, message_timeout_s=60).sync() as client:
        yield client


def _processes_of_uid(uid: int) -> list:
    """(pid, state, command line) of the host's processes that run as ``uid``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if int(fields["Uid"].split()[0]) == uid:
            found.append((int(pid), fields["State"][0], cmdline))
    return found


SANDBOX_UIDS = 1_000_000  # where the uids of sandboxes start (isolation.sandbox_uid)


def _processes_from_uid(low: int) -> list:
    """(pid, command line) of this process's descendants (its sandboxes: not other test runs')
    that run as ``low`` or a higher uid."""
    found = []
    for pid in map(str, descendants(os.getpid())):
        try:
            uid = int(Path(f"/proc/{pid}/status").read_text().split("\nUid:\t")[1].split()[0])
            if uid >= low:
                found.append(
                    (pid, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                )
        except (OSError, IndexError, ValueError):
            continue
    return sorted(found)


def _workers(uid: int) -> list:
    return [p for p in _processes_of_uid(uid) if "repl_worker" in p[2]]


# --- tasks and episodes --------------------------------------------------------------------------


def test_twenty_tasks_ship_with_the_package() -> None:
    assert len(TASKS) == 20
    assert all(task["prompt"] and task["answer"] for task in TASKS.values())


def test_reset_loads_the_tasks_context_into_the_interpreter(env) -> None:
    result = env.reset(task_id="sum_numbers", episode_id="e1")
    observation = result.observation
    task = TASKS["sum_numbers"]
    assert observation.task_prompt == task["prompt"]
    assert (observation.context_preview, observation.context_length) == (task["context"], len(task["context"]))
    assert observation.available_variables == ["context"]
    assert (observation.iteration, observation.max_iterations) == (0, 30)
    assert result.reward == 0.0 and result.done is False
    assert env.execute("context").observation.result.stdout == repr(task["context"]) + "\n"
    state = env.state()
    assert (state.episode_id, state.task_id, state.iteration, state.final_answer) == ("e1", "sum_numbers", 1, None)


def test_the_seed_chooses_the_task(url: str) -> None:
    def first(seed: int) -> REPLObservation:
        with REPLEnv(base_url=url).sync() as env:
            return env.reset(seed=seed).observation

    assert first(3) == first(3)
    assert len({first(seed).task_prompt for seed in range(8)}) > 1


def test_variables_persist_between_steps_and_only_changes_are_reported(env) -> None:
    env.reset(task_id="gcd")
    first = env.execute("a, b = map(int, context.split())\nimport math")
    snapshot = first.observation.result.locals_snapshot
    assert sorted(snapshot) == ["a", "b", "math"]
    assert (snapshot["a"], snapshot["b"]) == ("462", "1071") and snapshot["math"].startswith("<module 'math")
    second = env.execute("b = math.gcd(a, b)\nb")
    assert second.observation.result.stdout == "21\n"
    assert second.observation.result.locals_snapshot == {"b": "21"}
    assert second.observation.available_variables == ["a", "b", "context", "math"]
    assert env.list_variables() == ["a", "b", "context", "math"]
    assert second.reward == 0.0 and second.done is False


def test_a_correct_final_answer_ends_the_episode_with_reward_1(env) -> None:
    env.reset(task_id="sum_numbers")
    env.execute("total = sum(int(x) for x in context.split(','))")
    result = env.submit_final_answer(" 444 ")
    assert result.done is True and result.reward == 1.0
    assert env.state().final_answer == " 444 "


@pytest.mark.parametrize(
    ("task_id", "code", "reward"),
    [
        ("max_number", "print('FINAL(99)')", 1.0),
        ("max_number", "print('FINAL(98)')", 0.0),
        (
            "even_numbers",
            "evens = [n for n in map(int, context.split(',')) if n % 2 == 0]\nprint('FINAL_VAR(evens)')",
            1.0,
        ),
        ("sorted_numbers", "answer = {'content': sorted(map(int, context.split(','))), 'ready': True}", 1.0),
        ("palindrome", "answer = {'content': 'True', 'ready': False}", 0.0),
    ],
)
def test_answers_given_from_code(env, task_id: str, code: str, reward: float) -> None:
    env.reset(task_id=task_id)
    result = env.execute(code)
    assert result.observation.result.success
    assert result.reward == reward
    assert result.done is (code != "answer = {'content': 'True', 'ready': False}")


def test_failing_code_costs_005_and_says_why(env) -> None:
    env.reset(task_id="gcd")
    result = env.execute("x = 1\n1 / 0")
    block = result.observation.result
    assert (block.success, block.exception) == (False, "ZeroDivisionError: division by zero")
    assert "Traceback" in block.stderr and block.locals_snapshot == {"x": "1"}
    assert result.reward == pytest.approx(-0.05) and result.done is False
    final = env.step(REPLAction(code="1 / 0", is_final=True, final_answer="21"))
    assert final.done is True and final.reward == pytest.approx(1.0 - 0.05)


def test_running_out_of_iterations_costs_01_and_ends_the_episode(env) -> None:
    env.reset(task_id="gcd", max_iterations=2)
    assert env.execute("pass").done is False
    last = env.execute("pass")
    assert last.done is True and last.reward == pytest.approx(-0.1)
    after = env.execute("print('too late')")
    assert after.done is True and after.reward == 0.0
    assert after.observation.result.stdout == "" and "reset()" in after.observation.result.exception


def test_a_custom_task_from_reset(env) -> None:
    observation = env.reset(context="a b c", task_prompt="How many words?", expected_answer="3").observation
    assert (observation.task_prompt, observation.context_preview) == ("How many words?", "a b c")
    assert env.execute("print(f'FINAL({len(context.split())})')").reward == 1.0
    env.reset(context="unscored", task_prompt="Anything")
    assert env.submit_final_answer("whatever").reward == 0.0


def test_answers_match_by_text_or_by_literal() -> None:
    assert answers_match("[4,7, 8]", "[4, 7, 8]")
    assert answers_match("42.0", "42") and answers_match("'hello world'", "hello world")
    assert answers_match("  hello world\n", "hello world")
    assert not answers_match("[4, 8, 7]", "[4, 7, 8]") and not answers_match(None, "1")
    assert not answers_match("(" * 10_000, "1")


# --- invalid input -------------------------------------------------------------------------------


def test_invalid_actions_are_refused_and_the_session_goes_on(url: str) -> None:
    with GenericEnvClient(base_url=url).sync() as raw:
        raw.reset(task_id="gcd")
        raw.step({"code": "kept = 7"})
        for bad in ({"code": 5}, {"is_final": "maybe"}, {"code": "pass", "extra": 1}):
            with pytest.raises(ActionValidationError):
                raw.step(bad)
        assert raw.step({"code": "print(kept)"}).observation["result"]["stdout"] == "7\n"
        assert raw.state()["iteration"] == 2


def test_an_unknown_task_is_an_error_and_the_session_goes_on(env) -> None:
    with pytest.raises(ServerError, match="unknown task_id 'nope'"):
        env.reset(task_id="nope")
    assert env.reset(task_id="gcd").observation.task_prompt == TASKS["gcd"]["prompt"]


# --- the sandboxed worker ------------------------------------------------------------------------


def test_an_infinite_loop_is_killed_and_the_next_step_gets_a_fresh_interpreter(env) -> None:
    env.reset(task_id="gcd")
    env.execute("lost = 1")
    started = time.monotonic()
    looped = env.execute("while True:\n    pass")
    assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 5
    assert looped.observation.result.success is False
    assert f"timed out after {TIMEOUT_S:g} s" in looped.observation.result.stderr
    assert looped.reward == pytest.approx(-0.05)
    after = env.execute("print(len(context), 'lost' in globals())")
    assert after.observation.result.stdout == "8 False\n"
    assert "`context` was loaded again" in after.observation.result.stderr


def test_the_interpreter_cannot_read_the_hosts_home_or_allocate_8_gb(env) -> None:
    secret = Path.home() / f".openenv-repl-{uuid.uuid4().hex}"
    secret.write_text("the trainer's secret")
    try:
        env.reset(task_id="gcd")
        read = env.execute(f"open({str(secret)!r}).read()").observation.result
    finally:
        secret.unlink()
    assert read.success is False and "secret" not in read.stdout
    assert read.exception.startswith(("FileNotFoundError", "PermissionError"))
    big = env.execute("block = bytearray(8 * 1024 ** 3)").observation.result
    assert big.success is False and big.exception.startswith("MemoryError")
    assert env.execute("print('alive')").observation.result.stdout == "alive\n"


async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with REPLEnv(base_url=url) as a, REPLEnv(base_url=url) as b:
        await asyncio.gather(a.reset(task_id="gcd"), b.reset(task_id="caesar"))
        await asyncio.gather(a.execute("x = 'a'"), b.execute("x = 'b'"))
        xa, xb = await asyncio.gather(a.execute("x"), b.execute("x"))
        state_a, state_b = await asyncio.gather(a.state(), b.state())
    assert (xa.observation.result.stdout, xb.observation.result.stdout) == ("'a'\n", "'b'\n")
    assert (state_a.task_id, state_b.task_id) == ("gcd", "caesar")


def test_closing_a_session_kills_its_worker(url: str) -> None:
    first = REPLEnv(base_url=url).sync()
    second = REPLEnv(base_url=url).sync()
    uids: list = []
    try:
        first.reset(task_id="gcd")
        second.reset(task_id="gcd")
        for env in (first, second):
            uids.append(int(env.execute("import os\nos.getuid()").observation.result.stdout))
        if os.geteuid() == 0:  # the server's broker gives each worker a uid of its own
            assert uids[0] != uids[1]

        def workers() -> list:
            return [p for uid in sorted(set(uids)) for p in _workers(uid)]

        both = workers()
        assert len(both) >= 2, "the sessions' workers should be running"
        first.close()
        assert wait_for(lambda: 0 < len(workers()) < len(both))
        if uids[0] != uids[1]:
            assert not _workers(uids[0]) and _workers(uids[1])
        assert second.execute("print('still mine')").observation.result.stdout == "still mine\n"
    finally:
        first.close()
        second.close()
    assert wait_for(lambda: not any(_workers(uid) for uid in uids))
    assert not [p for uid in uids for p in _processes_of_uid(uid) if p[1] == "Z"]  # no zombie left either


def test_resets_leave_no_process_behind(env) -> None:
    env.reset(task_id="gcd")
    uid = int(env.execute("import os\nos.getuid()").observation.result.stdout)
    # As root each worker runs as a uid of its own; else as the server's: count what runs as either.
    low = min(uid, SANDBOX_UIDS)
    before = _processes_from_uid(low)
    for _ in range(5):
        env.reset(task_id="gcd")
        env.execute("import subprocess\nsubprocess.Popen(['sleep', '60'])")
    env.reset(task_id="gcd")  # the last sleep's worker goes too
    assert wait_for(lambda: len(_processes_from_uid(low)) == len(before)), (before, _processes_from_uid(low))


# --- a random agent ------------------------------------------------------------------------------

SNIPPETS = (
    "x = {a}",
    "y = [i * {a} for i in range(5)]\nprint(y)",
    "words = context.split()\nlen(words)",
    "print(context[::-1][:{a}])",
    "z = undefined_name + {a}",
    "import math\nmath.sqrt({a})",
    "def f(n):\n    return n * {b}\nf({a})",
    "s = sorted(set(context))",
    "raise RuntimeError('random failure {a}')",
)


def test_a_random_agent_plays_100_episodes(url: str) -> None:
    rng = random.Random(99)
    steps, solved = 0, 0
    started = time.monotonic()
    with REPLEnv(base_url=url, message_timeout_s=60).sync() as env:
        for episode in range(100):
            result = env.reset(seed=episode, max_iterations=4)
            assert result.observation.available_variables == ["context"]
            while not result.done:
                roll = rng.random()
                guess = str(rng.randint(0, 500))
                if roll < 0.2:
                    result = env.submit_final_answer(guess)
                elif roll < 0.3:
                    result = env.execute(f"print('FINAL({guess})')")
                else:
                    code = rng.choice(SNIPPETS).format(a=rng.randint(1, 100), b=rng.randint(1, 100))
                    result = env.execute(code)
                steps += 1
                assert isinstance(result.reward, float) and result.observation.iteration <= 4
            solved += result.reward > 0.5
    elapsed = time.monotonic() - started
    print(
        f"\nrepl_env random agent: 100 episodes, {steps} steps in {elapsed:.1f} s: "
        f"{100 / elapsed:.1f} episodes/s, {steps / elapsed:.1f} steps/s ({solved} solved by luck)"
    )


# --- the README's example ------------------------------------------------------------------------


def test_the_readme_example_runs_as_written() -> None:
    readme = (PACKAGE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/tmp")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [TASKS["sum_numbers"]["prompt"], "444", "True 1.0"]


def test_auto_env_finds_the_installed_package() -> None:
    from openenv import AutoAction, AutoEnv

    assert AutoEnv.get_env_class("repl") is REPLEnv
    assert AutoAction.from_env("repl") is REPLAction


def test_the_interpreter_imports_the_standard_library_only_unless_packages_are_named() -> None:
    pytest.importorskip("numpy")
    from repl_env.server.repl_environment import REPLEnvironment

    code = "import numpy\nprint(numpy.arange(3).sum())"
    for packages, expected in (((), "No module named 'numpy'"), (("numpy",), "3\n")):
        env = REPLEnvironment(packages=packages)
        try:
            env.reset(task_id="max_number")
            result = env.step(REPLAction(code=code)).result
            assert expected in result.stdout + result.stderr
        finally:
            env.close()


# --- snapshots: a replay of the session's requests, exact for deterministic code --------------


@pytest.fixture(scope="module")
def local_url() -> Iterator[str]:
    """A repl_env server in this process (this checkout's core), its workers sandboxed."""
    import functools

    from repl_env import REPLState
    from repl_env.server.repl_environment import REPLEnvironment

    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.serving.runner import BackgroundServer

    app = create_app(
        functools.partial(REPLEnvironment, timeout_s=TIMEOUT_S),
        REPLAction,
        REPLObservation,
        env_name="repl_env",
        state_cls=REPLState,
        max_concurrent_envs=16,
    )
    with BackgroundServer(app) as server:
        yield server.base_url


def _seen(result) -> tuple:
    """A step's observation, reward and done, but the seconds its code took."""
    observation = dict(result.observation)
    observation["result"] = {k: v for k, v in observation["result"].items() if k != "execution_time"}
    return observation, result.reward, result.done


def _state_of(snapshot) -> dict:
    """What a snapshot holds (the header says how long it is; the body is zlib'd JSON)."""
    import json
    import struct
    import zlib

    start = len(b"OPENENV-SNAPSHOT/1\n") + 32
    (length,) = struct.unpack_from(">I", snapshot.data, start)
    return json.loads(zlib.decompress(snapshot.data[start + 4 + length :]))


async def test_forks_replay_the_session_with_its_hash_order_and_objects(local_url: str) -> None:
    async with GenericEnvClient(base_url=local_url, message_timeout_s=60) as env:
        await env.reset(task_id="sum_numbers")
        words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda omicron sigma".split()
        await env.step({"code": f"words = set({words!r})\nclass Box:\n    pass\nbox = Box()\nprint(box)"})
        forks = await env.fork(2)
        steps = [{"code": "print(list(words))"}, {"code": "box.size = len(words)\nprint(box.size)"}, {"code": "1/0"}]
        expected = [_seen(await env.step(step)) for step in steps]
        assert expected[0][0]["result"]["stdout"] != f"{words}\n"  # (the order is the hash seed's)
        assert expected[1][0]["result"]["locals_snapshot"] == {}  # box is the same object: not reported
        assert 'File "<cell' in expected[2][0]["result"]["stderr"]  # the same cell numbers, too
        for fork in forks:
            assert [_seen(await fork.step(step)) for step in steps] == expected


async def test_a_snapshot_after_a_timeout_continues_in_a_fresh_interpreter(local_url: str) -> None:
    async with GenericEnvClient(base_url=local_url, message_timeout_s=60) as env:
        await env.reset(task_id="sum_numbers")
        await env.step({"code": "x = 1"})
        timed_out = await env.step({"code": "while True:\n    pass"})
        assert "timed out" in timed_out.observation["result"]["stderr"]
        (fork,) = await env.fork(1)
        steps = [{"code": "print(len(context))\nx"}, {"code": "x = 2\nprint(x)"}]
        expected = [_seen(await env.step(step)) for step in steps]
        assert "a fresh interpreter was started" in expected[0][0]["result"]["stderr"]
        assert "NameError" in expected[0][0]["result"]["stderr"]
        assert [_seen(await fork.step(step)) for step in steps] == expected


async def test_code_that_does_not_replay_the_same_is_refused_at_restore(local_url: str) -> None:
    async with GenericEnvClient(base_url=local_url, message_timeout_s=60) as env:
        await env.reset(task_id="sum_numbers")
        await env.step({"code": "import os\ntoken = os.urandom(8).hex()"})
        snapshot = await env.snapshot()  # taken: whether it replays shows when it is restored
        with pytest.raises(ServerError, match="not deterministic") as refused:
            await env.restore(snapshot)
        assert "listing of variables" in str(refused.value)  # where it diverged: `token`'s value
        assert (await env.state())["task_id"] is None  # the session goes on, with a fresh environment
        await env.reset(task_id="sum_numbers")
        assert (await env.step({"code": "print(len(context))"})).observation["result"]["stdout"] == "43\n"


async def test_background_work_refuses_a_snapshot_until_it_is_over(local_url: str) -> None:
    async with GenericEnvClient(base_url=local_url, message_timeout_s=60) as env:
        await env.reset(task_id="sum_numbers")
        await env.step({"code": "import subprocess\np = subprocess.Popen(['sleep', '30'])"})
        with pytest.raises(NotSupportedError, match=r"left work running: 1 process"):
            await env.snapshot()
        await env.step({"code": "p.kill(); p.wait()"})
        await env.snapshot()  # once it is over


async def test_a_shipped_tasks_answer_is_not_in_the_snapshot(local_url: str) -> None:
    async with GenericEnvClient(base_url=local_url, message_timeout_s=60) as env:
        await env.reset(task_id="sum_numbers")
        snapshot = await env.snapshot()
        assert TASKS["sum_numbers"]["answer"] not in str(_state_of(snapshot))
        (fork,) = await env.fork(1)
        answered = await fork.step({"code": "print(f'FINAL({sum(int(x) for x in context.split(\",\"))})')"})
        assert answered.done and answered.reward == 1.0  # the fork looked the answer up
        await env.reset(context="1,2", task_prompt="sum", expected_answer="3")  # a custom task's travels
        (custom,) = await env.fork(1)
        assert (await custom.step({"is_final": True, "final_answer": "3"})).reward == 1.0
