"""The REPL environment: a persistent sandboxed Python interpreter per session, and a task.

``reset`` picks a task — one of the shipped ``tasks.json`` (by ``task_id``, or by ``seed``), or
the caller's own (``context``, ``task_prompt``, ``expected_answer``) — and starts a fresh
interpreter (:class:`openenv.core.tools.PythonREPL`: its own sandboxed worker process, no
network, memory and process caps) whose ``context`` variable holds the task's data. Each step
runs code there; variables, imports and files persist for the episode. A call that runs out of
time kills the worker; the next step gets a fresh one, with ``context`` loaded again.

The episode ends with a final answer — ``REPLAction(is_final=True, final_answer=...)``, a printed
line ``FINAL(answer)`` or ``FINAL_VAR(name)``, or ``answer = {"content": ..., "ready": True}`` —
or when ``max_iterations`` steps have passed.

Reward (upstream's REPL rubric): a final answer that matches the expected one earns 1.0 (else
0.0); each step whose code fails costs 0.05; running out of iterations without an answer costs
0.1. Answers match when equal after stripping whitespace, or when both parse as the same Python
literal (``"[1,2]"`` and ``"[1, 2]"``; ``"42"`` and ``"42.0"``).
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import time
from dataclasses import replace
from importlib import resources
from typing import Any, Dict, List, Optional, Sequence, Tuple
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata
from openenv.core.tools import REPL_LIMITS, IsolationError, PythonREPL

try:
    from ..models import CodeBlockResult, REPLAction, REPLObservation, REPLState
except ImportError:  # served from the package directory as `server.app:app`
    from models import CodeBlockResult, REPLAction, REPLObservation, REPLState  # type: ignore[no-redef]

MAX_ANSWER_CHARS = 10_000
_FINAL = re.compile(r"^\s*FINAL\((.*)\)\s*$", re.M)
_FINAL_VAR = re.compile(r"^\s*FINAL_VAR\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.M)
_MARK = "\x00openenv-repl\x00"
# Runs after each step's code, leaving no name behind: the public names' short reprs, and the
# upstream-style `answer = {"content": ..., "ready": True}` if it is set.
_INSPECT = (
    "if True:\n"
    "    __import__('sys').stdout.write(" + repr(_MARK) + " + __import__('json').dumps({\n"
    "        'vars': {k: __import__('reprlib').repr(v) for k, v in list(globals().items()) if not k.startswith('_')},\n"
    "        'answer': (str(globals()['answer'].get('content')) if isinstance(globals().get('answer'), dict)\n"
    "                   and globals()['answer'].get('ready') else None),\n"
    "    }) + '\\n')\n"
)


def load_tasks() -> List[Dict[str, str]]:
    """The shipped tasks: dicts with ``id``, ``prompt``, ``context`` and ``answer``."""
    try:
        text = resources.files("repl_env").joinpath("tasks.json").read_text()
    except ModuleNotFoundError:  # served from the package directory
        text = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tasks.json")).read()
    return json.loads(text)["tasks"]


def _canonical(answer: str) -> Any:
    text = answer.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def answers_match(given: Optional[str], expected: str) -> bool:
    """Whether ``given`` is ``expected``: equal once stripped, or the same Python literal."""
    if given is None or len(given) > MAX_ANSWER_CHARS:
        return False
    if given.strip() == expected.strip():
        return True
    try:
        return bool(_canonical(given) == _canonical(expected))
    except Exception:  # a literal whose comparison fails
        return False


def _last_line(text: str) -> Optional[str]:
    lines = [line for line in text.strip().splitlines() if not line.startswith("[")]
    return lines[-1] if lines else None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


def _env_names(name: str) -> Tuple[str, ...]:
    return tuple(part.strip() for part in os.environ.get(name, "").split(",") if part.strip())


class REPLEnvironment(Environment[REPLAction, REPLObservation, REPLState]):
    """One session's sandboxed interpreter and task (see the module docstring).

    ``timeout_s`` (``$REPL_TIMEOUT_S``, default 10) bounds each step's code; ``memory_mb``
    (``$REPL_MEMORY_MB``, default 512) caps the worker's memory; ``isolation``
    (``$REPL_ISOLATION``: ``sandbox`` or ``none``, development only) chooses the worker's box.
    The worker imports the standard library only, plus ``packages`` (``$REPL_PACKAGES``,
    comma-separated top-level modules; each shown read-only): never this package and its tasks.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        max_iterations: int = 30,
        timeout_s: Optional[float] = None,
        memory_mb: Optional[int] = None,
        isolation: Optional[str] = None,
        max_output_length: int = 8192,
        context_preview_length: int = 500,
        reward_on_success: float = 1.0,
        reward_on_failure: float = -0.1,
        reward_on_error: float = -0.05,
        packages: Optional[Sequence[str]] = None,
    ) -> None:
        super().__init__()
        self.max_iterations = max_iterations
        self.timeout_s = timeout_s if timeout_s is not None else _env_float("REPL_TIMEOUT_S", 10.0)
        memory = memory_mb if memory_mb is not None else int(_env_float("REPL_MEMORY_MB", 512))
        self.isolation = isolation or os.environ.get("REPL_ISOLATION", "sandbox")
        self.max_output_length = max_output_length
        self.context_preview_length = context_preview_length
        self.reward_on_success = reward_on_success
        self.reward_on_failure = reward_on_failure
        self.reward_on_error = reward_on_error
        self._repl = PythonREPL(
            limits=replace(REPL_LIMITS, memory_mb=memory),
            isolation=self.isolation,  # type: ignore[arg-type]
            max_output_bytes=max_output_length,
            packages=tuple(packages if packages is not None else _env_names("REPL_PACKAGES")),
        )
        self._tasks = load_tasks()
        self._expected: Optional[str] = None
        self._vars: Dict[str, str] = {}
        self._done = False
        self._state = REPLState(episode_id=str(uuid4()), max_iterations=max_iterations)

    # --- episodes ---------------------------------------------------------------------------

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        task_id: Optional[str] = None,
        context: Optional[str] = None,
        task_prompt: Optional[str] = None,
        expected_answer: Optional[str] = None,
        max_iterations: Optional[int] = None,
        **kwargs: Any,
    ) -> REPLObservation:
        """Start an episode on a task: ``task_id``, else a custom one (``context``/``task_prompt``/
        ``expected_answer``), else the shipped task chosen by ``seed`` (at random without one)."""
        if context is not None or task_prompt is not None:
            chosen = {"id": "custom", "prompt": task_prompt or "", "context": context or "", "answer": expected_answer}
        elif task_id is not None:
            matches = [t for t in self._tasks if t["id"] == task_id]
            if not matches:
                known = ", ".join(t["id"] for t in self._tasks)
                raise ValueError(f"unknown task_id {task_id!r}; the shipped tasks are: {known}")
            chosen = matches[0]
        else:
            chosen = random.Random(seed).choice(self._tasks)
        limit = max_iterations if max_iterations is not None else self.max_iterations
        if limit < 1:
            raise ValueError(f"max_iterations must be at least 1, not {limit}")
        self._expected = chosen["answer"]
        self._done = False
        self._vars = {}
        self._state = REPLState(
            episode_id=episode_id or str(uuid4()),
            task_id=chosen["id"],
            context=chosen["context"],
            task_prompt=chosen["prompt"],
            max_iterations=limit,
        )
        self._repl.reset()
        error = self._load_context()
        self._inspect()
        result = CodeBlockResult(success=error is None, exception=error, stderr=error or "")
        return self._observation(result, reward=0.0, done=False)

    def step(self, action: REPLAction, timeout_s: Optional[float] = None, **kwargs: Any) -> REPLObservation:
        if not isinstance(action, REPLAction):
            message = f"repl_env takes a REPLAction, not {type(action).__name__}"
            return self._observation(CodeBlockResult(success=False, exception=message), reward=0.0, done=self._done)
        if self._done:
            message = "the episode is over: call reset() to start another"
            return self._observation(CodeBlockResult(success=False, exception=message), reward=0.0, done=True)
        self._state.iteration += 1
        self._state.step_count += 1
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        result, printed_answer = self._run(action.code, limit) if action.code.strip() else (CodeBlockResult(), None)
        reward = 0.0 if result.success else self.reward_on_error
        answer = action.final_answer if action.is_final else printed_answer
        if action.is_final and answer is None:
            answer = ""
        if answer is not None:
            self._done = True
            self._state.final_answer = answer
            if self._expected is not None and answers_match(answer, self._expected):
                reward += self.reward_on_success
        elif self._state.iteration >= self._state.max_iterations:
            self._done = True
            reward += self.reward_on_failure
        return self._observation(result, reward=round(reward, 10), done=self._done)

    # --- the interpreter --------------------------------------------------------------------

    def _load_context(self) -> Optional[str]:
        """Define ``context`` in a fresh worker; the error if that failed."""
        try:
            result = self._repl.execute(f"context = {self._state.context or ''!r}", timeout_s=30)
        except (IsolationError, OSError) as exc:
            return f"the REPL sandbox could not start: {exc}"
        return None if result.exit_code == 0 else (result.stderr.strip() or f"exit code {result.exit_code}")

    def _run(self, code: str, timeout_s: float) -> Tuple[CodeBlockResult, Optional[str]]:
        """Run the step's code; its result and the answer it gave (FINAL, FINAL_VAR or ``answer``)."""
        notes = ""
        if not self._repl.running:  # the previous call timed out or the worker died
            error = self._load_context()
            notes = "[a fresh interpreter was started; `context` was loaded again]\n" if error is None else ""
        started = time.monotonic()
        try:
            executed = self._repl.execute(code, timeout_s=timeout_s)
        except (IsolationError, OSError) as exc:
            message = f"the REPL sandbox could not run the code: {exc}"
            return CodeBlockResult(stderr=message, success=False, exception=message), None
        elapsed = time.monotonic() - started
        self._state.total_execution_time += elapsed
        success = executed.exit_code == 0
        answer = None
        final = _FINAL.search(executed.stdout)
        final_var = _FINAL_VAR.search(executed.stdout)
        if final_var is not None and (final is None or final_var.start() < final.start()):
            answer = self._variable(final_var.group(1))
        elif final is not None:
            answer = final.group(1).strip()
        snapshot, ready_answer = self._inspect()
        if answer is None:
            answer = ready_answer
        result = CodeBlockResult(
            stdout=executed.stdout,
            stderr=notes + executed.stderr,
            locals_snapshot=snapshot,
            execution_time=elapsed,
            success=success,
            exception=None if success else (_last_line(executed.stderr) or f"exit code {executed.exit_code}"),
        )
        return result, answer

    def _inspect(self) -> Tuple[Dict[str, str], Optional[str]]:
        """The variables this step created or changed, and a ready ``answer`` dict's content."""
        if not self._repl.running:
            self._vars = {}
            return {}, None
        try:
            out = self._repl.execute(_INSPECT, timeout_s=5).stdout
            found = json.loads(out[out.rindex(_MARK) + len(_MARK) :].splitlines()[0])
            variables = {str(k): str(v) for k, v in dict(found["vars"]).items()}
            answer = found.get("answer")
        except (ValueError, KeyError, TypeError, IndexError, IsolationError, OSError):
            return {}, None  # the code broke introspection (or the worker): report nothing
        changed = {k: v for k, v in variables.items() if self._vars.get(k) != v}
        self._vars = variables
        return changed, None if answer is None else str(answer)

    def _variable(self, name: str) -> Optional[str]:
        try:
            result = self._repl.execute(f"if True:\n    __import__('sys').stdout.write(str({name}))", timeout_s=5)
        except (IsolationError, OSError):
            return None
        return result.stdout if result.exit_code == 0 else None

    def _observation(self, result: CodeBlockResult, reward: float, done: bool) -> REPLObservation:
        context = self._state.context or ""
        self._state.namespace_keys = sorted(self._vars)
        return REPLObservation(
            result=result,
            context_preview=context[: self.context_preview_length] if context else None,
            context_length=len(context),
            available_variables=list(self._state.namespace_keys),
            iteration=self._state.iteration,
            max_iterations=self._state.max_iterations,
            task_prompt=self._state.task_prompt,
            reward=reward,
            done=done,
        )

    # --- the rest of the contract -----------------------------------------------------------

    @property
    def state(self) -> REPLState:
        return self._state

    def close(self) -> None:
        """End the session's worker (and its whole process tree)."""
        self._repl.close()

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="repl_env",
            description="A persistent sandboxed Python REPL per session, with a task to solve",
            version="0.1.0",
        )


__all__ = ["MAX_ANSWER_CHARS", "REPLEnvironment", "answers_match", "load_tasks"]
