"""TRL 1.16's async GRPO harness path (``trl.experimental.async_grpo.openenv_harness``), unchanged,
against this package (issue 39, point 2 and the first bullet of its "done when").

What runs is TRL's own rollout worker: ``_child_main`` (the function TRL's
``HarnessRolloutWorker.start()`` runs in its spawned child) builds ``_HarnessRolloutLoop`` and runs
its generate and score loops; each rollout goes through ``_HarnessRolloutLoop._run_session`` (the
per-session entry: ``factory.create(prompt, seed=<group id>, episode_id=<uuid hex>)``, the run, the
trace, ``session.verify(...).env_reward``, ``close()``), and the scored ``RolloutSample`` rows land
in the rollout buffer the trainer drains. What stands in, and why:

* the child runs on a thread of this process, with ``queue.Queue`` buffers (TRL's
  ``RolloutWorkerProtocol`` names this "an in-process worker"): ``HarnessRolloutWorker`` itself
  refuses to be built without vLLM installed (``AsyncRolloutWorker.__init__`` checks), and a
  spawned child would re-import torch and TRL for tens of seconds;
* vLLM is the tiny real engine (``openenv.testing.tiny_engine``), served with its
  ``/v1/chat/completions`` (for the capture proxy) plus vLLM's ``/v1/completions`` on token ids,
  written here on the same engine, which TRL's white-box model step (``_sample_turn`` →
  ``_generate_one_turn``) posts to;
* the tokenizer is the tiny engine's, given TRL's Qwen 3 ``response_template`` by hand (its chat
  template is Qwen's format; TRL's ``add_response_schema`` only knows published templates by text).

The environment is ``shell_env`` from the catalogue, served by ``SandboxProvider`` (bubblewrap, a
Unix socket); its task is checked by the environment itself when the step budget runs out, and that
check's reward is what must reach TRL. White box: TRL's model step samples every turn through our
``MCPHarnessAdapter``. Loop-owning: ``CapturedAgentSession`` runs a minimal agent against the
environment's tools through the capture proxy, and TRL reads the proxy's ``TrainingTrace``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import multiprocessing
import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

pytest.importorskip("torch", reason="the tiny engine needs torch")
pytest.importorskip("transformers", reason="the tiny engine needs transformers")
pytest.importorskip("aiohttp", reason="TRL's async rollout worker needs aiohttp")
pytest.importorskip("trl", reason="TRL's async GRPO harness path needs TRL (pip install 'trl>=1.16')")
pytest.importorskip("shell_env", reason="shell_env is not installed (pip install -e envs/shell_env)")

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from starlette.requests import Request

from openenv.core.containers.runtime.isolation import find_bwrap

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")

ROOT = Path(__file__).resolve().parents[2]
SHELL_ENV = ROOT / "envs" / "shell_env"
MODEL = "openenv/tiny-engine"
PROMPT = [{"role": "system", "content": "You work in a shell. Use the tools."}]
MAX_STEPS = 2  # shell_env runs its task's check after this many tool calls: the reward is the env's verdict
ROLLOUTS = 2  # one GRPO group
RUN_TIMEOUT_S = 90.0
AGENT_SEED = 1  # see test_loop_owning_...: a seed whose rollout reaches shell_env's check


# --- the real parts -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Any:
    from openenv.testing.tiny_engine import TinyEngine

    return TinyEngine.build(tool_name="run_command")  # shell_env's tool; trained once, then cached


class CompletionsLog:
    """What the engine answered on ``/v1/completions``: (prompt ids, sampled ids, logprobs) per call."""

    def __init__(self) -> None:
        self.calls: List[Tuple[List[int], List[int], List[float]]] = []
        self._lock = threading.Lock()

    def add(self, prompt: List[int], ids: List[int], logprobs: List[float]) -> None:
        with self._lock:
            self.calls.append((prompt, ids, logprobs))


def _completion(engine: Any, body: Dict[str, Any]) -> Dict[str, Any]:
    """vLLM's ``/v1/completions`` on token ids, as TRL's ``_generate_one_turn`` asks it: one
    choice with ``token_ids`` (``return_token_ids``) and ``logprobs.token_logprobs``."""
    from openenv.testing.tiny_engine import SamplingParams

    prompt = body["prompt"]
    if prompt and isinstance(prompt[0], list):
        (prompt,) = prompt
    if not prompt or not all(type(t) is int for t in prompt):
        raise ValueError("prompt must be a list of token ids")
    if body.get("n", 1) != 1 or body.get("repetition_penalty", 1.0) != 1.0:
        raise ValueError("the tiny engine samples n=1 without a repetition penalty")
    params = SamplingParams(
        temperature=float(body.get("temperature", 1.0)),
        top_p=float(body.get("top_p", 1.0)),
        top_k=int(body.get("top_k", 0)),
        min_p=float(body.get("min_p") or 0.0),
        seed=body.get("seed"),
        max_tokens=int(body.get("max_tokens", 16)),
        logprobs=body.get("logprobs"),
    )
    done = engine.complete(prompt, params)
    logprobs = [float(step.logprob) for step in done.steps]
    choice = {
        "index": 0,
        "text": done.text,
        "token_ids": done.token_ids,
        "prompt_token_ids": list(prompt),
        "logprobs": {
            "tokens": [engine.token_texts[t] for t in done.token_ids],
            "token_logprobs": logprobs,
            "top_logprobs": [{engine.token_texts[s.token_id]: s.logprob} for s in done.steps],
        },
        "finish_reason": done.finish_reason,
        "stop_reason": done.stop_reason,
    }
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(done.steps)}
    return {"id": "cmpl-tiny", "object": "text_completion", "model": body["model"], "choices": [choice], "usage": usage}


@pytest.fixture(scope="module")
def completions_log() -> CompletionsLog:
    return CompletionsLog()


@pytest.fixture(scope="module")
def engine_url(engine: Any, completions_log: CompletionsLog) -> Iterator[str]:
    """The tiny engine behind vLLM's routes: its own chat completions, and completions on token ids."""
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    from openenv.core.env_server.serving.runner import BackgroundServer
    from openenv.testing.tiny_engine import create_app

    app = create_app(engine, served_model_name=MODEL)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = json.loads(await request.body())
        if body.get("model") != MODEL:
            return JSONResponse({"error": {"message": f"model {body.get('model')!r} is not served"}}, status_code=404)
        try:
            answer = await run_in_threadpool(_completion, engine, body)
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "BadRequestError"}}, status_code=400)
        choice = answer["choices"][0]
        completions_log.add(choice["prompt_token_ids"], choice["token_ids"], choice["logprobs"]["token_logprobs"])
        return JSONResponse(answer)

    with BackgroundServer(app) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def shell_url() -> Iterator[str]:
    """shell_env served in the sandbox (bubblewrap, no network, a Unix socket)."""
    from openenv.core.containers.runtime import SandboxProvider

    provider = SandboxProvider(str(SHELL_ENV))
    url = provider.start()
    try:
        provider.wait_for_ready(60)
        yield url
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def shell_tools(shell_url: str) -> List[Any]:
    from shell_env import ShellEnv

    with ShellEnv(base_url=shell_url).sync() as client:
        return [t for t in client.list_tools() if t.name == "run_command"]  # the tool the tiny model calls


@pytest.fixture(scope="module")
def proxy(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from openenv.core.harness.capture import CaptureServer

    journal = tmp_path_factory.mktemp("capture") / "journal"
    with CaptureServer(
        llm_url=f"{engine_url}/v1", model=MODEL, port=0, journal_dir=str(journal), max_output_tokens=64
    ) as server:
        yield server


@pytest.fixture(scope="module")
def tokenizer(engine: Any) -> Any:
    """The engine's tokenizer with TRL's Qwen 3 response template: TRL parses each sampled turn with it."""
    from trl.chat_template_utils import qwen3_template

    tok = copy.deepcopy(engine.tokenizer)
    tok.response_template = copy.deepcopy(qwen3_template)
    return tok


# --- the environment's sessions -------------------------------------------------------------------


def _session_class() -> type:
    from openenv.core.harness import StepEnvSessionAdapter

    class RecordingShellSession(StepEnvSessionAdapter):
        """shell_env as a ResourceSession that keeps every tool result and verdict it gave."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.results: List[Any] = []
            self.verdicts: List[Any] = []

        def call_tool(self, name: str, arguments: Dict[str, Any]) -> Any:
            result = super().call_tool(name, arguments)
            self.results.append(result)
            return result

        def verify(self, transcript: Any, final_state: Any = None) -> Any:
            verdict = super().verify(transcript, final_state)
            self.verdicts.append(verdict)
            return verdict

    return RecordingShellSession


class ShellSessions:
    """The rollouts' environment sessions: shell_env task ``seed`` (TRL's group id), a budget of
    :data:`MAX_STEPS` tool calls. Sessions past ``wanted`` wait until the test stops TRL, then fail
    (TRL scores those as unscorable), so the worker plays exactly one group."""

    def __init__(self, url: str, tools: List[Any], wanted: int = ROLLOUTS) -> None:
        from openenv.core.env_server.mcp_types import CallToolAction

        self.url, self.tools, self.wanted = url, tools, wanted
        self.calls: List[Tuple[Any, Optional[int], Optional[str]]] = []
        self.sessions: List[Any] = []
        self.enough = threading.Event()
        self._lock = threading.Lock()
        self._issued = 0
        self._action = lambda name, args: CallToolAction(tool_name=name, arguments=args)
        self._cls = _session_class()

    def create(self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None) -> Any:
        from shell_env import ShellEnv

        with self._lock:
            extra = self._issued >= self.wanted
            self._issued += 1
        if extra:
            self.enough.wait(RUN_TIMEOUT_S)
            raise RuntimeError("the test plays one group only")
        self.calls.append((copy.deepcopy(task), seed, episode_id))

        def opening(reset: Any, task: Any) -> List[Dict[str, Any]]:
            return [*[dict(m) for m in task], {"role": "user", "content": reset.observation.instruction}]

        session = self._cls(
            ShellEnv(base_url=self.url),
            task=task,
            seed=seed,
            episode_id=episode_id,
            reset_kwargs={"max_steps": MAX_STEPS},
            tool_specs=self.tools,
            action_builder=self._action,
            initial_messages_builder=opening,
        )
        with self._lock:
            self.sessions.append(session)
        return session

    def all_closed(self) -> bool:
        with self._lock:
            return len(self.sessions) == self.wanted and all(s.closed for s in self.sessions)


# --- TRL's worker, on a thread --------------------------------------------------------------------


@pytest.fixture
def child_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_child_main`` scrubs the environment as a child would (CUDA_VISIBLE_DEVICES, RANK, ...);
    on a thread that is this process's: restore it afterwards."""
    from trl.experimental.async_grpo.async_rollout_worker import _CHILD_ENV_TO_STRIP

    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", *_CHILD_ENV_TO_STRIP):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:  # recorded as unset, so that teardown removes what the child sets
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)


class TRLWorker:
    """TRL's rollout-worker child, ``_child_main(_HarnessRolloutLoop, ...)``, on a thread."""

    def __init__(self, **loop_kwargs: Any) -> None:
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        self.exception_info: queue.Queue = queue.Queue(maxsize=1)
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.failed = threading.Event()
        self.metrics: List[Dict[str, Any]] = []
        self.error: Optional[BaseException] = None
        self._kwargs = {"queue_maxsize": 0, "dataset_start_index": 0, **loop_kwargs}  # as AsyncRolloutWorker adds
        self._thread = threading.Thread(target=self._main, name="trl-rollout-child", daemon=True)

    def _main(self) -> None:
        from trl.experimental.async_grpo.async_rollout_worker import _child_main
        from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker

        try:
            _child_main(
                HarnessRolloutWorker._loop_cls,
                self._kwargs,
                self.rollout_buffer,
                multiprocessing.Value("i", 0),
                self.stop_event,
                self.ready,
                multiprocessing.Value("d", time.time()),
                self.failed,
                self.exception_info,
                self.metrics_queue,
            )
        except BaseException as exc:
            self.error = exc

    def _drain_metrics(self) -> None:
        while True:
            try:
                self.metrics.append(self.metrics_queue.get_nowait())
            except queue.Empty:
                return

    def play_one_group(self, sessions: ShellSessions) -> List[Any]:
        """Run until TRL closed the group's sessions and scored the group; stop; the rows it produced."""
        self._thread.start()
        deadline = time.monotonic() + RUN_TIMEOUT_S
        try:
            while time.monotonic() < deadline and self._thread.is_alive() and not self.failed.is_set():
                self._drain_metrics()
                if sessions.all_closed() and any("rollout/score_s" in m for m in self.metrics):
                    break
                time.sleep(0.05)
        finally:
            sessions.enough.set()
            self.stop_event.set()  # what AsyncRolloutWorker.stop() sets; TRL's watcher stops the loop
            self._thread.join(60)
        assert not self._thread.is_alive(), "TRL's rollout loop did not stop within 60 s"
        info = None if self.exception_info.empty() else self.exception_info.get_nowait()
        assert self.error is None and not self.failed.is_set(), f"TRL's rollout loop failed: {info or self.error!r}"
        self._drain_metrics()
        assert any("rollout/score_s" in m for m in self.metrics), "TRL scored no group in time"
        rows = []
        while not self.rollout_buffer.empty():
            rows.append(self.rollout_buffer.get_nowait())
        return rows


def loop_kwargs(tokenizer: Any, engine: Any, engine_url: str, **extra: Any) -> Dict[str, Any]:
    """What AsyncGRPOTrainer hands its worker, for one prompt and a group of :data:`ROLLOUTS`."""
    from datasets import Dataset

    return {
        "model_name": MODEL,
        "dataset": Dataset.from_list([{"prompt": PROMPT}]),
        "reward_funcs": [],
        "processing_class": tokenizer,
        "eos_token_ids": sorted(engine.eos_token_ids),
        "num_generations": ROLLOUTS,
        "max_inflight_tasks": ROLLOUTS,
        "vllm_server_url": engine_url,
        "max_tokens": 48,
        "max_tool_calling_iterations": 3,
        "request_timeout": 60,
        **extra,
    }


# --- checks ---------------------------------------------------------------------------------------

Turn = Tuple[List[int], List[int], List[float]]


def _same(got: Optional[float], want: Optional[float]) -> bool:
    if want is None:
        return got is None or math.isnan(got)
    return got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)


def check_rows(rows: List[Any], rollouts: List[Tuple[List[Turn], Optional[float]]]) -> None:
    """TRL's training rows are the rollouts' turns, exactly: every run of trained tokens in a row is
    one turn's sampled ids, preceded by that turn's prompt ids, with the engine's logprobs; context
    is untrained with logprob 0; every turn is trained; each row carries its rollout's env reward."""
    import numpy as np

    turns: Dict[Tuple[int, ...], List[Tuple[List[int], List[float], Optional[float]]]] = {}
    for rollout_turns, reward in rollouts:
        for prompt, completion, logprobs in rollout_turns:
            assert prompt and completion and len(logprobs) == len(completion)
            turns.setdefault(tuple(completion), []).append((prompt, logprobs, reward))
    assert rows, "TRL produced no training rows"
    trained = set()
    for row in rows:
        ids, mask, lps = row.input_ids.tolist(), row.completion_mask.tolist(), row.old_log_probs.tolist()
        assert len(ids) == len(mask) == len(lps) and set(mask) <= {0, 1}
        assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if m == 0)
        runs = [(m.start(), m.end()) for m in re.finditer("1+", "".join(map(str, mask)))]
        assert runs, "a row without trained tokens"
        reward = row.metrics["rewards/harness_reward"]
        for start, end in runs:
            key = tuple(ids[start:end])
            assert key in turns, "trained tokens that no turn sampled"
            found = [
                r
                for prompt, logprobs, r in turns[key]
                if ids[:start] == prompt and np.allclose(lps[start:end], logprobs, rtol=1e-6, atol=1e-6)
            ]
            assert found, "a turn's tokens without its prompt or its logprobs"
            assert all(_same(reward, r) for r in found), (reward, found)
            trained.add(key)
        assert _same(row.metrics["reward"], found[0])
        assert row.group_id == 0 and row.model_version == 0 and math.isfinite(row.advantage)
    assert trained == set(turns), "a sampled turn that TRL does not train"


def check_env_verdict(session: Any) -> float:
    """The session was verified once, and its reward is the one shell_env's own check produced."""
    assert len(session.verdicts) == 1 and session.closed
    verdict = session.verdicts[0]
    assert session.results, (
        "the model called no tool, so the environment gave no reward (a changed tiny model? try another AGENT_SEED)"
    )
    last = session.results[-1]
    observation = last.data["observation"]
    check = (observation.get("metadata") or {}).get("check")
    assert last.done and check is not None, f"the episode did not reach shell_env's check: {observation}"
    assert verdict.env_reward is not None and verdict.env_reward == last.metadata["reward"] == check["reward"]
    assert verdict.env_reward == (1.0 if check["passed"] else 0.0)
    return verdict.env_reward


def check_create_calls(sessions: ShellSessions) -> None:
    """TRL called ``factory.create(prompt, seed=<group id>, episode_id=<uuid hex>)``."""
    assert len(sessions.calls) == ROLLOUTS
    assert [(task, seed) for task, seed, _ in sessions.calls] == [(PROMPT, 0)] * ROLLOUTS
    episode_ids = [episode for _, _, episode in sessions.calls]
    assert all(re.fullmatch(r"[0-9a-f]{32}", e or "") for e in episode_ids) and len(set(episode_ids)) == ROLLOUTS


# --- tests ----------------------------------------------------------------------------------------


def test_trls_harness_module_imports_this_package() -> None:
    import openenv.core.harness as harness
    import openenv.core.llm_client as llm_client
    from openenv.core.harness.capture import upstream

    trl_harness = pytest.importorskip("trl.experimental.async_grpo.openenv_harness")
    for name in ("HarnessAdapter", "HarnessRunLimits", "ModelStepResult", "ResourceSessionFactory", "TraceEntry"):
        assert getattr(trl_harness, name) is getattr(harness, name)
    assert trl_harness.TrainableSession is harness.TrainableSession
    assert trl_harness.TrainingTrace is harness.TrainingTrace
    assert trl_harness.training_sampling is upstream.training_sampling
    assert trl_harness.LLMResponse is llm_client.LLMResponse and trl_harness.ToolCall is llm_client.ToolCall
    assert issubclass(trl_harness.HarnessRolloutWorker._loop_cls, trl_harness._HarnessRolloutLoop)


def test_trls_default_sampling_is_a_valid_training_policy() -> None:
    """The policy TRL's loop-owning worker derives from AsyncGRPOConfig's defaults, as it derives it."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from openenv.core.harness.capture.upstream import NON_POLICY_SAMPLING, training_sampling

    defaults = {f.name: f.default for f in dataclasses.fields(AsyncGRPOConfig)}
    asked = {k: defaults[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")}
    asked = {k: v for k, v in asked.items() if v is not None}
    assert asked["temperature"] == 1.0 and asked["top_k"] == 0
    assert training_sampling(asked) == {"temperature": 1.0, **NON_POLICY_SAMPLING}


def test_white_box_trl_samples_every_turn_of_a_sandboxed_shell_env(
    child_env: None,
    tokenizer: Any,
    engine: Any,
    engine_url: str,
    completions_log: CompletionsLog,
    shell_url: str,
    shell_tools: List[Any],
) -> None:
    from openenv.core.harness import MCPHarnessAdapter

    class RecordingAdapter(MCPHarnessAdapter):
        def __init__(self) -> None:
            self.rollouts: Dict[int, Any] = {}

        def run_white_box(self, model_step: Any, session: Any, limits: Any = None) -> Any:
            rollout = super().run_white_box(model_step, session, limits)
            self.rollouts[id(session)] = (rollout, limits)
            return rollout

    sessions = ShellSessions(shell_url, shell_tools)
    adapter = RecordingAdapter()
    worker = TRLWorker(
        **loop_kwargs(tokenizer, engine, engine_url, temperature=0.0),  # greedy: the tiny model calls its tool
        harness_session_factory=lambda: sessions,  # white box: TRL calls the factory with no arguments
        harness_adapter=adapter,
    )
    rows = worker.play_one_group(sessions)

    check_create_calls(sessions)
    rollouts = []
    for session in sessions.sessions:
        rollout, limits = adapter.rollouts[id(session)]
        assert (limits.max_turns, limits.sampling) == (3, {"temperature": 0.0, "max_tokens": 48})
        reward = check_env_verdict(session)
        # TRL's model step handed back the engine's own tokens: what /v1/completions answered
        steps = [(s.prompt_ids, s.completion_ids, s.logprobs) for s in rollout.steps]
        assert len(steps) == MAX_STEPS and all(step in completions_log.calls for step in steps)
        # each turn's prompt is TRL's render of the conversation our adapter kept
        for step, event in zip(rollout.steps, [e for e in rollout.events if e.type == "model_response"], strict=True):
            shown = rollout.messages[: event.payload["message_index"]]
            rendered = tokenizer.apply_chat_template(
                shown, tools=[_function(t) for t in shell_tools], add_generation_prompt=True, return_dict=False
            )
            assert step.prompt_ids == rendered
        assert rollout.metrics["tool_calls"] == MAX_STEPS and rollout.metrics["stop_reason"] == "env_done"
        rollouts.append((steps, reward))
        matching = [r for r in rows if r.completion == rollout.messages]
        assert matching and all(r.metrics["tools/call_frequency"] == MAX_STEPS for r in matching)
    check_rows(rows, rollouts)
    # each conversation re-rendered cleanly: one row per rollout, its turns chained
    assert len(rows) == ROLLOUTS


def _function(tool: Any) -> Dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.input_schema},
    }


def test_loop_owning_trl_trains_the_capture_proxys_trace_of_an_agent(
    child_env: None, tokenizer: Any, engine: Any, engine_url: str, proxy: Any, shell_url: str, shell_tools: List[Any]
) -> None:
    from openenv.core.harness import TrainableSession
    from openenv.core.harness.capture.upstream import training_sampling
    from openenv.core.harness.captured import CapturedAgentSession, CapturedAgentSessionFactory, chat_tool_agent

    made: List[Any] = []

    class RecordingFactory(CapturedAgentSessionFactory):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.kwargs = kwargs
            self.sessions: List[CapturedAgentSession] = []
            made.append(self)

        def create(self, task: Any, seed: Optional[int] = None, episode_id: Optional[str] = None) -> Any:
            session = super().create(task, seed=seed, episode_id=episode_id)
            assert isinstance(session, TrainableSession)
            self.sessions.append(session)
            return session

    sessions = ShellSessions(shell_url, shell_tools)
    # Seeded: the same rollout every run, one in which the tiny model (at temperature 1, which the
    # proxy pins) calls its tool until shell_env runs the check (about half of the seeds do).
    agent = chat_tool_agent(max_turns=4, max_tokens=48, seed=AGENT_SEED)
    worker = TRLWorker(
        **loop_kwargs(tokenizer, engine, engine_url),  # TRL's default sampling: temperature 1.0
        # loop-owning: TRL calls the factory with sampling=training_sampling(its policy)
        harness_session_factory=functools.partial(
            RecordingFactory, proxy, sessions, agent, model=MODEL, timeout_s=60.0, delete_on_close=False
        ),
    )
    rows = worker.play_one_group(sessions)

    (factory,) = made
    policy = training_sampling({"temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0})
    assert factory.kwargs["sampling"] == policy
    check_create_calls(sessions)
    rollouts = []
    try:
        for captured, env_session in zip(factory.sessions, sessions.sessions, strict=True):
            assert captured.exit_code == 0 and captured.error is None
            assert proxy.registry.get(captured.session_id).sampling == policy
            reward = check_env_verdict(env_session)
            trace = proxy.training_trace(captured.session_id)  # what TRL fetched, read again
            assert len(trace.turns) >= len(env_session.results) >= 1
            for turn in trace.turns:
                n = len(turn.prompt_token_ids)
                assert turn.loss_mask == [0] * n + [1] * len(turn.completion_token_ids)
                assert turn.metadata["sampling_params"]["temperature"] == 1.0
                # the engine's own prompt ids: a local render of the same request gives the same
                assert turn.prompt_token_ids == engine.render(turn.request["messages"], turn.request["tools"])
            rollouts.append(
                ([(t.prompt_token_ids, t.completion_token_ids, t.per_token_logps) for t in trace.turns], reward)
            )
            # the completion TRL keeps: the last request's messages and the last reply
            last = trace.to_trace_entries()[-1]
            expected = [*last["request"]["messages"], {"role": "assistant", "content": _content(last)}]
            assert any(r.completion == expected for r in rows)
    finally:
        for captured in factory.sessions:
            proxy.delete_session(captured.session_id)
    check_rows(rows, rollouts)
    # TRL forks a row at the first token of drift here (lossless capture: fork_threshold_tokens=0);
    # each captured prompt extends the last turn's tokens exactly, so each rollout is one row
    assert len(rows) == ROLLOUTS


def _content(entry: Dict[str, Any]) -> str:
    return entry["response"]["choices"][0]["message"].get("content", "")


def test_a_captured_session_that_never_finishes_times_out_and_close_stops_it(proxy: Any) -> None:
    """``wait_for_completion`` raises ``TimeoutError`` (TRL then trains what was captured), the
    agent is told to stop, and ``close`` ends it, closes the environment and deletes the capture."""
    from openenv.core.harness import ResourceSession, ToolResult, VerifyResult
    from openenv.core.harness.captured import AgentRun, CapturedAgentSession

    class Idle(ResourceSession):
        closed = False

        def initial_messages(self) -> List[Dict[str, Any]]:
            return [{"role": "user", "content": "wait"}]

        def list_tools(self) -> List[Any]:
            return []

        def call_tool(self, name: str, arguments: Dict[str, Any]) -> ToolResult:
            raise KeyError(f"Unknown tool: {name}")

        def verify(self, transcript: Any, final_state: Any = None) -> VerifyResult:
            return VerifyResult(env_reward=None)

        def close(self) -> None:
            self.closed = True

    seen: List[AgentRun] = []

    def stuck(run: AgentRun) -> int:
        seen.append(run)
        run.cancelled.wait(30)
        return 3

    env = Idle()
    session = CapturedAgentSession(env, proxy, stuck, episode_id="e1", timeout_s=0.2)
    assert proxy.registry.get(session.session_id) is not None
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.2 s"):
        session.wait_for_completion()
    assert seen[0].cancelled.is_set() and seen[0].base_url == proxy.url + "/v1" and seen[0].api_key
    assert session.fetch_training_trace().turns == []  # no model call: empty, not a broken capture
    assert session.wait_for_completion(10) == 3  # the agent saw the cancel and ended
    assert session.verify([]).env_reward is None  # no reward is made up for it
    session.close()
    session.close()
    assert env.closed and proxy.registry.get(session.session_id) is None
