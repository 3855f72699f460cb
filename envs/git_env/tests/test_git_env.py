"""git_env served in the real sandbox (SandboxProvider) and driven by its own client.

Every git command runs inside the nested command sandbox of shell_env's Workspace: these tests
show git is there, configured, deterministic, and that each shipped task is solvable.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from git_env import CallToolAction, GitEnv, GitObservation, ListToolsAction
from git_env.server.git_environment import TASKS_FILE
from shell_env.server.tasks import load_tasks

from openenv.core.client_errors import ServerError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import find_bwrap

ENV_DIR = Path(__file__).resolve().parents[1]
TASK_IDS = [task.id for task in load_tasks(TASKS_FILE)]

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")

SOLUTIONS = {
    "fix_failing_test": "sed -i 's/(len(values) + 1)/len(values)/' calc.py && git commit -qam 'Fix average'",
    "create_branch": "git checkout -q -b feature/greeting && echo hello > greeting.txt && git add greeting.txt"
    " && git commit -qm 'Add greeting' && git checkout -q main",
    "revert_last_commit": "git revert --no-edit HEAD",
    "merge_feature": "git merge --no-edit feature",
    "amend_message": "git commit --amend -q -m 'Fix typo in notes'",
    "untrack_build": "git rm -r -q --cached build && echo 'build/' > .gitignore && git add .gitignore"
    " && git commit -qm 'Stop tracking build'",
    "cherry_pick_fix": "git cherry-pick hotfix",
    "resolve_conflict": "git merge feature > /dev/null; printf 'hello from main\\nhello from feature\\n' > greeting.txt"
    " && git add greeting.txt && git commit -q --no-edit",
}


def call(name: str, **arguments) -> CallToolAction:
    return CallToolAction(tool_name=name, arguments=arguments)


@pytest.fixture(scope="module")
def url():
    provider = SandboxProvider(str(ENV_DIR), env_vars={"OPENENV_STEP_TIMEOUT_S": "60"})
    base_url = provider.start()
    provider.wait_for_ready(60)
    yield base_url
    provider.stop()


@pytest.fixture
def env(url):
    with GitEnv(base_url=url, message_timeout_s=60).sync() as client:
        yield client


def tool(env, name: str, **arguments) -> dict:
    result = env.step(call(name, **arguments))
    assert result.observation.error is None, result.observation.error
    return result.observation.result


def test_reset_builds_the_tasks_repository(env):
    result = env.reset(task_id="merge_feature")
    observation = result.observation
    assert isinstance(observation, GitObservation)
    assert observation.task_id == "merge_feature" and "feature" in observation.instruction
    assert observation.files == ["README.md", "app.py"]  # .git is not listed
    assert {"git_status", "git_log", "git_diff", "execute_git_command", "run_command", "submit"} <= set(
        observation.tools
    )
    log = tool(env, "git_log", all_branches=True)["stdout"]
    assert "(feature) Add feature" in log and "(HEAD -> main) Update readme" in log and "Initial commit" in log
    assert tool(env, "git_status")["stdout"] == "## main\n"


def test_git_works_in_the_sandbox_with_an_identity_from_the_work_directory(env):
    env.reset(task_id="create_branch")
    where = tool(env, "run_command", command="command -v git && git --version && git config user.name && pwd")
    assert where["exit_code"] == 0 and where["stdout"].startswith("/usr/bin/git\ngit version ")
    assert where["stdout"].endswith("Agent\n/workspace\n")
    tool(env, "write_file", path="notes.txt", content="a note\n")
    assert "?? notes.txt" in tool(env, "git_status")["stdout"]
    assert tool(env, "execute_git_command", command="add notes.txt")["exit_code"] == 0
    assert "+a note" in tool(env, "git_diff", staged=True)["stdout"]
    committed = tool(env, "execute_git_command", command='git commit -m "Add a note, with spaces"')
    assert committed["exit_code"] == 0, committed
    shown = tool(env, "execute_git_command", command="log -1 --format=%an|%ae|%s")["stdout"]
    assert shown == "Agent|agent@example.com|Add a note, with spaces\n"


def test_execute_git_command_runs_no_shell(env):
    env.reset(task_id="create_branch")
    result = tool(env, "execute_git_command", command="status; touch pwned")
    assert result["exit_code"] != 0
    assert "pwned" not in [entry["name"] for entry in tool(env, "list_dir")["entries"]]


def test_the_same_seed_gives_the_same_repository_and_the_same_commits(env):
    def episode(seed: int) -> list:
        trace = [env.reset(seed=seed).observation.model_dump()]
        trace.append(
            tool(env, "run_command", command="echo change >> extra.txt && git add -A && git commit -qm change")
        )
        trace.append(tool(env, "git_log", all_branches=True))
        trace.append(tool(env, "run_command", command="git rev-parse HEAD"))
        return trace

    first = episode(3)
    assert first == episode(3)
    assert first[0]["task_id"] == TASK_IDS[3 % len(TASK_IDS)]
    assert episode(4)[0]["task_id"] != first[0]["task_id"]


def test_a_restored_repository_is_the_one_saved_even_mid_merge(env):
    """A snapshot carries the whole work directory, .git included (objects, refs, index, a merge
    in progress); restored, git sees the same repository and the episode goes on."""
    env.reset(task_id="resolve_conflict")
    tool(env, "run_command", command="git merge feature; git stash list; echo draft > untracked.txt")

    def looks() -> list:
        return [
            tool(env, "git_status")["stdout"],
            tool(env, "git_log", all_branches=True)["stdout"],
            tool(env, "git_diff")["stdout"],
            tool(
                env,
                "run_command",
                command="git fsck --strict --no-dangling && git rev-parse MERGE_HEAD && stat -c '%n %a %s %Y' *",
            )["stdout"],
        ]

    before = looks()
    assert "UU greeting.txt" in before[0] and "?? untracked.txt" in before[0]
    snapshot = env.snapshot()
    tool(env, "run_command", command="git merge --abort && git commit -q --allow-empty -m other && rm untracked.txt")
    assert looks() != before
    env.restore(snapshot)
    assert env.state().step_count == 5  # the counters are the saved ones
    assert looks() == before
    tool(env, "run_command", command="rm untracked.txt && " + SOLUTIONS["resolve_conflict"].split("; ", 1)[1])
    assert env.step(call("submit")).reward == 1.0


def test_every_task_scores_0_unsolved_and_1_with_its_reference_solution(env):
    assert sorted(SOLUTIONS) == sorted(TASK_IDS), "each shipped task needs a reference solution here"
    for task_id in TASK_IDS:
        env.reset(task_id=task_id)
        unsolved = env.step(call("submit"))
        assert (unsolved.reward, unsolved.done) == (0.0, True), task_id
        env.reset(task_id=task_id)
        ran = tool(env, "run_command", command=SOLUTIONS[task_id])
        assert ran["exit_code"] == 0, (task_id, ran)
        solved = env.step(call("submit"))
        assert (solved.reward, solved.done) == (1.0, True), (task_id, solved.observation.result)


def test_a_wrong_solution_scores_0(env):
    env.reset(task_id="fix_failing_test")
    tool(env, "write_file", path="test_calc.py", content="import unittest\n")  # "fixing" the test instead
    tool(env, "run_command", command="git commit -qam 'Delete the tests'")
    assert env.step(call("submit")).reward == 0.0
    env.reset(task_id="revert_last_commit")
    tool(env, "run_command", command="git reset -q --hard HEAD~1")  # rewrites history
    assert env.step(call("submit")).reward == 0.0


def test_invalid_calls_are_answered_with_errors_and_the_session_goes_on(env):
    env.reset(task_id="create_branch")
    cases = [
        (call("git_push"), "tool_not_found"),
        (call("git_log", max_count="many"), "invalid_args"),
        (call("git_log", max_count=0), "execution_error"),
        (call("execute_git_command", command=""), "execution_error"),
        (call("execute_git_command", command="commit -m 'unterminated"), "execution_error"),
        (call("execute_git_command", command="status", working_dir="../.."), "execution_error"),
        (call("execute_git_command", command="status", working_dir="README.md"), "execution_error"),
    ]
    for action, error_type in cases:
        result = env.step(action)
        assert result.observation.error is not None, action
        assert result.observation.error.error_type.value == error_type, (action, result.observation.error)
        assert result.reward == 0.0 and not result.done
    failed = tool(env, "execute_git_command", command="checkout no-such-branch")
    assert failed["exit_code"] != 0 and "no-such-branch" in failed["stderr"]
    with pytest.raises(ServerError, match="unknown task_id"):
        env.reset(task_id="no_such_task")
    assert env.reset(task_id="amend_message").observation.task_id == "amend_message"
    assert env.step(ListToolsAction()).observation.tools


def test_git_cannot_reach_the_hosts_network(env):
    env.reset(task_id="create_branch")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    accepted = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(listener.accept())

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    result = tool(env, "execute_git_command", command=f"ls-remote http://127.0.0.1:{port}/repo.git", timeout_s=5)
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join(5)
    assert result["exit_code"] != 0 and not accepted


async def test_two_sessions_at_once_have_separate_repositories(url):
    async with (
        GitEnv(base_url=url, message_timeout_s=60) as first,
        GitEnv(base_url=url, message_timeout_s=60) as second,
    ):
        await asyncio.gather(first.reset(task_id="amend_message"), second.reset(task_id="amend_message"))
        await asyncio.gather(
            first.step(call("execute_git_command", command="commit --amend -q -m 'Fix typo in notes'")),
            second.step(call("execute_git_command", command="checkout -q -b other")),
        )
        one, two = await asyncio.gather(first.call_tool("git_log", max_count=1), second.call_tool("git_status"))
        assert "Fix typo in notes" in one["stdout"] and two["stdout"] == "## other\n"
        verdicts = await asyncio.gather(first.step(call("submit")), second.step(call("submit")))
        assert [v.reward for v in verdicts] == [1.0, 0.0]


_WORDS = ["main", "feature", "hotfix", "x", "HEAD~1", "HEAD", "..", "README.md", "-", "greeting.txt", "nope"]
_GIT = [
    "status",
    "log --oneline",
    "branch {w}",
    "checkout {w}",
    "checkout -b {w}",
    "add {w}",
    "add -A",
    "commit -m {w}",
    "commit -am 'random commit'",
    "reset --hard {w}",
    "merge {w}",
    "revert --no-edit {w}",
    "cherry-pick {w}",
    "stash",
    "diff {w}",
    "rm {w}",
    "tag t{n}",
]


def random_action(rng: random.Random, files: list) -> CallToolAction:
    words = _WORDS + files
    w, n = rng.choice(words), rng.randrange(100)
    tool_name = rng.choice(
        [
            "execute_git_command",
            "execute_git_command",
            "run_command",
            "git_status",
            "git_log",
            "git_diff",
            "write_file",
            "read_file",
            "list_dir",
            "unknown_tool",
        ]
    )
    if tool_name == "execute_git_command":
        arguments = {"command": rng.choice(_GIT).format(w=w, n=n)}
    elif tool_name == "run_command":
        arguments = {
            "command": rng.choice(["git status --short", "echo {n} >> {w}", "rm -f {w}", "ls"]).format(w=w, n=n)
        }
    elif tool_name == "git_log":
        arguments = {"max_count": rng.choice([1, 5, 0]), "all_branches": rng.random() < 0.5}
    elif tool_name == "git_diff":
        arguments = {"staged": rng.random() < 0.5}
    elif tool_name in ("write_file", "read_file"):
        arguments = {"path": w} if tool_name == "read_file" else {"path": w, "content": f"{n}\n"}
    else:
        arguments = {}
    return call(tool_name, **arguments)


def test_a_random_agent_plays_100_episodes_without_an_error(env):
    rng = random.Random(99)
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
        f"\ngit_env random agent: {episodes} episodes, {steps + episodes} steps in {elapsed:.1f} s: "
        f"{episodes / elapsed:.1f} episodes/s, {(steps + episodes) / elapsed:.1f} steps/s, "
        f"mean reward {sum(rewards) / episodes:.2f}"
    )


def test_the_readme_example_runs_as_written():
    readme = (ENV_DIR / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ENV_DIR.parent)
    assert done.returncode == 0, done.stderr
    assert "reward: 1.0 done: True" in done.stdout and "Revert" in done.stdout
