"""``openenv eval``: a model endpoint over N tasks of an environment, with a report a person reads.

``openenv eval ENV --model-url URL -o DIR`` serves the environment package ENV in the sandbox for
the run (as ``openenv serve`` does; or uses the server at ``--base-url``), plays ``--tasks N``
rollouts (task ``i`` is the episode ``reset(seed=i)`` starts, or the reset argument
``--task-key`` names), ``--concurrency M`` at once, each with the model at ``--model-url`` (any
OpenAI-compatible chat-completions endpoint) as the agent and the environment's tools (its MCP
tools, or one ``act`` tool whose arguments are its action), and writes:

* ``DIR/results.jsonl``: one JSON line per rollout (messages, tool calls, reward, token counts,
  timings, the error that stopped it; with ``--capture``, the captured trace with the engine's
  token ids), appended as rollouts end, so that a killed run resumes where it stopped;
* ``DIR/report.html``: success rate and mean reward with 95% intervals, per task, tokens per
  rollout, failures by cause and charts, in one self-contained page; ``DIR/summary.json``: the
  same figures as JSON; ``DIR/metadata.json``: how the rollouts were made.

With ``--harness NAME`` the agent of each rollout is that agent CLI (``claude-code``), run unchanged in
the sandbox with the environment's tools as its MCP server and the capture proxy (on a Unix socket, in
front of ``--model-url``) as its model.

The engine is :mod:`openenv.core.harness.evaluation`; the figures, :mod:`openenv.core.harness.report`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import typer

from openenv.cli._common import CLIError, err, load_package, out, styled
from openenv.core.utils import shown_path

REPORT_FILE = "report.html"
SUMMARY_FILE = "summary.json"
RESUMABLE = ("tasks", "first_task", "concurrency", "created_at", "env_url", "rollout_timeout_s", "call_timeout_s")
"""Settings a resumed run may change: they do not change how a rollout is made."""
_URL_SCHEMES = ("http://", "https://", "unix://")


class _Progress:
    """Progress on stderr: a rich progress bar on a terminal, else a plain line per rollout."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.live = err.is_terminal
        self.done = self.failed = 0
        self.total = 0
        self.started = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def start(self, total: int, skipped: int) -> None:
        self.total = total
        self.started = time.monotonic()
        if skipped:
            err.print(f"{skipped} rollouts ended in an earlier run: skipped (--no-resume plays them again)")
        if not total:
            return
        if self.live:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[failed]} failed", markup=False),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=err,
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=total, failed=0)
        else:
            err.print(f"{self.label}: {total} rollouts to play")

    def result(self, record: Dict[str, Any]) -> None:
        self.done += 1
        if record["status"] == "failed":
            self.failed += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, failed=self.failed)
            if record["status"] == "failed":
                self._bar.console.print(self._line(record))
            return
        err.print(f"[{self.done}/{self.total}] {self._line(record)}")

    def _line(self, record: Dict[str, Any]) -> str:
        seconds = (record.get("timings") or {}).get("total_s")
        took = f" in {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
        if record["status"] == "failed":
            error = record.get("error") or {}
            return f"{record['episode_id']} failed ({error.get('cause')}){took}: {error.get('message')}"
        reward = record.get("reward")
        shown = "none (unscored)" if reward is None else f"{reward:g}"
        return f"{record['episode_id']} reward {shown}{took}"

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _json_option(text: Optional[str], option: str) -> Dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=option) from None
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=option)
    return value


def _api_key(api_key_env: Optional[str]) -> Optional[str]:
    if not api_key_env:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise CLIError(f"--api-key-env {api_key_env}: that variable is not set (or is empty)")
    return key


class _Environment:
    """The environment's server for the run: the URL given, or the package served in the sandbox."""

    def __init__(self, env: str, base_url: Optional[str], sandbox: bool, memory_mb: int, sessions: int) -> None:
        self.provider: Any = None
        self.package: Optional[Path] = None
        if base_url:
            self.url, self.name = base_url, env
        elif env.startswith(_URL_SCHEMES):
            self.url, self.name = env, env
        else:
            manifest = load_package(env, by_name=True)
            self.package, self.name, self.url = manifest.path, manifest.name, ""
        self.sandbox, self.memory_mb, self.sessions = sandbox, memory_mb, sessions

    def start(self) -> str:
        if self.package is None:
            return self.url
        from openenv.core.containers.runtime import SandboxProvider
        from openenv.core.containers.runtime.isolation import IsolationError

        env_vars = {"OPENENV_MAX_SESSIONS": str(self.sessions)}
        token = os.environ.get("OPENENV_AUTH_TOKEN")
        if token:
            env_vars["OPENENV_AUTH_TOKEN"] = token
        mode = "sandboxed" if self.sandbox else "WITHOUT isolation"
        try:
            self.provider = SandboxProvider(
                str(self.package),
                isolation="sandbox" if self.sandbox else "none",
                memory_mb=self.memory_mb,
                env_vars=env_vars,
                warm=True,
            )
        except IsolationError as exc:
            raise CLIError(f"{exc}\n(or run the server without isolation: --no-sandbox)") from None
        with err.status(f"Starting {self.name} ({mode})..."):
            try:
                self.url = self.provider.start()
                self.provider.wait_for_ready(60)
            except (RuntimeError, TimeoutError, OSError) as exc:
                self.stop()
                raise CLIError(f"the environment server did not start: {exc}") from None
        return self.url

    def stop(self) -> None:
        if self.provider is not None:
            self.provider.stop()
            self.provider = None


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def evaluate(
        env: str = typer.Argument(
            ...,
            metavar="ENV",
            help="The environment: a package (directory or installed name, served in the sandbox for the run), "
            "or a server's URL (http://..., unix://...).",
        ),
        model_url: str = typer.Option(
            ...,
            "--model-url",
            metavar="URL",
            help="An OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp, a hosted API): http://host:8000/v1.",
        ),
        output_dir: str = typer.Option(
            ..., "--output-dir", "-o", metavar="DIR", help="Where results.jsonl, report.html and summary.json go."
        ),
        base_url: Optional[str] = typer.Option(
            None, "--base-url", metavar="URL", help="Use the environment server at URL (ENV is then only its name)."
        ),
        model: Optional[str] = typer.Option(
            None, "--model", metavar="NAME", help="The model to ask for (default: the first the endpoint lists)."
        ),
        api_key_env: Optional[str] = typer.Option(
            None,
            "--api-key-env",
            metavar="NAME",
            help="The environment variable holding the endpoint's key (default: none is sent).",
        ),
        tasks: int = typer.Option(
            8, "--tasks", "-n", min=0, metavar="N", help="Tasks to play (indices from --first-task)."
        ),
        first_task: int = typer.Option(0, "--first-task", min=0, metavar="I", help="The first task's index."),
        repeats: int = typer.Option(1, "--repeats", min=1, metavar="K", help="Rollouts per task."),
        concurrency: int = typer.Option(4, "--concurrency", "-c", min=1, metavar="M", help="Rollouts at once."),
        max_turns: int = typer.Option(8, "--max-turns", min=1, metavar="N", help="Model turns per rollout."),
        temperature: Optional[float] = typer.Option(
            0.0, "--temperature", min=0.0, metavar="T", help="Sampling temperature."
        ),
        max_tokens: Optional[int] = typer.Option(
            512, "--max-tokens", min=1, metavar="N", help="Tokens the model may write per turn."
        ),
        top_p: Optional[float] = typer.Option(None, "--top-p", min=0.0, max=1.0, metavar="P", help="Nucleus sampling."),
        timeout: float = typer.Option(
            300.0, "--timeout", min=0.001, metavar="S", help="A rollout still running after S seconds is a failure."
        ),
        call_timeout: float = typer.Option(
            60.0, "--call-timeout", min=0.001, metavar="S", help="One call on the environment or the model, at most."
        ),
        success_threshold: float = typer.Option(
            1.0, "--success-threshold", metavar="R", help="A rollout succeeds when its reward is at least R."
        ),
        system_prompt: Optional[str] = typer.Option(
            None, "--system-prompt", metavar="TEXT", help="A system message before the task."
        ),
        reset_kwargs: Optional[str] = typer.Option(
            None, "--reset-kwargs", metavar="JSON", help='More arguments for reset, as JSON ({"game_name": "catch"}).'
        ),
        task_key: str = typer.Option(
            "seed", "--task-key", metavar="NAME", help="The reset argument that gets the task index."
        ),
        capture: bool = typer.Option(
            False,
            "--capture/--no-capture",
            metavar="",
            help="Route the model calls through the capture proxy: each record gets the trace with the engine's "
            "token ids and logprobs (needs an engine that returns them, as vLLM does).",
        ),
        harness: Optional[str] = typer.Option(
            None,
            "--harness",
            metavar="NAME",
            help="Run the agent CLI NAME (claude-code) in the sandbox instead of the built-in tool loop, the "
            "environment's tools as its MCP server and the model through the capture proxy. Installed with "
            "`bash scripts/install-harnesses.sh claude-code` (in .harnesses/, or $OPENENV_HARNESS_DIR).",
        ),
        resume: bool = typer.Option(
            True,
            "--resume/--no-resume",
            metavar="",
            help="Skip the rollouts DIR has that ended (default; failed ones play again), or start over.",
        ),
        sandbox: bool = typer.Option(
            True, "--sandbox/--no-sandbox", metavar="", help="Serve the package in the sandbox (default)."
        ),
        memory_mb: int = typer.Option(
            2048, "--memory-mb", min=64, metavar="MB", help="Memory limit of the sandboxed server."
        ),
    ) -> None:
        """Evaluate a model on an environment's tasks: results.jsonl, report.html, a summary.

        Plays N tasks x K repeats, M at once, each a rollout of the model (an OpenAI-compatible endpoint) using the environment's tools, and writes DIR/results.jsonl (a line per rollout, appended as they end: rerun the same command to resume), DIR/report.html (success rate and mean reward with 95% intervals, per task, tokens, failures by cause, charts) and DIR/summary.json. With --harness claude-code each rollout is the agent CLI in the sandbox (the environment's tools as its MCP server, its model calls captured by the proxy). A rollout that hangs or loses its server is recorded as failed with its cause. Exit code 1 when a rollout failed.
        """
        install_root = _check_harness(harness) if harness is not None else None
        from openenv.core.harness.evaluation import ModelEndpoint, ModelError, chat_api_url, served_model

        try:
            api_url = chat_api_url(model_url)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--model-url") from None
        reset = _json_option(reset_kwargs, "--reset-kwargs")
        key = _api_key(api_key_env)
        if model is None:
            try:
                model = served_model(api_url, api_key=key)
            except ModelError as exc:
                raise CLIError(f"{exc} (name the model with --model)") from None
        sampling = {"temperature": temperature, "max_tokens": max_tokens, "top_p": top_p}
        sampling = {k: v for k, v in sampling.items() if v is not None}
        environment = _Environment(env, base_url, sandbox, memory_mb, sessions=max(8, 2 * concurrency))
        metadata = {
            "command": "openenv eval",
            "env": environment.name,
            "env_url": str(environment.package) if environment.package else environment.url,
            "model": model,
            "model_url": api_url,
            "max_turns": max_turns,
            "sampling": sampling,
            "repeats": repeats,
            "success_threshold": success_threshold,
            "system_prompt": system_prompt,
            "reset_kwargs": reset,
            "task_key": task_key,
            "capture": capture or harness is not None,
            "tasks": tasks,
            "first_task": first_task,
            "concurrency": concurrency,
            "rollout_timeout_s": timeout,
            "call_timeout_s": call_timeout,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        if harness is not None:  # (only then: the metadata of a run without one stays as it was)
            metadata["harness"] = harness
        from openenv.core.harness.collect import RolloutSerializer

        serializer = RolloutSerializer(output_dir)
        if resume:
            try:
                metadata = {**serializer.ensure_metadata(metadata, ignore=RESUMABLE), **_run_fields(metadata)}
            except ValueError as exc:
                raise CLIError(f"{exc}; write to another --output-dir, or start over with --no-resume") from None
        else:
            moved = serializer.backup_results()
            if moved is not None:
                err.print(f"Moved the earlier results to {shown_path(moved)}")
            serializer.write_metadata(metadata)
        endpoint = ModelEndpoint(api_url, model, key, timeout_s=call_timeout)
        settings = dict(
            tasks=tasks,
            first_task=first_task,
            repeats=repeats,
            concurrency=concurrency,
            max_turns=max_turns,
            sampling=sampling,
            rollout_timeout_s=timeout,
            success_threshold=success_threshold,
        )
        agent = (harness, install_root) if harness is not None else None
        run = _run(
            environment, endpoint, serializer, settings, reset, system_prompt, task_key, call_timeout, capture, agent
        )
        _report(serializer, metadata, run, success_threshold, concurrency)
        if run.failed:
            raise CLIError(
                f"{run.failed} of {run.ran} rollouts failed (causes above and in the report); "
                "rerun the same command to play them again"
            )


def _check_harness(harness: str) -> Path:
    """Where the agent CLI ``harness`` is installed; a clear error when openenv eval cannot run it
    (unknown, not wired for MCP tools, not installed, no bubblewrap for its sandbox)."""
    from openenv.core.containers.runtime.isolation import find_bwrap
    from openenv.core.harness import agents
    from openenv.core.harness.cli_runner import MCP_HARNESSES

    supported = ", ".join(sorted(MCP_HARNESSES))
    if harness not in agents.HARNESSES:
        raise typer.BadParameter(
            f"{harness!r}: openenv eval runs {supported} (the harnesses are {', '.join(sorted(agents.HARNESSES))})",
            param_hint="--harness",
        )
    if harness not in MCP_HARNESSES:
        raise CLIError(
            f"--harness {harness}: openenv eval cannot give {harness} the environment's tools yet; "
            f"it runs {supported} (or leave --harness out for the built-in tool loop)"
        )
    root = agents.harness_dir()
    if agents.installed(harness, root) is None:
        raise CLIError(
            f"--harness {harness}: it is not installed in {shown_path(root)}; install it with "
            f"`bash scripts/install-harnesses.sh {harness}` (or set OPENENV_HARNESS_DIR to where it is installed)"
        )
    if find_bwrap() is None:
        raise CLIError(
            f"--harness {harness}: the agent runs in a bubblewrap sandbox, and bwrap is not installed "
            "(apt-get install bubblewrap)"
        )
    return root


def _run_fields(metadata: Dict[str, Any]) -> Dict[str, Any]:
    """This run's own values of the settings a resumed run may change (for its report)."""
    return {k: metadata[k] for k in RESUMABLE if k in metadata and k != "created_at"}


def _run(
    environment: _Environment,
    endpoint: Any,
    serializer: Any,
    settings: Dict[str, Any],
    reset: Dict[str, Any],
    system_prompt: Optional[str],
    task_key: str,
    call_timeout: float,
    capture: bool,
    agent: Optional[Tuple[str, Path]] = None,
) -> Any:
    from openenv.core.harness.env_sessions import EnvSessionFactory, describe_environment
    from openenv.core.harness.evaluation import EvalRunner, EvalSettings

    url = environment.start()
    proxy = None
    journal: Any = None
    harness = None
    progress = _Progress(f"eval {environment.name}")
    try:
        token = os.environ.get("OPENENV_AUTH_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            interface = describe_environment(url, headers=headers)
        except Exception as exc:
            raise CLIError(f"cannot read the environment's tools at {url}: {exc}") from None
        factory = EnvSessionFactory(
            url,
            interface=interface,
            reset_kwargs=reset,
            system_prompt=system_prompt,
            task_key=task_key,
            call_timeout_s=call_timeout,
            headers=headers,
        )
        tools = ", ".join(getattr(t, "name", "?") for t in interface.tools)
        err.print(styled("Evaluating {} on {} (tools: {})", endpoint.model, environment.name, tools))
        if agent is not None:
            import shutil

            from openenv.core.harness.capture import CaptureServer
            from openenv.core.harness.evaluation import AgentHarness

            # the sandboxed agent reaches nothing but Unix sockets; a short path (under 108 bytes)
            journal = _ScratchDir(tempfile.mkdtemp(prefix="oe-eval-", dir="/tmp"))
            proxy = CaptureServer(
                llm_url=endpoint.api_url,
                model=endpoint.model,
                uds=os.path.join(journal.name, "proxy.sock"),
                api_key=endpoint.api_key,
                journal_dir=os.path.join(journal.name, "journal"),
                max_output_tokens=settings["sampling"].get("max_tokens") or 8192,
            ).start()
            sampling = {k: settings["sampling"][k] for k in ("temperature", "top_p") if k in settings["sampling"]}
            try:
                harness = AgentHarness(
                    agent[0],
                    proxy=proxy,
                    model=endpoint.model,
                    install_root=agent[1],
                    node=shutil.which("node"),
                    eval_sampling=sampling,
                )
            except (ValueError, FileNotFoundError) as exc:
                raise CLIError(f"--harness {agent[0]}: {exc}") from None
            err.print(styled("The agent: {} (sandboxed), its model through the capture proxy", agent[0]))
        elif capture:
            from openenv.core.harness.capture import CaptureServer

            journal = tempfile.TemporaryDirectory(prefix="openenv-eval-capture-")
            proxy = CaptureServer(
                llm_url=endpoint.api_url,
                model=endpoint.model,
                port=0,
                api_key=endpoint.api_key,
                journal_dir=journal.name,
            ).start()
        runner = EvalRunner(
            session_factory=factory,
            model=endpoint,
            serializer=serializer,
            settings=EvalSettings(**settings),
            capture=proxy,
            agent=harness,
            on_start=progress.start,
            on_result=progress.result,
        )
        return runner.run(resume=True)  # (without --resume the earlier results were moved aside)
    finally:
        progress.stop()
        if proxy is not None:
            proxy.stop()
        if journal is not None:
            journal.cleanup()
        environment.stop()


class _ScratchDir:
    """A directory of the run's own, removed at its end (``cleanup``, as a TemporaryDirectory)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def cleanup(self) -> None:
        import shutil

        shutil.rmtree(self.name, ignore_errors=True)


def _report(serializer: Any, metadata: Dict[str, Any], run: Any, threshold: float, concurrency: int) -> None:
    from openenv.core.harness.report import render_html, summarize, summary_lines

    records = serializer.read_records()
    figures = {"wall_s": round(run.wall_s, 3), "rollouts": run.ran, "skipped": run.skipped, "concurrency": concurrency}
    summary = summarize(records, success_threshold=threshold, settings=metadata, run=figures)
    directory = serializer.output_dir
    (directory / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    report = directory / REPORT_FILE
    report.write_text(render_html(summary))
    for line in summary_lines(summary):
        err.print(line)
    err.print(f"Report: {shown_path(report)}")
    out.print(shown_path(report))
    sys.stdout.flush()


__all__: List[str] = ["register"]
