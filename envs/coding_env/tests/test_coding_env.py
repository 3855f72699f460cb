"""coding_env served in a real bubblewrap sandbox and driven through CodingEnv.

Every step's code runs in a fresh sandboxed process started by the (itself sandboxed) server.
The escape attempts of tests/security are repeated here per step; the cheap ones also run once
against an unsandboxed server, to show that they are real attacks.
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
from typing import Iterator

import pytest
from coding_env import CodeAction, CodeObservation, CodeState, CodingEnv
from coding_env.server.coding_environment import CodingEnvironment, ShapingReward

from openenv.core.client_errors import ActionValidationError
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime._linux import descendants
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.generic_client import GenericEnvClient
from openenv.testing import host_listener, planted_secret, processes_added, processes_per_uid

PACKAGE = Path(__file__).resolve().parents[1]
TIMEOUT_S = 2

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


def _serve(isolation: str = "sandbox", **env_vars: str) -> SandboxProvider:
    provider = SandboxProvider(
        str(PACKAGE), isolation=isolation, env_vars={"CODING_TIMEOUT_S": str(TIMEOUT_S), **env_vars}
    )
    provider.start()
    provider.wait_for_ready(60)
    return provider


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One sandboxed coding_env server for the whole module."""
    provider = _serve()
    try:
        assert provider.base_url is not None
        yield provider.base_url
    finally:
        provider.stop()


@pytest.fixture
def env(url: str) -> Iterator:
    with CodingEnv(base_url=url, message_timeout_s=60).sync() as client:
        client.reset()
        yield client


def run(env, code: str) -> CodeObservation:
    return env.step(CodeAction(code=code)).observation


def healthy(url: str) -> bool:
    """Another session on the same server still runs code."""
    with CodingEnv(base_url=url, message_timeout_s=60).sync() as other:
        other.reset()
        return run(other, "print(6 * 7)").stdout == "42\n"


# --- the basics ----------------------------------------------------------------------------------


def test_reset_starts_an_empty_episode(url: str) -> None:
    with CodingEnv(base_url=url).sync() as env:
        result = env.reset(episode_id="episode-1")
        state = env.state()
    assert result.observation == CodeObservation(stdout="", stderr="", exit_code=0, reward=0.0)
    assert result.reward == 0.0 and result.done is False
    assert state == CodeState(episode_id="episode-1", step_count=0, last_exit_code=0)


def test_a_step_returns_output_exit_code_and_shaping_reward(env) -> None:
    result = env.step(CodeAction(code="import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)"))
    assert (result.observation.stdout, result.observation.stderr, result.observation.exit_code) == ("out\n", "err\n", 3)
    assert result.reward == pytest.approx(0.1) and result.done is False
    state = env.state()
    assert (state.step_count, state.last_exit_code) == (1, 3)


def test_an_exception_gives_exit_code_1_and_its_traceback(env) -> None:
    observation = run(env, "1 / 0")
    assert observation.exit_code == 1
    assert observation.stderr.strip().endswith("ZeroDivisionError: division by zero")
    assert env.state().last_exit_code == 1


def test_rewards_follow_upstreams_shaping_rules(env) -> None:
    dangerous = env.step(CodeAction(code="import os\nprint(os.getcwd())"))
    assert dangerous.reward == pytest.approx(-1.0 + 0.1)
    assert dangerous.observation.metadata == {"safety_violation": r"import\s+os"}
    assert dangerous.observation.stdout == "/workspace\n"
    broken = env.step(CodeAction(code="def f(:\n    pass"))
    assert broken.reward == pytest.approx(0.1 - 0.2)
    assert broken.observation.exit_code == 1 and "SyntaxError" in broken.observation.stderr
    long_code = "total = 0\n" + "".join(f"total += {i}\n" for i in range(20)) + "print(total)"
    verbose = env.step(CodeAction(code=long_code))
    assert verbose.observation.stdout == "190\n" and verbose.reward == pytest.approx(0.0)
    assert env.step(CodeAction(code="")).reward == 0.0


def test_nothing_persists_from_one_step_to_the_next(env) -> None:
    assert run(env, "x = 41\nopen('note.txt', 'w').write('kept?')\nprint(x + 1)").stdout == "42\n"
    later = run(env, "import os\nprint(os.path.exists('note.txt'))\nprint(x)")
    assert later.stdout == "False\n"
    assert later.exit_code == 1 and "NameError" in later.stderr


def test_long_output_is_truncated_with_a_marker(env) -> None:
    observation = run(env, "print('x' * 200_000)")
    assert observation.exit_code == 0
    assert len(observation.stdout) < 70_000
    assert re.search(r"\[stdout truncated: \d+ more bytes not shown", observation.stdout)


def test_the_same_seed_replays_the_same_episode(url: str) -> None:
    code = "import random\nprint(random.random(), hash('openenv'))"

    def episode(seed: int) -> list:
        with CodingEnv(base_url=url).sync() as env:
            first = env.reset(seed=seed).observation
            return [first] + [run(env, code) for _ in range(2)]

    one, again, other = episode(7), episode(7), episode(8)
    assert one == again
    assert one[1].stdout != one[2].stdout  # each step has its own stream
    assert one[1:] != other[1:]


def test_an_invalid_action_is_refused_and_the_session_goes_on(url: str) -> None:
    with GenericEnvClient(base_url=url).sync() as raw:
        raw.reset(episode_id="raw")
        for bad in ({"cmd": "print(1)"}, {"code": 42}, {"code": "print(1)", "extra": True}):
            with pytest.raises(ActionValidationError):
                raw.step(bad)
        assert raw.step({"code": "print('still here')"}).observation["stdout"] == "still here\n"
        assert raw.state()["step_count"] == 1


def test_an_action_of_the_wrong_type_gets_an_error_observation_in_process() -> None:
    environment = CodingEnvironment(isolation="none")
    environment.reset()
    observation = environment.step("print(1)")  # type: ignore[arg-type]
    assert observation.exit_code == -1 and "CodeAction" in observation.stderr
    assert observation.metadata == {"error": "invalid_action"}


def test_the_shaping_reward_alone() -> None:
    reward = ShapingReward()
    assert reward("print(1)") == (pytest.approx(0.1), None)
    assert reward("eval('1')") == (pytest.approx(-0.9), r"eval\(")
    assert reward("x = (") == (pytest.approx(-0.1), None)
    assert reward("   ") == (0.0, None)


async def test_two_sessions_at_once_are_independent(url: str) -> None:
    async with CodingEnv(base_url=url) as a, CodingEnv(base_url=url) as b:
        await asyncio.gather(a.reset(episode_id="a"), b.reset(episode_id="b"))
        started = time.monotonic()
        slow, fast = await asyncio.gather(
            a.step(CodeAction(code="import time\ntime.sleep(1.5)\nprint('a')")),
            b.step(CodeAction(code="print('b')\nraise SystemExit(5)")),
        )
        elapsed = time.monotonic() - started
        state_a, state_b = await asyncio.gather(a.state(), b.state())
    assert (slow.observation.stdout, slow.observation.exit_code) == ("a\n", 0)
    assert (fast.observation.stdout, fast.observation.exit_code) == ("b\n", 5)
    assert (state_a.episode_id, state_a.last_exit_code) == ("a", 0)
    assert (state_b.episode_id, state_b.last_exit_code) == ("b", 5)
    assert elapsed < 3.0  # the steps ran side by side


# --- escape attempts, one step each --------------------------------------------------------------


def _read_secret(env) -> CodeObservation:
    with planted_secret() as secret:
        return run(env, f"print(open({str(secret)!r}).read())")


def _connect_to_host_listener(env) -> tuple:
    with host_listener() as listener:
        observation = run(env, listener.client_code())
    return observation, listener.accepted


def test_reading_a_secret_in_the_hosts_home_fails(env, url: str) -> None:
    observation = _read_secret(env)
    assert "secret" not in observation.stdout
    assert observation.exit_code == 1
    assert "FileNotFoundError" in observation.stderr or "PermissionError" in observation.stderr
    assert healthy(url)


def test_connecting_to_a_listener_on_the_hosts_loopback_fails(env, url: str) -> None:
    observation, accepted = _connect_to_host_listener(env)
    assert not accepted and "pong" not in observation.stdout
    assert observation.exit_code == 1
    assert "ConnectionRefusedError" in observation.stderr or "OSError" in observation.stderr
    assert healthy(url)


def test_writing_into_etc_fails(env, url: str) -> None:
    target = Path("/etc") / f"openenv-coding-pwned-{uuid.uuid4().hex}"
    try:
        observation = run(env, f"open({str(target)!r}, 'w').write('pwned')")
        assert not target.exists()
        assert observation.exit_code == 1
        assert "Read-only file system" in observation.stderr or "PermissionError" in observation.stderr
    finally:
        target.unlink(missing_ok=True)
    assert healthy(url)


def test_steps_leave_no_process_behind_not_even_a_zombie(env) -> None:
    assert run(env, "print(0)").exit_code == 0
    before = processes_per_uid(below=os.getpid())  # the server, and whatever else runs here
    for _ in range(5):
        assert run(env, "import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint(1)").exit_code == 0
    assert not processes_added(before, below=os.getpid())


def test_a_fork_bomb_is_bounded_and_leaves_nothing_behind(env, url: str) -> None:
    assert run(env, "print(0)").exit_code == 0
    before = processes_per_uid(below=os.getpid())
    # processes below this one: a sandbox's all are (other test runs on the machine are not)
    host_processes = len(descendants(os.getpid()))
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        # The bomb's copies share one uid: the run's own (as root), else the server's.
        while not done.is_set():
            peak[0] = max([peak[0], *processes_added(before, below=os.getpid()).values()])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        observation = run(env, "import os\nwhile True:\n    os.fork()")
    finally:
        done.set()
        watcher.join(5)
    assert observation.exit_code != 0
    assert "BlockingIOError" in observation.stderr or "Resource temporarily unavailable" in observation.stderr
    assert 20 < peak[0] <= 64 + 2  # it multiplied up to the process limit, plus bwrap and the launcher
    assert len(descendants(os.getpid())) <= host_processes + 66
    assert not processes_added(before, below=os.getpid())  # every forked copy went with the sandbox
    assert healthy(url)
    assert run(env, "print('after the bomb')").stdout == "after the bomb\n"


def test_an_infinite_loop_is_killed_by_the_timeout_and_the_next_step_works(env, url: str) -> None:
    started = time.monotonic()
    observation = run(env, "while True:\n    pass")
    elapsed = time.monotonic() - started
    assert observation.exit_code == 124
    assert f"timed out after {TIMEOUT_S:g} s" in observation.stderr
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 5
    assert env.state().last_exit_code == 124
    assert run(env, "print('next')").stdout == "next\n"
    assert healthy(url)


def test_allocating_8_gb_fails_with_a_memory_error(env, url: str) -> None:
    observation = run(env, "block = bytearray(8 * 1024 ** 3)\nprint(len(block))")
    assert observation.exit_code == 1 and "MemoryError" in observation.stderr
    assert observation.stdout == ""
    assert healthy(url)


def test_the_same_attacks_succeed_without_a_sandbox() -> None:
    """Control: with no isolation anywhere, the secret is read and the listener is reached."""
    provider = _serve(isolation="none", CODING_ISOLATION="none")
    try:
        with CodingEnv(base_url=provider.base_url).sync() as env:
            env.reset()
            assert _read_secret(env).stdout == "the trainer's secret\n"
            observation, accepted = _connect_to_host_listener(env)
            assert accepted and observation.stdout == "b'pong'\n"
    finally:
        provider.stop()


# --- a random agent ------------------------------------------------------------------------------

SNIPPETS = (
    "print({a} + {b})",
    "print(sum(range({a})))",
    "import math\nprint(math.factorial({a} % 20))",
    "x = [{a}, {b}]\nprint(sorted(x))",
    "print('{word}'[::-1])",
    "raise ValueError({a})",
    "print({a} / ({b} - {b}))",
    "def f(:\n    return {a}",
    "import random\nprint(random.randint(0, {a}))",
    "import sys\nsys.exit({a} % 3)",
)


def random_code(rng: random.Random) -> str:
    word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 8)))
    return rng.choice(SNIPPETS).format(a=rng.randint(0, 1000), b=rng.randint(0, 1000), word=word)


def test_a_random_agent_plays_100_episodes(url: str) -> None:
    rng = random.Random(1234)
    steps = 0
    started = time.monotonic()
    with CodingEnv(base_url=url, message_timeout_s=60).sync() as env:
        for episode in range(100):
            result = env.reset(seed=episode)
            assert result.observation.exit_code == 0
            for _ in range(2):
                code = random_code(rng)
                result = env.step(CodeAction(code=code))
                observation = result.observation
                assert observation.exit_code in (0, 1, 2), (code, observation)
                assert result.done is False and isinstance(result.reward, float)
                steps += 1
            assert env.state().step_count == 2
    elapsed = time.monotonic() - started
    print(
        f"\ncoding_env random agent: 100 episodes, {steps} steps in {elapsed:.1f} s: "
        f"{100 / elapsed:.1f} episodes/s, {steps / elapsed:.1f} steps/s"
    )


# --- the README's example ------------------------------------------------------------------------


def test_the_readme_example_runs_as_written() -> None:
    readme = (PACKAGE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/tmp")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["45 0 0.1", "124", "ZeroDivisionError: division by zero", "1"]


def test_auto_env_finds_the_installed_package() -> None:
    from openenv import AutoAction, AutoEnv

    assert AutoEnv.get_env_class("coding") is CodingEnv
    assert AutoAction.from_env("coding") is CodeAction


def test_the_code_imports_the_standard_library_only_unless_packages_are_named() -> None:
    pytest.importorskip("numpy")
    code = "import numpy\nprint(numpy.arange(3).sum())"
    assert "No module named 'numpy'" in CodingEnvironment().step(CodeAction(code=code)).stderr
    assert CodingEnvironment(packages=("numpy",)).step(CodeAction(code=code)).stdout == "3\n"
