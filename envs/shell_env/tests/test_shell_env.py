"""shell_env served in the real sandbox (SandboxProvider) and driven by its own client.

One sandboxed server is shared by the module; the escape tests also start one without isolation
(server and commands unsandboxed) to show that each attack is real: it succeeds there.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from shell_env import CallToolAction, ListToolsAction, ShellEnv, ShellObservation
from shell_env.server.tasks import load_tasks

from openenv.core.client_errors import ServerError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.testing import host_listener, planted_secret, processes_added, processes_per_uid, wait_for

ENV_DIR = Path(__file__).resolve().parents[1]
TASK_IDS = [task.id for task in load_tasks()]

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")

SOLUTIONS = {
    "hello_file": "echo 'Hello, World!' > hello.txt",
    "count_lines": "wc -l < data.txt > count.txt",
    "sort_unique": "sort -u names.txt > sorted.txt",
    "rename_extension": 'find photos -name \'*.jpeg\' | while read -r f; do mv "$f" "${f%.jpeg}.jpg"; done',
    "fix_script": "printf '#!/bin/bash\\necho ok\\n' > run.sh && chmod +x run.sh",
    "find_todo": "grep -rl TODO src | sort > todo.txt",
    "sum_column": "awk -F, 'NR > 1 { s += $3 } END { print s }' sales.csv > total.txt",
    "edit_config": "sed -i 's/^debug = true$/debug = false/' config.ini",
    "make_tree": "mkdir -p build/bin build/lib && touch build/.keep",
    "top_word": "tr 'A-Z' 'a-z' < text.txt | tr -cs 'a-z' '\\n' | grep . | sort | uniq -c | sort -rn"
    " | awk 'NR == 1 { print $2 }' > top.txt",
    "delete_logs": "find logs -name '*.log' -delete",
    "fix_python": "sed -i 's/a - b/a + b/' calc.py",
    "json_value": 'python3 -c \'import json; print(json.load(open("settings.json"))["server"]["port"])\' > port.txt',
    "make_archive": "tar -czf backup.tar.gz docs",
}


def call(name: str, **arguments) -> CallToolAction:
    return CallToolAction(tool_name=name, arguments=arguments)


def start(isolation: str = "sandbox") -> tuple:
    env_vars = {"SHELL_ENV_ISOLATION": isolation, "OPENENV_STEP_TIMEOUT_S": "60"}
    provider = SandboxProvider(str(ENV_DIR), isolation=isolation, env_vars=env_vars)
    url = provider.start()
    provider.wait_for_ready(60)
    return provider, url


@pytest.fixture(scope="module")
def url():
    provider, base_url = start()
    yield base_url
    provider.stop()


@pytest.fixture
def env(url):
    with ShellEnv(base_url=url, message_timeout_s=60).sync() as client:
        yield client


def run(env, command: str, **arguments) -> dict:
    result = env.step(call("run_command", command=command, **arguments))
    assert result.observation.error is None, result.observation.error
    return result.observation.result


# --- episodes ------------------------------------------------------------------------------------


def test_reset_by_task_id_gives_the_instruction_and_the_files(env):
    result = env.reset(task_id="find_todo")
    observation = result.observation
    assert isinstance(observation, ShellObservation)
    assert observation.task_id == "find_todo" and "TODO" in observation.instruction
    assert observation.files == ["README.md", "src/app.py", "src/db/__init__.py", "src/db/models.py", "src/util.py"]
    assert observation.tools == ["list_dir", "read_file", "run_command", "submit", "write_file"]
    assert result.reward == 0.0 and not result.done
    state = env.state()
    assert state.task_id == "find_todo" and state.step_count == 0 and not state.submitted


def test_the_same_seed_gives_the_same_task_and_the_same_episode(env):
    def episode(seed: int) -> list:
        first = env.reset(seed=seed).observation
        trace = [first.model_dump()]
        for command in ("ls -R | sort", "echo 42 > answer.txt && cat answer.txt", "wc -c * | sort"):
            trace.append(run(env, command))
        trace.append(env.step(call("submit")).observation.result)
        return trace

    assert episode(7) == episode(7)
    assert episode(7)[0]["task_id"] == TASK_IDS[7 % len(TASK_IDS)]
    assert episode(8)[0]["task_id"] != episode(7)[0]["task_id"]


def test_every_task_scores_0_unsolved_and_1_with_its_reference_solution(env):
    assert sorted(SOLUTIONS) == sorted(TASK_IDS), "each shipped task needs a reference solution here"
    for task_id in TASK_IDS:
        env.reset(task_id=task_id)
        unsolved = env.step(call("submit"))
        assert (unsolved.reward, unsolved.done, unsolved.observation.result["passed"]) == (0.0, True, False), task_id
        env.reset(task_id=task_id)
        assert run(env, SOLUTIONS[task_id])["exit_code"] == 0, task_id
        solved = env.step(call("submit"))
        assert (solved.reward, solved.done, solved.observation.result["passed"]) == (1.0, True, True), task_id
        assert env.state().passed


def test_files_persist_between_commands_and_tools(env):
    env.reset(task_id="make_tree")
    assert run(env, "mkdir -p a/b && echo one > a/b/f.txt && chmod +x a/b/f.txt")["kept_changes"]
    assert run(env, "cat a/b/f.txt && test -x a/b/f.txt && echo executable")["stdout"] == "one\nexecutable\n"
    written = env.step(call("write_file", path="notes/todo.md", content="- ship it\n")).observation.result
    assert written == {"path": "notes/todo.md", "bytes_written": 10}
    assert run(env, "cat /workspace/notes/todo.md")["stdout"] == "- ship it\n"
    assert env.step(call("read_file", path="/workspace/a/b/f.txt")).observation.result == "one\n"
    listing = env.step(call("list_dir", path=".")).observation.result
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [("a", "dir"), ("notes", "dir")]


def test_a_command_reports_exit_code_stderr_and_truncates_long_output(env):
    env.reset(task_id="hello_file")
    failed = run(env, "echo oops >&2; exit 3")
    assert failed["exit_code"] == 3 and failed["stderr"] == "oops\n"
    long = run(env, "head -c 100000 /dev/zero | tr '\\0' x")
    assert long["stdout"].startswith("x" * 16384) and "83616 more bytes not shown" in long["stdout"]


def test_step_budget_runs_the_check_when_it_runs_out(env):
    env.reset(task_id="make_tree", max_steps=2)
    first = env.step(call("run_command", command="mkdir -p build/bin build/lib && touch build/.keep"))
    assert not first.done
    last = env.step(call("list_dir"))
    assert last.done and last.reward == 1.0 and last.observation.metadata["out_of_steps"]


# --- invalid actions -----------------------------------------------------------------------------


def test_invalid_tool_calls_are_answered_with_errors_and_the_session_goes_on(env):
    env.reset(task_id="hello_file")
    cases = [
        (call("no_such_tool"), "tool_not_found"),
        (call("run_command"), "invalid_args"),
        (call("run_command", command=["not", "a", "string"]), "invalid_args"),
        (call("read_file", path="missing.txt"), "execution_error"),
        (call("read_file", path="../../etc/passwd"), "execution_error"),
        (call("write_file", path="/etc/x", content="no"), "execution_error"),
        (call("list_dir", path="hello.txt"), "execution_error"),
        (call("run_command", command="true", timeout_s=-1), "execution_error"),
    ]
    for action, error_type in cases:
        result = env.step(action)
        assert result.observation.error is not None, action
        assert result.observation.error.error_type.value == error_type, (action, result.observation.error)
        assert result.reward == 0.0 and not result.done
    assert run(env, "echo still here")["stdout"] == "still here\n"
    assert env.step(ListToolsAction()).observation.tools


def test_calls_after_the_end_are_refused_until_reset(env):
    env.reset(task_id="hello_file")
    env.step(call("submit"))
    after = env.step(call("run_command", command="true"))
    assert after.done and "call reset()" in after.observation.error.message
    assert env.reset(task_id="hello_file").observation.task_id == "hello_file"
    assert run(env, "true")["exit_code"] == 0


def test_an_unknown_task_id_is_an_error_and_the_session_survives(env):
    with pytest.raises(ServerError, match="unknown task_id"):
        env.reset(task_id="no_such_task")
    assert env.reset(task_id="sum_column").observation.task_id == "sum_column"


# --- sessions ------------------------------------------------------------------------------------


async def test_two_sessions_at_once_have_separate_work_directories(url):
    async with (
        ShellEnv(base_url=url, message_timeout_s=60) as first,
        ShellEnv(base_url=url, message_timeout_s=60) as second,
    ):
        await asyncio.gather(first.reset(task_id="hello_file"), second.reset(task_id="count_lines"))
        await asyncio.gather(
            first.step(call("run_command", command="echo 'Hello, World!' > hello.txt; echo first > mine.txt")),
            second.step(call("run_command", command="echo second > mine.txt")),
        )
        one, two = await asyncio.gather(
            first.call_tool("read_file", path="mine.txt"), second.call_tool("read_file", path="mine.txt")
        )
        assert (one, two) == ("first\n", "second\n")
        assert not (await second.step(call("list_dir"))).observation.result["entries"][0]["name"] == "hello.txt"
        verdicts = await asyncio.gather(first.step(call("submit")), second.step(call("submit")))
        assert [v.reward for v in verdicts] == [1.0, 0.0]


# --- escapes: what the security suite tries, through this environment's tools ------------------


@pytest.fixture(scope="module")
def unsandboxed_url():
    provider, base_url = start("none")
    yield base_url
    provider.stop()


@pytest.fixture(params=["sandbox", "none"])
def attacker(request, url, unsandboxed_url):
    with ShellEnv(
        base_url=url if request.param == "sandbox" else unsandboxed_url, message_timeout_s=60
    ).sync() as client:
        client.reset(task_id="hello_file")
        client.isolation = request.param
        yield client


def answers(base_url: str) -> bool:
    with ShellEnv(base_url=base_url, message_timeout_s=30).sync() as other:
        other.reset(task_id="hello_file")
        return run(other, "echo 42")["stdout"] == "42\n"


def test_reading_a_secret_in_the_hosts_home(attacker):
    with planted_secret() as secret:
        by_command = run(attacker, f"cat {secret}")
        by_tool = attacker.step(call("read_file", path=str(secret))).observation
    assert by_tool.error is not None and "outside the work directory" in by_tool.error.message
    if attacker.isolation == "none":
        assert by_command["stdout"] == "the trainer's secret"
    else:
        assert by_command["stdout"] == "" and "No such file" in by_command["stderr"]


def test_connecting_to_a_listener_on_the_hosts_loopback(attacker):
    with host_listener() as listener:
        result = run(attacker, f"exec 3<>/dev/tcp/127.0.0.1/{listener.port} && head -c 4 <&3", timeout_s=5)
    accepted = listener.accepted
    if attacker.isolation == "none":
        assert result["stdout"] == "pong" and accepted
    else:
        assert result["exit_code"] != 0
        assert "Connection refused" in result["stderr"] or "unreachable" in result["stderr"]
        assert not accepted


def test_writing_into_the_environment_package(attacker):
    target = ENV_DIR / f"pwned-{uuid.uuid4().hex}.txt"
    try:
        result = run(attacker, f"echo pwned > {target}")
        if attacker.isolation == "none":
            assert target.exists()
        else:
            # The package is not even in the command's sandbox (only the standard library is).
            assert not target.exists() and "No such file or directory" in result["stderr"]
    finally:
        target.unlink(missing_ok=True)


def test_writing_into_etc(env):
    target = Path("/etc") / f"openenv-shell-pwned-{uuid.uuid4().hex}"
    env.reset(task_id="hello_file")
    try:
        result = run(env, f"echo pwned > {target}")
        refused = env.step(call("write_file", path=str(target), content="pwned")).observation
        assert not target.exists()
        assert result["exit_code"] != 0 and "Read-only file system" in result["stderr"]
        assert refused.error is not None
    finally:
        target.unlink(missing_ok=True)


def test_seeing_host_processes(attacker):
    result = run(attacker, f"test -e /proc/{os.getpid()} && echo visible; ls /proc | grep -c '^[0-9]'")
    count = int(result["stdout"].split()[-1])
    if attacker.isolation == "none":
        assert "visible" in result["stdout"] and count > 10
    else:
        assert "visible" not in result["stdout"]
        assert count <= 8  # the sandbox's init, the launcher, the command and its pipeline


def test_a_fork_bomb_is_bounded_and_the_server_keeps_answering(env, url):
    env.reset(task_id="hello_file")
    # Commands run as a uid of their own each (as root, through the server's broker), or as the
    # server's in a user namespace: either way the bomb's processes all share one uid.
    before = processes_per_uid(below=os.getpid())
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max([peak[0], *processes_added(before, below=os.getpid()).values()])
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        result = run(env, "bomb() { bomb | bomb & }; bomb; sleep 3", timeout_s=4)
    finally:
        done.set()
        watcher.join()
    assert time.monotonic() - started < 15
    assert "Resource temporarily unavailable" in result["stderr"] or "retry" in result["stderr"]
    assert 20 < peak[0] <= 64 + 8  # it did multiply, up to the process limit (64) and no further
    assert wait_for(lambda: not processes_added(before, below=os.getpid())), processes_added(
        before, below=os.getpid()
    )  # and nothing is left behind
    assert answers(url)
    assert run(env, "echo alive")["stdout"] == "alive\n"


def test_an_infinite_loop_is_killed_by_the_timeout_while_other_sessions_are_served(env, url):
    env.reset(task_id="hello_file")
    box: dict = {}

    def spin() -> None:
        started = time.monotonic()
        box["result"] = run(env, "while true; do :; done", timeout_s=3)
        box["elapsed"] = time.monotonic() - started

    spinner = threading.Thread(target=spin)
    spinner.start()
    time.sleep(0.5)
    served = time.monotonic()
    assert answers(url)  # another session, answered while the loop spins
    assert time.monotonic() - served < 3 and spinner.is_alive()
    spinner.join(30)
    assert box["result"]["timed_out"] and box["result"]["exit_code"] == 124
    assert 3 <= box["elapsed"] < 10
    assert run(env, "echo alive")["stdout"] == "alive\n"  # the same session goes on


def test_commands_leave_no_processes_or_zombies_behind(env):
    env.reset(task_id="hello_file")
    before = processes_per_uid(below=os.getpid())
    for _ in range(20):
        run(env, "sleep 30 & (setsid sleep 30 &) ; true")
    assert wait_for(lambda: not processes_added(before, below=os.getpid())), processes_added(before, below=os.getpid())


@pytest.mark.xfail(
    os.geteuid() != 0,
    strict=True,
    reason="known gap: without root, a server bwrap started sees only a /proc with read-only submounts, so the "
    "kernel refuses the nested command sandbox its own /proc",
)
def test_commands_work_in_a_cold_started_sandbox():
    provider = SandboxProvider(str(ENV_DIR), warm=False)
    base_url = provider.start()
    try:
        provider.wait_for_ready(60)
        with ShellEnv(base_url=base_url, message_timeout_s=60).sync() as client:
            client.reset(task_id="hello_file")
            result = client.step(call("run_command", command="echo nested")).observation
            assert result.error is None, result.error.message
            assert result.result["stdout"] == "nested\n"
    finally:
        provider.stop()


# --- agents and docs -----------------------------------------------------------------------------

_WORDS = ["a.txt", "b", "data.txt", "src", "logs", "x y", "..", "/etc/passwd", "/workspace/z", "", "ü", "notes/n.md"]
_COMMANDS = [
    "ls -la",
    "cat {w}",
    "echo {w} > {w2}",
    "mkdir -p {w}",
    "rm -rf {w}",
    "wc -l {w}",
    "sort {w} | uniq -c",
    "find . -type f | head",
    "grep -r {w} .",
    "exit {n}",
    "sleep 0.{n}",
    "{w}",
]


def random_action(rng: random.Random, files: list) -> CallToolAction:
    words = _WORDS + files
    w, w2, n = rng.choice(words), rng.choice(words), rng.randrange(10)
    tool = rng.choice(["run_command", "run_command", "read_file", "write_file", "list_dir", "no_such_tool"])
    if tool == "run_command":
        arguments = {"command": rng.choice(_COMMANDS).format(w=w, w2=w2, n=n), "timeout_s": rng.choice([1, 2, 5])}
    elif tool == "read_file":
        arguments = {"path": w}
    elif tool == "write_file":
        arguments = {"path": w, "content": "".join(rng.choices("abc\n ", k=rng.randrange(40)))}
    elif tool == "list_dir":
        arguments = rng.choice([{}, {"path": w}])
    else:
        arguments = {"x": n}
    if rng.random() < 0.05:
        arguments = {"bogus": w}  # malformed on purpose
    return call(tool, **arguments)


def test_a_random_agent_plays_100_episodes_without_an_error(env):
    rng = random.Random(1234)
    episodes, steps, rewards = 100, 0, []
    started = time.monotonic()
    for episode in range(episodes):
        observation = env.reset(seed=episode).observation
        for _ in range(rng.randrange(1, 5)):
            result = env.step(random_action(rng, observation.files))
            steps += 1
            assert result.reward == 0.0 and not result.done
        verdict = env.step(call("submit"))
        assert verdict.done and verdict.reward in (0.0, 1.0) and verdict.observation.error is None
        rewards.append(verdict.reward)
    elapsed = time.monotonic() - started
    print(
        f"\nshell_env random agent: {episodes} episodes, {steps + episodes} steps in {elapsed:.1f} s: "
        f"{episodes / elapsed:.1f} episodes/s, {(steps + episodes) / elapsed:.1f} steps/s, mean reward {sum(rewards) / episodes:.2f}"
    )


def test_the_readme_example_runs_as_written():
    readme = (ENV_DIR / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ENV_DIR.parent)
    assert done.returncode == 0, done.stderr
    assert "reward: 1.0 done: True" in done.stdout and "count.txt: 17" in done.stdout
