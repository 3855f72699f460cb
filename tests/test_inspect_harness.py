"""``InspectAIHarness`` runs real Inspect AI evaluations whose scorer is a served OpenEnv
environment: the echo environment on 127.0.0.1 rewards each completion (0.1 per character
echoed), and the scores the harness returns are those rewards, as Inspect AI's logs record them.

The model is Inspect AI's own mock provider (``mockllm/model``) answering with the last word of
its prompt. Each test runs with Inspect AI's logs, traces and caches in its tmp dir, and fails
if anything in this process opens a connection beyond the loopback interface."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest

pytest.importorskip("inspect_ai", reason="needs inspect-ai: pip install 'openenv[evals]'")

from echo_env import CallToolAction, EchoEnv
from echo_env.server.app import app as echo_app
from inspect_ai import Epochs, Task, task, task_with
from inspect_ai.dataset import Sample
from inspect_ai.log import list_eval_logs, read_eval_log
from inspect_ai.model import ModelOutput, ModelUsage
from inspect_ai.scorer import Score, Target, mean, scorer
from inspect_ai.solver import TaskState, generate

from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.evals import EvalConfig, InspectAIHarness

# Inspect AI's retry helper calls tenacity with an argument tenacity deprecates: not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")

WORDS = ["a", "abc", "abcdef"]


def last_word(messages: List[Any], tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
    """The mock model: answers with the last word of the prompt."""
    output = ModelOutput.from_content("mockllm/model", messages[-1].text.split()[-1])
    # With usage given, the mock provider does not count tokens with tiktoken, which would
    # download its encoding from the network.
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


@scorer(metrics=[mean()])
def echo_reward(url: str) -> Any:
    """The echo environment's reward for echoing the completion, in a session of its own."""

    async def score(state: TaskState, target: Target) -> Score:
        async with EchoEnv(base_url=url) as env:
            await env.reset()
            action = CallToolAction(tool_name="echo_message", arguments={"message": state.output.completion})
            result = await env.step(action)
        return Score(value=result.reward, answer=state.output.completion)

    return score


@scorer(metrics=[mean()])
def completion_length() -> Any:
    """The completion's length in characters: a second scorer with a ``mean`` of its own."""

    async def score(state: TaskState, target: Target) -> Score:
        return Score(value=len(state.output.completion))

    return score


@task
def echo_words(url: str, words: str = ",".join(WORDS), with_length: bool = False) -> Task:
    """One sample per word: the model is asked to repeat it, the echo environment scores it."""
    samples = [Sample(input=f"Repeat this word: {word}", target=word) for word in words.split(",")]
    scorers = [echo_reward(url), completion_length()] if with_length else echo_reward(url)
    return Task(dataset=samples, solver=generate(), scorer=scorers)


_WATCHED: Optional[List[Any]] = None


def _record_remote_connections(event: str, args: Any) -> None:
    if _WATCHED is None:
        return
    if event == "socket.connect":
        sock, address = args
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1"):
            _WATCHED.append(address)
    elif event == "socket.getaddrinfo" and args[0] not in (None, "127.0.0.1", "::1", "localhost", b"127.0.0.1"):
        _WATCHED.append(args[0])


sys.addaudithook(_record_remote_connections)  # audit hooks stay for the process; it records only while watched


@pytest.fixture(autouse=True)
def offline_inspect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Inspect AI quiet and writing under ``tmp_path``; fails the test on a non-loopback connection."""
    global _WATCHED
    monkeypatch.setenv("INSPECT_DISPLAY", "none")
    monkeypatch.setenv("INSPECT_LOG_DIR", str(tmp_path / "default-logs"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # Inspect AI's traces and sample buffers
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _WATCHED = []
    try:
        yield tmp_path
        assert _WATCHED == [], f"the evaluation reached beyond 127.0.0.1: {_WATCHED}"
    finally:
        _WATCHED = None


@pytest.fixture(scope="module")
def served_echo() -> Iterator[str]:
    with BackgroundServer(echo_app) as server:
        yield server.base_url


def config(url: str, **task_args: Any) -> EvalConfig:
    import inspect_ai

    return EvalConfig(
        harness_name="InspectAIHarness",
        harness_version=inspect_ai.__version__,
        library_versions={},
        dataset="echo_words",
        eval_parameters={
            "model": "mockllm/model",
            "model_args": {"custom_outputs": last_word},
            "task_args": {"url": url, **task_args},
        },
    )


def test_the_scores_are_the_environments_rewards(served_echo: str, tmp_path: Path) -> None:
    cfg = config(served_echo)
    result = InspectAIHarness(log_dir=str(tmp_path / "logs")).run_from_config(cfg)
    assert result.config is cfg
    assert result.scores == {"mean": pytest.approx(sum(0.1 * len(w) for w in WORDS) / len(WORDS))}
    # Inspect AI's log of the run, in the harness's log_dir, holds each sample's reward.
    (log_info,) = list_eval_logs(str(tmp_path / "logs"))
    log = read_eval_log(log_info)
    assert log.status == "success" and log.eval.task == "echo_words"
    per_sample = {s.output.completion: s.scores["echo_reward"].value for s in log.samples}
    assert per_sample == {w: pytest.approx(0.1 * len(w)) for w in WORDS}


def test_without_a_log_dir_the_logs_go_where_inspect_ai_puts_them(served_echo: str, tmp_path: Path) -> None:
    InspectAIHarness().run_from_config(config(served_echo))
    assert len(list_eval_logs(str(tmp_path / "default-logs"))) == 1  # INSPECT_LOG_DIR, set by the fixture


def test_metrics_of_the_same_name_are_told_apart_by_their_scorer(served_echo: str, tmp_path: Path) -> None:
    result = InspectAIHarness(log_dir=str(tmp_path)).run_from_config(config(served_echo, with_length=True))
    assert result.scores == {
        "echo_reward/mean": pytest.approx(sum(0.1 * len(w) for w in WORDS) / len(WORDS)),
        "completion_length/mean": pytest.approx(sum(len(w) for w in WORDS) / len(WORDS)),
    }


def test_epochs_are_passed_on_and_each_reducer_is_keyed_apart(served_echo: str, tmp_path: Path) -> None:
    cfg = config(served_echo)
    cfg.eval_parameters["epochs"] = Epochs(2, ["mean", "max"])
    result = InspectAIHarness(log_dir=str(tmp_path)).run_from_config(cfg)
    reward = pytest.approx(sum(0.1 * len(w) for w in WORDS) / len(WORDS))  # the mock model answers alike twice
    assert result.scores == {"echo_reward/mean/mean": reward, "echo_reward/max/mean": reward}
    log = read_eval_log(list_eval_logs(str(tmp_path))[0])
    assert len(log.samples) == 2 * len(WORDS)


def test_every_log_is_scored(served_echo: str, tmp_path: Path) -> None:
    """Two tasks give two logs; upstream read only the first."""
    tasks = [echo_words(served_echo, words="ab"), task_with(echo_words(served_echo, words="abcd"), name="echo_long")]
    parameters = {"model": "mockllm/model", "model_args": {"custom_outputs": last_word}, "task": tasks}
    scores = InspectAIHarness(log_dir=str(tmp_path)).run("", {}, "echo_words", parameters)
    assert scores == {
        "echo_words/echo_reward/mean": pytest.approx(0.2),
        "echo_long/echo_reward/mean": pytest.approx(0.4),
    }


def unserved_url() -> str:
    """The URL of a port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_a_failed_evaluation_raises_naming_its_error_and_log(tmp_path: Path) -> None:
    dead_url = unserved_url()
    with pytest.raises(RuntimeError, match="failed with status: error") as failure:
        InspectAIHarness(log_dir=str(tmp_path / "logs")).run_from_config(config(dead_url))
    (log_info,) = list_eval_logs(str(tmp_path / "logs"))
    assert "no server answers at" in str(failure.value)
    assert Path(log_info.name).name in str(failure.value)


def test_a_failed_log_after_a_successful_one_raises(served_echo: str, tmp_path: Path) -> None:
    """Upstream looked at the first log's status only."""
    tasks = [echo_words(served_echo), task_with(echo_words(unserved_url()), name="echo_unserved")]
    parameters = {"model": "mockllm/model", "model_args": {"custom_outputs": last_word}, "task": tasks}
    with pytest.raises(RuntimeError, match="task 'echo_unserved' failed with status: error"):
        InspectAIHarness(log_dir=str(tmp_path)).run("", {}, "echo_words", parameters)


def test_a_scorer_parameter_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """This Inspect AI's eval() takes no scorer (upstream passes it on and Inspect AI fails)."""
    parameters = {"model": "mockllm/model", "scorer": completion_length()}
    with pytest.raises(ValueError, match=r"takes no 'scorer'.*task_with"):
        InspectAIHarness(log_dir=str(tmp_path)).run("", {}, "echo_words", parameters)
    assert not any(tmp_path.rglob("*.eval"))


def test_parameters_it_does_not_pass_on_are_named_in_a_warning(served_echo: str, tmp_path: Path) -> None:
    cfg = config(served_echo)
    cfg.eval_parameters["limit"] = 1
    with pytest.warns(UserWarning, match=r"does not pass eval_parameters \['limit'\]"):
        result = InspectAIHarness(log_dir=str(tmp_path)).run_from_config(cfg)
    assert set(result.scores) == {"mean"}
