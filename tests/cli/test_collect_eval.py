"""``openenv collect`` and ``openenv eval``, and what they stand on: ``openenv.core.harness.collect``
(upstream's names), ``.evaluation`` (the rollouts), ``.report`` (the figures and the page).

Real parts throughout: the commands run as a user runs them (``python -m openenv.cli``); the
environments are catalogue packages on real servers (``shell_env`` served in the sandbox by
``openenv eval`` itself, or by uvicorn in a process of its own that a test kills or freezes;
``openspiel_env``'s blackjack on an in-process server); the model is the tiny engine
(``openenv.testing.tiny_engine``, a real model trained to call ``run_command``) in a process of its
own. The confidence intervals are checked against published values. The one stand-in is the
Hugging Face Hub, which CI cannot reach: :func:`push_to_hf_hub` is checked against a recording
``HfApi``.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import httpx
import pytest

from openenv.core.harness.collect import (
    CollectRunner,
    EpisodeRecord,
    RolloutSerializer,
    build_dataset_readme,
    build_model_step,
    push_to_hf_hub,
)
from openenv.core.harness.report import (
    mean_interval,
    render_html,
    student_t_cdf,
    summarize,
    summary_lines,
    t_quantile,
    wilson_interval,
)
from openenv.core.harness.rollout import HarnessRolloutResult, MCPHarnessAdapter, VerifyResult
from openenv.core.llm_client import LLMClient, LLMResponse

ROOT = Path(__file__).resolve().parents[2]
SHELL = ROOT / "envs" / "shell_env"
OPENENV = [sys.executable, "-m", "openenv.cli"]


def cli(*args: str, timeout: float = 300, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "COLUMNS": "120", **(env or {})}
    return subprocess.run([*OPENENV, *args], capture_output=True, text=True, timeout=timeout, env=environ)


def lines_of(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- the statistics, against published values ------------------------------------------------------


def test_wilson_interval_matches_published_values() -> None:
    # Newcombe (1998), Table I / any Wilson calculator: 8/10, 0/10, 10/10, 81/263
    low, high = wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert tuple(round(x, 4) for x in wilson_interval(0, 10)) == (0.0, 0.2775)
    assert tuple(round(x, 4) for x in wilson_interval(10, 10)) == (0.7225, 1.0)
    assert tuple(round(x, 4) for x in wilson_interval(81, 263)) == (0.2553, 0.3662)
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_student_t_quantiles_and_mean_interval_match_tables() -> None:
    # the 97.5% quantiles of every t table
    for df, expected in [(1, 12.7062047), (2, 4.30265273), (4, 2.77644511), (9, 2.26215716), (30, 2.04227246)]:
        assert math.isclose(t_quantile(0.975, df), expected, rel_tol=1e-7), df
    assert math.isclose(t_quantile(0.975, 1e6), 1.959966, rel_tol=1e-5)
    assert math.isclose(t_quantile(0.025, 9), -2.26215716, rel_tol=1e-7)
    assert math.isclose(student_t_cdf(0.0, 5), 0.5) and math.isclose(student_t_cdf(2.015048, 5), 0.95, rel_tol=1e-6)
    # 1..5: mean 3, sd sqrt(2.5), half width t(0.975, 4) * sd / sqrt(5) = 1.963243
    figures = mean_interval([1, 2, 3, 4, 5])
    assert figures["n"] == 5 and figures["mean"] == 3.0 and math.isclose(figures["std"], math.sqrt(2.5))
    assert [round(x, 6) for x in figures["ci"]] == [1.036757, 4.963243]
    assert mean_interval([0.5]) == {"n": 1, "mean": 0.5, "std": None, "ci": None}
    assert mean_interval([]) is None
    assert mean_interval([1.0, 1.0, 1.0])["ci"] == [1.0, 1.0]


def record(episode: str, task: int, status: str, reward: Optional[float] = None, **extra: Any) -> Dict[str, Any]:
    base = {"episode_id": episode, "task": task, "status": status, "reward": reward}
    return {**base, **extra}


def test_summarize_counts_every_rollout_where_it_belongs() -> None:
    tokens = {"prompt": 100, "completion": 20}
    records = [
        record("t0-0", 0, "ok", 1.0, tokens=tokens, timings={"total_s": 1.0}),
        record("t0-1", 0, "ok", 0.0, tokens=tokens, timings={"total_s": 3.0}),
        record("t1-0", 1, "ok", 1.0, tokens={"prompt": 300, "completion": 60}),
        record("t1-1", 1, "unscored", tokens=tokens),
        record("t2-0", 2, "failed", error={"cause": "env_lost", "message": "the server went away"}),
        record("t2-1", 2, "failed", error={"cause": "timeout", "message": "too slow"}),
        # a resumed run played t2-1 again: its last record is the one that counts
        record("t2-1", 2, "ok", 0.5, tokens=tokens),
        record("t3-0", 3, "failed", error={"cause": "env_lost", "message": "gone again"}),
    ]
    summary = summarize(records, success_threshold=1.0, run={"wall_s": 2.0, "rollouts": 4, "concurrency": 2})
    assert (summary["rollouts"], summary["ok"], summary["unscored"], summary["failed"]) == (7, 4, 1, 2)
    # success: 2 of the 5 that ended (ok and unscored), Wilson 2/5
    assert summary["success"]["successes"] == 2 and summary["success"]["n"] == 5
    assert summary["success"]["ci"] == list(wilson_interval(2, 5))
    # mean reward over the 4 scored: 1, 0, 1, 0.5
    assert summary["reward"] == mean_interval([1.0, 0.0, 1.0, 0.5]) and summary["reward"]["mean"] == 0.625
    assert summary["failures"] == {
        "env_lost": {"count": 2, "example": "the server went away", "episodes": ["t2-0", "t3-0"]}
    }
    tasks = {t["task"]: t for t in summary["tasks"]}
    assert tasks[0]["success"]["rate"] == 0.5 and tasks[0]["reward"]["mean"] == 0.5
    assert tasks[1]["success"] == {"successes": 1, "n": 2, "rate": 0.5, "ci": list(wilson_interval(1, 2))}
    assert tasks[1]["reward"] == {"n": 1, "mean": 1.0, "std": None, "ci": None}  # the unscored one has no reward
    assert tasks[3]["success"]["n"] == 0 and tasks[3]["failed"] == 1 and tasks[3]["reward"] is None
    assert summary["tokens"]["n"] == 5 and summary["tokens"]["mean_total"] == (120 * 4 + 360) / 5
    assert summary["tokens"]["max_total"] == 360
    assert summary["run"]["rollouts_per_s"] == 2.0
    assert summary["rollout_seconds"]["mean"] == 2.0
    text = "\n".join(summary_lines(summary))
    assert "7 rollouts: 4 scored, 1 unscored, 2 failed" in text
    assert "40.0% [11.8%, 76.9%] (2/5, 95% Wilson)" in text
    assert "failed (env_lost): 2" in text


def test_the_report_is_one_self_contained_page() -> None:
    records = [record(f"t{i}", i, "ok", float(i % 2), tokens={"prompt": 10 * i, "completion": 5}) for i in range(6)] + [
        record("t9", 9, "failed", error={"cause": "model_error", "message": "HTTP 500: <b>boom</b>"})
    ]
    summary = summarize(records, settings={"env": "shell_env", "model": "tiny <model>"})
    page = render_html(summary)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and "<link" not in page and "src=" not in page
    assert page.count("<svg") == 3  # reward per task, success rate per task, tokens per rollout
    assert "&lt;b&gt;boom&lt;/b&gt;" in page and "<b>boom</b>" not in page  # texts are escaped
    assert "tiny &lt;model&gt;" in page
    assert "50.0%" in page and "model_error" in page


# --- the collection directory ---------------------------------------------------------------------


def test_serializer_drops_a_torn_last_line_and_refuses_a_bad_one(tmp_path: Path) -> None:
    serializer = RolloutSerializer(tmp_path / "out")
    serializer.write_episode({"episode_id": "ep-000000", "reward": 1.0})
    with open(serializer.results_path, "a") as handle:
        handle.write('{"episode_id": "ep-0000')  # a run killed while writing
    assert serializer.collected_episode_ids() == {"ep-000000"}
    serializer.write_episode({"episode_id": "ep-000001", "reward": 0.0})  # cuts the torn line first
    assert [r["episode_id"] for r in lines_of(serializer.results_path)] == ["ep-000000", "ep-000001"]
    with open(serializer.results_path, "a") as handle:
        handle.write("not json\n")
    with pytest.raises(ValueError, match=r"results.jsonl:3: not JSON"):
        serializer.collected_episode_ids()


def test_metadata_of_a_resumed_run_is_kept_and_other_settings_are_refused(tmp_path: Path) -> None:
    serializer = RolloutSerializer(tmp_path)
    first = {"env": "openspiel:blackjack", "model": None, "num_episodes_requested": 4}
    assert serializer.ensure_metadata(first) == first
    written = serializer.metadata_path.read_text()
    kept = serializer.ensure_metadata({**first, "num_episodes_requested": 8}, ignore=["num_episodes_requested"])
    assert kept == first and serializer.metadata_path.read_text() == written  # not rewritten
    with pytest.raises(ValueError, match=r"other settings.*model"):
        serializer.ensure_metadata({**first, "model": "gpt"})
    serializer.write_episode({"episode_id": "x"})
    moved = serializer.backup_results()
    assert moved is not None and moved.name.startswith("results.") and moved.name.endswith(".bak.jsonl")
    assert not serializer.results_path.exists()


# --- collect: blackjack on a real server -----------------------------------------------------------


@pytest.fixture(scope="module")
def spiel_url() -> Iterator[str]:
    pytest.importorskip("openspiel_env", reason="openspiel_env is not installed (pip install -e envs/openspiel_env)")
    from openspiel_env.server.app import app

    from openenv.core.env_server.serving.runner import BackgroundServer

    with BackgroundServer(app) as server:
        yield server.base_url


def blackjack(url: str) -> Any:
    from openspiel_env import OpenSpielEnv

    from openenv.cli._collect_sessions import OpenSpielSessionFactory

    return OpenSpielSessionFactory(lambda: OpenSpielEnv(base_url=url), game_name="blackjack")


def test_collect_runner_names_resumes_and_counts_episodes(spiel_url: str, tmp_path: Path) -> None:
    from openenv.cli._collect_sessions import build_scripted_model_step

    closed: List[str] = []
    factory = blackjack(spiel_url)

    class Sessions:
        def create(self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None) -> Any:
            if seed == 2:
                raise ConnectionError("refused")  # one episode cannot start: counted, the run goes on
            session = factory.create(task, seed=seed, episode_id=episode_id)
            original = session.close
            session.close = lambda: (closed.append(episode_id), original())[1]  # type: ignore[method-assign]
            return session

    serializer = RolloutSerializer(tmp_path)
    runner = CollectRunner(session_factory=Sessions(), harness_adapter=MCPHarnessAdapter(), serializer=serializer)
    step = build_scripted_model_step()
    result = runner.run(model_step=step, num_episodes=4, episode_id_prefix="bj")
    assert (result.num_collected, result.num_failed, result.num_skipped) == (3, 1, 0)
    assert result.episode_ids == ["bj-000000", "bj-000001", "bj-000003"] == closed
    written = lines_of(serializer.results_path)
    rewards = [r["reward"] for r in written]
    assert all(r in (-1.0, 0.0, 1.0) for r in rewards)  # blackjack's own rewards, standing at once
    assert result.avg_reward == sum(rewards) / 3 and result.success_rate == sum(r > 0 for r in rewards) / 3
    assert set(written[0]) == {
        "episode_id",
        "messages",
        "reward",
        "done",
        "tool_trace",
        "metrics",
        "verify_metrics",
        "artifacts",
        "task",
        "extra",
    }
    assert written[0]["tool_trace"][0]["tool_name"] == "play" and written[0]["done"] is True
    # resume: the ids on disk are skipped, their seeds used up (episode 4 plays seed 4, as it would have)
    again = runner.run(model_step=step, num_episodes=5, episode_id_prefix="bj")
    assert (again.num_collected, again.num_skipped, again.num_failed) == (1, 3, 1)
    assert again.episode_ids == ["bj-000004"]
    # resume=False moves the old file aside, with a warning
    with pytest.warns(RuntimeWarning, match="moved"):
        fresh = runner.run(model_step=step, num_episodes=1, episode_id_prefix="bj", resume=False)
    assert fresh.num_collected == 1 and len(lines_of(serializer.results_path)) == 1
    assert len(list(tmp_path.glob("results.*.bak.jsonl"))) == 1
    # should_keep drops what it refuses
    dropped = runner.run(model_step=step, num_episodes=2, episode_id_prefix="k", should_keep=lambda r: False)
    assert (dropped.num_dropped, dropped.num_collected) == (2, 0)


def test_episode_record_forwards_the_environments_reward() -> None:
    from openenv.core.harness.rollout import ToolResult, ToolTraceEntry

    rollout = HarnessRolloutResult(
        messages=[{"role": "user", "content": "go"}],
        tool_trace=[ToolTraceEntry("play", {"action_id": 1}, ToolResult(data={}, metadata={"reward": 1.0}))],
        done=True,
    )
    record = EpisodeRecord.from_rollout("ep-000000", rollout, VerifyResult(env_reward=1.0, done=True), task="t")
    assert record.to_dict()["reward"] == 1.0 and record.to_dict()["task"] == "t"
    with pytest.raises(ValueError, match="forward"):
        EpisodeRecord.from_rollout("ep-000000", rollout, VerifyResult(env_reward=0.0))
    with pytest.raises(ValueError, match="did not produce"):
        EpisodeRecord.from_rollout("ep-000000", HarnessRolloutResult(), VerifyResult())


def test_build_model_step_forwards_temperature_max_tokens_and_top_p_only() -> None:
    seen: List[Any] = []

    class Recording(LLMClient):
        async def complete(self, prompt: str, **kwargs: Any) -> str:
            return ""

        async def complete_with_tools(self, messages: Any, tools: Any, **kwargs: Any) -> LLMResponse:
            seen.append((messages, tools, kwargs))
            return LLMResponse("ok")

    from openenv.core.env_server.mcp_types import Tool

    step = build_model_step(Recording("http://unused", 1), system_prompt="Be brief.")
    tool = Tool(name="play", description="Play.", input_schema={"type": "object"})
    with pytest.warns(RuntimeWarning, match="top_k"):
        result = step([{"role": "user", "content": "hi"}], [tool], {"temperature": 0.5, "top_k": 3, "max_tokens": 9})
    assert result.response.content == "ok"
    messages, tools, kwargs = seen[0]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert tools == [{"name": "play", "description": "Play.", "inputSchema": {"type": "object"}}]
    assert kwargs == {"temperature": 0.5, "max_tokens": 9}


def test_push_to_hf_hub_uploads_the_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub cannot be reached from CI: a recording HfApi stands in for it (the only stand-in here)."""
    import huggingface_hub

    calls: List[Any] = []

    class RecordingApi:
        def __init__(self, token: Optional[str] = None) -> None:
            calls.append(("token", token))

        def create_repo(self, **kwargs: Any) -> None:
            calls.append(("create_repo", kwargs))

        def upload_folder(self, **kwargs: Any) -> None:
            calls.append(("upload_folder", kwargs))

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    with pytest.raises(FileNotFoundError):
        push_to_hf_hub(tmp_path, "me/rollouts")
    serializer = RolloutSerializer(tmp_path)
    serializer.write_metadata({"env": "openspiel:blackjack"})
    serializer.write_episode({"episode_id": "ep-000000", "reward": 1.0})
    serializer.write_episode({"episode_id": "ep-000001", "reward": -1.0})
    url = push_to_hf_hub(tmp_path, "me/rollouts", private=True, token="hf_x")
    assert url == "https://huggingface.co/datasets/me/rollouts"
    assert calls[0] == ("token", "hf_x")
    assert calls[1] == (
        "create_repo",
        {"repo_id": "me/rollouts", "repo_type": "dataset", "private": True, "exist_ok": True},
    )
    upload = calls[2][1]
    assert upload["commit_message"] == "Add 2 collected episode(s)" and upload["repo_type"] == "dataset"
    assert set(upload["allow_patterns"]) == {"results.jsonl", "metadata.json", "README.md"}
    readme = (tmp_path / "README.md").read_text()
    assert readme == build_dataset_readme(tmp_path) and "path: results.jsonl" in readme
    assert "2 episode(s)" in readme and "openspiel:blackjack" in readme


def test_collect_command_writes_upstreams_files_and_resumes(spiel_url: str, tmp_path: Path) -> None:
    out = tmp_path / "bj"
    run = cli("collect", "openspiel:blackjack", "--base-url", spiel_url, "-o", str(out), "-n", "6", "--keep-losses")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("results.jsonl")
    episodes = lines_of(out / "results.jsonl")
    assert [e["episode_id"] for e in episodes] == [f"ep-{i:06d}" for i in range(6)]
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata == {
        "env": "openspiel:blackjack",
        "env_base_url": spiel_url,
        "provider": "scripted",
        "model": None,
        "llm_endpoint": None,
        "llm_port": None,
        "num_episodes_requested": 6,
        "temperature": 0.2,
        "keep_losses": True,
    }
    written = (out / "metadata.json").read_text()
    more = cli("collect", "openspiel:blackjack", "--base-url", spiel_url, "-o", str(out), "-n", "8", "--keep-losses")
    assert more.returncode == 0, more.stderr
    assert "Collected 2 episodes (6 on disk already" in more.stderr
    assert len(lines_of(out / "results.jsonl")) == 8
    assert (out / "metadata.json").read_text() == written  # a resumed run keeps the first run's metadata
    other = cli("collect", "openspiel:blackjack", "--base-url", spiel_url, "-o", str(out), "-n", "8")
    assert other.returncode == 1 and "other settings (keep_losses" in other.stderr
    bad = cli("collect", "chess", "--base-url", spiel_url, "-o", str(out))
    assert bad.returncode == 2 and "openenv eval" in bad.stderr


class RecordingEndpoint:
    """An OpenAI-compatible endpoint on 127.0.0.1 that answers every chat request with a short text
    and records the Authorization headers it got."""

    def __init__(self) -> None:
        seen = self.headers = []  # type: List[Optional[str]]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                seen.append(self.headers.get("authorization"))
                body = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": "I stand."}, "finish_reason": "stop"}]}
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_collect_never_sends_a_generic_api_key(spiel_url: str, tmp_path: Path) -> None:
    endpoint = RecordingEndpoint()
    try:
        common = ["collect", "openspiel:blackjack", "--base-url", spiel_url, "-n", "1", "--provider", "openai"]
        secrets = {"API_KEY": "generic-secret", "OPENAI_API_KEY": "openai-secret", "MY_KEY": "mine"}
        run = cli(*common, "--model", "m", "--llm-endpoint", endpoint.url, "-o", str(tmp_path / "a"), env=secrets)
        # the model never plays, so the environment gives no reward: the episode fails, the command says so
        assert run.returncode == 1 and "all 1 episodes failed" in run.stderr
        named = cli(
            *common,
            "--model",
            "m",
            "--llm-endpoint",
            endpoint.url,
            "--api-key-env",
            "MY_KEY",
            "-o",
            str(tmp_path / "b"),
            env=secrets,
        )
        assert named.returncode == 1
        assert endpoint.headers == ["Bearer not-needed", "Bearer mine"]  # neither API_KEY nor OPENAI_API_KEY
        hosted = cli(
            *common, "--model", "m", "-o", str(tmp_path / "c"), env={"API_KEY": "generic-secret", "OPENAI_API_KEY": ""}
        )
        assert hosted.returncode == 1 and "needs a key in OPENAI_API_KEY" in hosted.stderr
        no_model = cli(*common, "-o", str(tmp_path / "d"))
        assert no_model.returncode == 2 and "--model" in no_model.stderr
    finally:
        endpoint.close()


# --- eval: the tiny engine over shell_env ---------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the tiny engine needs {module}")
    pytest.importorskip("shell_env", reason="shell_env is not installed (pip install -e envs/shell_env)")
    from openenv.core.containers.runtime.isolation import find_bwrap
    from openenv.testing.tiny_engine import EngineServer

    if find_bwrap() is None:
        pytest.skip("shell_env runs commands in bubblewrap, which is not installed")
    with EngineServer(tool_name="run_command", threads=1) as server:  # shell_env's tool; trained once, cached
        yield server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


UVICORN = [sys.executable, "-m", "uvicorn", "shell_env.server.app:app", "--host", "127.0.0.1"]


class ShellServer:
    """shell_env served by uvicorn in a process of its own, which a test may kill or freeze."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [*UVICORN, "--port", str(self.port), "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("shell_env did not start")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture
def shell_server() -> Iterator[ShellServer]:
    server = ShellServer()
    try:
        yield server
    finally:
        server.stop()


def eval_args(engine: Any, out: Path, *args: str) -> List[str]:
    return ["eval", *args, "--model-url", engine.base_url, "-o", str(out), "--max-tokens", "48"]


def test_eval_plays_8_sandboxed_tasks_at_concurrency_4_reports_and_resumes(engine: Any, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    run = cli(*eval_args(engine, out, str(SHELL), "--tasks", "8", "--concurrency", "4", "--max-turns", "2"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out / "report.html") or run.stdout.strip().endswith("report.html")
    assert "[8/8]" in run.stderr  # a line per rollout when stderr is not a terminal
    records = lines_of(out / "results.jsonl")
    assert sorted(r["episode_id"] for r in records) == [f"task-{i:06d}-0" for i in range(8)]
    for r in records:
        assert r["status"] == "ok" and r["error"] is None and r["task"] == r["seed"]
        # greedy, the tiny engine calls run_command on every turn; shell_env pays 0.0 until a submit
        assert [t["tool_name"] for t in r["tool_trace"]] == ["run_command", "run_command"]
        assert r["reward"] == r["tool_trace"][-1]["result"]["metadata"]["reward"] == 0.0
        assert r["success"] is False and r["metrics"]["stop_reason"] == "max_turns"
        assert r["messages"][0]["role"] == "user" and r["messages"][1]["tool_calls"]
        tokens = r["tokens"]
        assert len(tokens["turns"]) == 2 and tokens["total"] == tokens["prompt"] + tokens["completion"]
        assert tokens["prompt"] == sum(t["prompt"] for t in tokens["turns"]) > 0
        assert r["timings"]["model_calls"] == 2 and r["timings"]["tool_calls"] == 2
        assert r["timings"]["total_s"] >= r["timings"]["model_s"] > 0 and r["trace"] is None
    instructions = {r["task"]: r["messages"][0]["content"] for r in records}
    assert len(set(instructions.values())) > 1  # the task index picks shell_env's task
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["rollouts"], summary["ok"], summary["failed"]) == (8, 8, 0)
    assert summary["success"] == {"successes": 0, "n": 8, "rate": 0.0, "ci": list(wilson_interval(0, 8))}
    assert summary["reward"] == {"n": 8, "mean": 0.0, "std": 0.0, "ci": [0.0, 0.0]}
    mean_tokens = sum(r["tokens"]["total"] for r in records) / 8
    assert math.isclose(summary["tokens"]["mean_total"], mean_tokens)
    assert summary["run"]["rollouts"] == 8 and summary["run"]["concurrency"] == 4
    page = (out / "report.html").read_text()
    assert "0.0%" in page and "[0.0%, 32.4%]" in page and "<svg" in page
    assert "success rate (reward >= 1): 0.0% [0.0%, 32.4%] (0/8, 95% Wilson)" in run.stderr
    metadata = (out / "metadata.json").read_text()

    # resume: the 8 that ended are skipped, 2 more tasks are played, the metadata stays
    more = cli(*eval_args(engine, out, str(SHELL), "--tasks", "10", "--concurrency", "4", "--max-turns", "2"))
    assert more.returncode == 0, more.stderr
    assert "8 rollouts ended in an earlier run: skipped" in more.stderr and "[2/2]" in more.stderr
    assert len(lines_of(out / "results.jsonl")) == 10
    assert json.loads((out / "summary.json").read_text())["rollouts"] == 10
    assert (out / "metadata.json").read_text() == metadata
    other = cli(*eval_args(engine, out, str(SHELL), "--tasks", "10", "--max-turns", "3"))
    assert other.returncode == 1 and "other settings (max_turns" in other.stderr


def test_eval_through_the_capture_proxy_records_the_engines_token_ids(
    engine: Any, shell_server: ShellServer, tmp_path: Path
) -> None:
    out = tmp_path / "captured"
    args = eval_args(engine, out, "shell_env", "--base-url", shell_server.url, "--tasks", "2", "--max-turns", "2")
    run = cli(*args, "--capture")
    assert run.returncode == 0, run.stderr
    for r in lines_of(out / "results.jsonl"):
        trace, tokens = r["trace"], r["tokens"]
        assert tokens["ids"] is True and trace["rollout_type"] == "eval" and trace["capture_level"] == "tokens"
        [sequence] = trace["sequences"]  # one chain: each prompt extends the last turn
        assert sequence["prompt_len"] == tokens["turns"][0]["prompt"]
        assert sequence["turn_lengths"] == [t["completion"] for t in tokens["turns"]]
        assert len(sequence["input_ids"]) == tokens["turns"][-1]["prompt"] + tokens["turns"][-1]["completion"]
        assert [t["n_sampled"] for t in trace["turns"]] == sequence["turn_lengths"]


def wait_for_lines(path: Path, count: int, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        if process.poll() is not None:
            raise AssertionError(f"eval ended early: {process.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"no {count} results within {timeout} s")


def run_eval_in_background(engine: Any, out: Path, url: str, *args: str) -> subprocess.Popen:
    argv = [*OPENENV, *eval_args(engine, out, "shell_env", "--base-url", url, *args)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_killed_server_gives_recorded_failures_and_the_command_ends(
    engine: Any, shell_server: ShellServer, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    args = ("--tasks", "6", "--concurrency", "2", "--max-turns", "8", "--call-timeout", "20")
    process = run_eval_in_background(engine, out, shell_server.url, *args)
    try:
        wait_for_lines(out / "results.jsonl", 1, process)
        shell_server.process.kill()  # kill -9: the sessions in flight lose their server
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, stderr
    records = {r["episode_id"]: r for r in lines_of(out / "results.jsonl")}
    assert len(records) == 6
    failed = [r for r in records.values() if r["status"] == "failed"]
    assert len(failed) >= 4, stderr
    causes = {r["error"]["cause"] for r in failed}
    assert causes <= {"env_lost", "env_unreachable"}, [r["error"] for r in failed]
    assert "env_unreachable" in causes  # the rollouts started after the kill could not connect
    summary = json.loads((out / "summary.json").read_text())
    assert sum(entry["count"] for entry in summary["failures"].values()) == len(failed)
    assert f"{len(failed)} of 6 rollouts failed" in stderr and "report.html" in stdout
    page = (out / "report.html").read_text()
    assert "env_unreachable" in page


def test_a_hung_server_gives_timeouts_and_the_command_ends(
    engine: Any, shell_server: ShellServer, tmp_path: Path
) -> None:
    out = tmp_path / "hung"
    args = ("--tasks", "4", "--concurrency", "2", "--max-turns", "8", "--timeout", "6", "--call-timeout", "120")
    process = run_eval_in_background(engine, out, shell_server.url, *args)
    try:
        wait_for_lines(out / "results.jsonl", 1, process)
        os.kill(shell_server.process.pid, signal.SIGSTOP)  # alive, answering nothing
        started = time.monotonic()
        _, stderr = process.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, stderr
    records = lines_of(out / "results.jsonl")
    assert len(records) == 4
    failed = [r for r in records if r["status"] == "failed"]
    causes = [r["error"]["cause"] for r in failed]
    # the rollouts in flight hit their deadline; one started after the freeze may instead find that its
    # connection is never accepted (the client's connect timeout), which the record says as such
    assert "timeout" in causes and set(causes) <= {"timeout", "env_unreachable"}, [r["error"] for r in failed]
    for r in failed:
        if r["error"]["cause"] == "env_unreachable":
            assert "did not complete the connection in time" in r["error"]["message"]
    assert all(r["timings"]["total_s"] < 10 for r in failed)  # the 6 s deadline, not the 120 s call timeout
    assert took < 60


# --- eval --harness: a real agent CLI (Claude Code) in the sandbox ----------------------------------


def test_eval_with_the_claude_code_harness_captures_every_rollout(tmp_path: Path) -> None:
    """``openenv eval --harness claude-code``: the real Claude Code CLI, sandboxed, plays each task of
    shell_env (served in the sandbox by eval) with the environment's tools as its MCP server and the
    tiny engine (trained to call ``mcp__env__run_command``, the name Claude Code shows it) behind the
    capture proxy. Whatever the weak model does, every record has the captured turns' tokens, the
    agent's exit code, and a reward (or unscored) or a recorded failure cause."""
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the tiny engine needs {module}")
    pytest.importorskip("shell_env", reason="shell_env is not installed (pip install -e envs/shell_env)")
    from openenv.core.containers.runtime.isolation import find_bwrap
    from openenv.core.harness import agents
    from openenv.testing.tiny_engine import EngineServer

    if find_bwrap() is None:
        pytest.skip("the agent and shell_env run in bubblewrap, which is not installed")
    root = agents.harness_dir(ROOT / ".harnesses")
    if agents.installed("claude-code", root) is None:
        pytest.skip(f"claude-code is not installed in {root}: run `bash scripts/install-harnesses.sh claude-code`")
    out = tmp_path / "agent"
    with EngineServer(tool_name="mcp__env__run_command", threads=1) as engine:
        run = cli(
            "eval",
            str(SHELL),
            "--harness",
            "claude-code",
            "--model-url",
            engine.base_url,
            "-o",
            str(out),
            "--tasks",
            "3",
            "--concurrency",
            "2",
            "--max-turns",
            "2",
            "--max-tokens",
            "96",
            "--temperature",
            "0.01",  # near-greedy: the tiny model then mostly calls its tool
            "--timeout",
            "200",
            env={"OPENENV_HARNESS_DIR": str(root)},
            timeout=600,
        )
    assert run.returncode in (0, 1), run.stderr
    records = lines_of(out / "results.jsonl")
    assert sorted(r["episode_id"] for r in records) == [f"task-{i:06d}-0" for i in range(3)], run.stderr
    print(f"\n{run.stderr[-1500:]}")
    for r in records:
        extra = r["extra"]
        assert extra["harness"] == "claude-code" and "exit_code" in extra
        tokens = r["tokens"]
        # the agent's model calls, as the proxy captured them, with the engine's token ids
        assert 1 <= len(tokens["turns"]) <= 2, (r["error"], extra)
        assert tokens["ids"] is True and tokens["total"] == tokens["prompt"] + tokens["completion"] > 0
        assert r["trace"]["rollout_type"] == "eval" and r["timings"]["model_calls"] == len(tokens["turns"])
        # the conversation as the agent's model last saw it (Claude Code's own prompt), and its answer
        assert r["messages"][-1]["role"] == "assistant" and "trace_error" not in r["metrics"]
        if r["status"] == "failed":
            assert r["error"]["cause"] in ("agent_error", "agent_timeout", "env_lost", "env_error", "harness_error")
            continue
        assert extra["exit_code"] == 0 and r["error"] is None
        # every tool call the agent made reached the environment, and the reward is its last step's
        assert all(t["tool_name"] == "run_command" for t in r["tool_trace"])
        assert r["timings"]["tool_calls"] == len(r["tool_trace"])
        if r["tool_trace"]:
            assert r["status"] == "ok" and r["reward"] == r["tool_trace"][-1]["result"]["metadata"]["reward"]
        else:
            assert r["status"] == "unscored" and r["reward"] is None
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["harness"] == "claude-code" and metadata["capture"] is True
    assert json.loads((out / "summary.json").read_text())["rollouts"] == 3


def test_eval_harness_errors_name_what_is_supported_and_how_to_install(tmp_path: Path) -> None:
    """A harness eval cannot run, or one not installed: a clear error before anything starts."""
    base = ["eval", str(SHELL), "--model-url", "http://127.0.0.1:9/v1", "-o", str(tmp_path / "x")]
    other = cli(*base, "--harness", "codex")
    assert other.returncode != 0 and "codex" in other.stderr and "claude-code" in other.stderr
    unknown = cli(*base, "--harness", "nope")
    assert unknown.returncode != 0 and "claude-code" in unknown.stderr
    missing = cli(*base, "--harness", "claude-code", env={"OPENENV_HARNESS_DIR": str(tmp_path / "none")})
    assert missing.returncode != 0, missing.stderr
    assert "bash scripts/install-harnesses.sh claude-code" in " ".join(missing.stderr.split())
    assert not (tmp_path / "x").exists()  # nothing was started or written
