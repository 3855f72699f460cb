"""What a server prints when a call fails, as its user sees it: a client's mistake (a ``ValueError``
from the environment: an unknown id, an action outside the space) is one line; an environment's
bug (any other exception) is an error with its traceback.

Each case is a real ``BackgroundServer`` in a child process, called by a real client over /ws or
HTTP; the child's stderr is what would reach the user's terminal. The child's log lines start
with ``LOG`` (a formatter of its own), so a line without it continues the record above it (a
traceback)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent

SERVE_AND_FAIL = """
import logging
import sys

import httpx

from openenv import GenericEnvClient
from openenv.core.client_errors import EnvironmentExecutionError
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.serving.runner import BackgroundServer

call, transport, level = sys.argv[1:]
logging.basicConfig(format="LOG %(name)s %(levelname)s %(message)s")
logging.getLogger("openenv.server").setLevel(level)


class Act(Action):
    n: int = 0


class Levels(Environment):
    def reset(self, seed=None, episode_id=None, level="easy", **kwargs):
        if level not in ("easy", "hard"):
            raise ValueError(f"unknown level {level!r}:\\nchoose easy or hard")  # two lines: logged as one
        return Observation()

    def step(self, action, timeout_s=None, **kwargs):
        return Observation(metadata={"row": {}["missing"]})  # a bug: KeyError

    @property
    def state(self):
        return State()


app = create_app(Levels, Act, Observation, env_name="levels")
with BackgroundServer(app) as server:
    if transport == "http":
        if call == "mistake":
            answer = httpx.post(server.base_url + "/reset", json={"level": "impossible"})
        else:
            answer = httpx.post(server.base_url + "/step", json={"action": {"n": 1}})
        assert answer.status_code == 500, answer.text
    else:
        with GenericEnvClient(base_url=server.base_url).sync() as env:
            try:
                env.reset(level="impossible") if call == "mistake" else (env.reset(), env.step({"n": 1}))
            except EnvironmentExecutionError:
                pass
            else:
                raise AssertionError("the call did not fail")
print("answered")
"""


def _serve_and_fail(call: str, transport: str, level: str = "WARNING") -> Tuple[List[str], str]:
    """The log records (each a list of its lines) about the failed call, and the whole stderr."""
    done = subprocess.run(
        [sys.executable, "-c", SERVE_AND_FAIL, call, transport, level],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0 and done.stdout.strip() == "answered", done.stderr
    return _records_with(done.stderr, "incident"), done.stderr


def _records_with(stderr: str, word: str) -> List[List[str]]:
    records: List[List[str]] = []
    for line in stderr.splitlines():
        if line.startswith("LOG "):
            records.append([line])
        elif records:
            records[-1].append(line)
    return [record for record in records if word in record[0]]


@pytest.mark.parametrize("transport", ["ws", "http"])
def test_a_clients_mistake_is_logged_in_one_line(transport: str) -> None:
    records, stderr = _serve_and_fail("mistake", transport)
    assert len(records) == 1, stderr
    (line,) = records[0]  # no traceback under it
    assert line.startswith("LOG openenv.server WARNING environment call failed (incident ")
    assert "ValueError: unknown level 'impossible': choose easy or hard" in line
    assert re.search(r"raised at .*:\d+ in reset", line), line  # where to look, without a traceback
    assert "Traceback" not in stderr


@pytest.mark.parametrize("transport", ["ws", "http"])
def test_an_environments_bug_is_logged_with_its_traceback(transport: str) -> None:
    records, stderr = _serve_and_fail("bug", transport)
    assert len(records) == 1, stderr
    head, *rest = records[0]
    assert head.startswith("LOG openenv.server ERROR environment call failed (incident ")
    assert "Traceback (most recent call last):" in rest and rest[-1] == "KeyError: 'missing'"
    assert any(line.strip().endswith(", in step") for line in rest)  # the environment's frame that raised


def test_a_clients_mistake_comes_with_its_traceback_when_the_log_is_at_debug() -> None:
    records, stderr = _serve_and_fail("mistake", "ws", level="DEBUG")
    assert len(records) == 1, stderr
    (record,) = records
    assert record[0].startswith("LOG openenv.server WARNING environment call failed (incident ")
    assert "Traceback (most recent call last):" in record[1:]
    assert record[-2:] == ["ValueError: unknown level 'impossible':", "choose easy or hard"]


GYMNASIUM_UNKNOWN_ID = """
import logging

from gymnasium_env.server.app import app

from openenv import GenericEnvClient
from openenv.core.client_errors import EnvironmentExecutionError
from openenv.core.env_server.serving.runner import BackgroundServer

logging.basicConfig(format="LOG %(name)s %(levelname)s %(message)s")
with BackgroundServer(app) as server, GenericEnvClient(base_url=server.base_url).sync() as env:
    try:
        env.reset(env_id="NoSuchEnv-v9")
    except EnvironmentExecutionError as exc:
        print(exc)
    env.reset(env_id="CartPole-v1")
    try:
        env.step({"action": 7})
    except EnvironmentExecutionError as exc:
        print(exc)
"""


def test_an_unknown_gymnasium_id_and_an_action_outside_the_space_are_a_line_each() -> None:
    pytest.importorskip("gymnasium_env", reason="needs envs/gymnasium_env installed")
    done = subprocess.run(
        [sys.executable, "-c", GYMNASIUM_UNKNOWN_ID], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "'NoSuchEnv-v9' is not served here" in done.stdout and "not in the action space" in done.stdout
    records = _records_with(done.stderr, "incident")
    assert [len(record) for record in records] == [1, 1], done.stderr
    assert "'NoSuchEnv-v9' is not served here" in records[0][0] and "action 7 is not in" in records[1][0]
