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

Snapshots (fork, save, restore) are exact for deterministic code, and refused otherwise. An
interpreter's state (its objects, imports, files, module internals) cannot be read out of the
process exactly, so a snapshot saves how it came to be: every request the current worker has
answered, in order (the code of each step, the environment's own loading of ``context`` and
listing of variables), with what each printed and its exit code; plus the episode as plain data
(task, iteration, variables listed, final answer, reward settings) and the worker's hash seed
(each session's workers share one, so that ``set`` and ``dict`` orders repeat). Restoring starts
a fresh worker with that seed, runs the same requests again, and checks that each prints the
same (object addresses, ``<... at 0x...>``, aside: no two processes share them) and exits the
same; code whose effect is not reproducible (it reads the clock, unseeded randomness, process
ids, the network) prints something else, and the restore is refused (an error, and the session
starts afresh) rather than continued from a different state. A snapshot is refused at once
while the code has work running in the background (threads, processes, or their output not yet
read): when it would act cannot be replayed. A shipped task's expected answer is not in the
snapshot (the restoring server looks it up by ``task_id``); a custom task's is.
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

from openenv.core.env_server.exceptions import SnapshotUnsupportedError
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


_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+|\.\.\.[^<>\n]*?[0-9a-fA-F]{6,}>")
"""An object's address in its repr, whole (``at 0x7f...``) or as reprlib cuts it (``...7f3a1c>``)."""
_FRESH_WORKER_NOTE = "[a fresh REPL worker was started because"


class ReplayDivergedError(RuntimeError):
    """Restoring a REPL snapshot ran its requests again and one gave another result: the
    session's code is not deterministic, and the snapshot cannot be restored exactly."""


def _addressless(text: str) -> str:
    return _ADDRESS.sub("at 0x?", text)


def _without_fresh_worker_note(text: str) -> str:
    """stderr without the note PythonREPL puts first after it had to start a worker again."""
    first, _, rest = text.partition("\n")
    return rest if first.startswith(_FRESH_WORKER_NOTE) else text


def _first_difference(saved: str, now: str) -> str:
    for number, (a, b) in enumerate(zip(saved.splitlines(), now.splitlines(), strict=False), start=1):
        if a != b:
            return f"line {number}: {a[:120]!r} then, {b[:120]!r} now"
    return f"{len(saved.splitlines())} line(s) then, {len(now.splitlines())} now"


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


def _listing(out: str) -> Optional[Tuple[Dict[str, str], Optional[str]]]:
    """The variables and the ready answer the environment's listing printed (None if it broke)."""
    try:
        found = json.loads(out[out.rindex(_MARK) + len(_MARK) :].splitlines()[0])
        variables = {str(k): str(v) for k, v in dict(found["vars"]).items()}
        answer = found.get("answer")
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return variables, None if answer is None else str(answer)


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
    SUPPORTS_SNAPSHOT = True
    # the worker is replayed, the tasks are the package's, a shipped task's answer is looked up
    SNAPSHOT_EXCLUDE = ("_repl", "_tasks", "_expected")

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
        self._memory_mb = memory
        self._packages = tuple(packages if packages is not None else _env_names("REPL_PACKAGES"))
        # every worker of this session hashes strings alike: a replay then orders sets the same
        self._hash_seed = random.SystemRandom().randrange(1, 2**32)
        self._repl = self._new_repl()
        self._cells: List[Dict[str, Any]] = []  # what the current worker was asked, and answered
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
        self._cells = []
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
            result = self._execute(f"context = {self._state.context or ''!r}", 30)
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
            executed = self._execute(code, timeout_s)
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
            found = _listing(self._execute(_INSPECT, 5).stdout)
        except (IsolationError, OSError):
            found = None
        if found is None:
            return {}, None  # the code broke introspection (or the worker): report nothing
        variables, answer = found
        changed = {k: v for k, v in variables.items() if self._vars.get(k) != v}
        self._vars = variables
        return changed, answer

    def _variable(self, name: str) -> Optional[str]:
        try:
            result = self._execute(f"if True:\n    __import__('sys').stdout.write(str({name}))", 5)
        except (IsolationError, OSError):
            return None
        return result.stdout if result.exit_code == 0 else None

    def _new_repl(self) -> PythonREPL:
        return PythonREPL(
            limits=replace(REPL_LIMITS, memory_mb=self._memory_mb),
            isolation=self.isolation,  # type: ignore[arg-type]
            max_output_bytes=self.max_output_length,
            packages=self._packages,
            env={"PYTHONHASHSEED": str(self._hash_seed)},
        )

    def _execute(self, code: str, timeout_s: float, run_for: Optional[float] = None) -> Any:
        """Every request to the worker goes here: it keeps :attr:`_cells`, what the current worker
        has answered (a snapshot's replay). ``run_for``: the time limit, when not ``timeout_s``."""
        was_running = self._repl.running
        try:
            result = self._repl.execute(code, timeout_s=run_for or timeout_s)
        except BaseException:
            if not self._repl.running:
                self._cells = []
            raise
        # a fresh worker (PythonREPL says so first on stderr when the old one had died), or none
        # left (this call timed out or killed it): what the old one ran is gone
        if not was_running or result.stderr.startswith(_FRESH_WORKER_NOTE) or not self._repl.running:
            self._cells = []
        if self._repl.running:
            self._cells.append(
                {
                    "code": code,
                    "timeout_s": timeout_s,
                    "stdout": result.stdout,
                    "stderr": result.stderr,
                    "exit_code": result.exit_code,
                }
            )
        return result

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

    # --- snapshots (see the module docstring) ------------------------------------------------

    def snapshot_state(self) -> Dict[str, Any]:
        busy = self._repl.background()
        if busy is not None and "cannot be seen" in busy:
            raise SnapshotUnsupportedError(
                f"This REPL session cannot be snapshotted here: {busy}, so work its code left running "
                "cannot be ruled out, and a snapshot replays the session's code. Snapshots of repl_env "
                "work where its REPL runs in the server's own sandboxes (a server run without the broker)"
            )
        if busy is not None:
            raise SnapshotUnsupportedError(
                f"This REPL session cannot be snapshotted now: {busy}. A snapshot replays the session's "
                "code, and when background work acts cannot be replayed; snapshot once it has finished"
            )
        data = super().snapshot_state()
        data["expected"] = self._expected if self._state.task_id == "custom" else None
        return data

    def restore_state(self, data: Dict[str, Any]) -> None:
        data = dict(data)
        expected = data.pop("expected")
        super().restore_state(data)
        if self._state.task_id not in (None, "custom"):
            expected = next((t["answer"] for t in self._tasks if t["id"] == self._state.task_id), None)
            if expected is None:
                raise ValueError(f"the snapshot's task {self._state.task_id!r} is not one of this server's tasks")
        self._expected = expected
        self._repl.close()
        self._repl = self._new_repl()  # with the saved session's hash seed and settings
        self._replay()

    def _replay(self) -> None:
        """Run the saved worker's requests in a fresh one; each must answer as it did."""
        cells, self._cells = self._cells, []
        for number, cell in enumerate(cells, start=1):
            what = "the environment's listing of variables" if cell["code"] == _INSPECT else f"request {number}"
            try:
                result = self._execute(cell["code"], cell["timeout_s"], run_for=max(2 * cell["timeout_s"], 30.0))
            except (IsolationError, OSError) as exc:
                raise ReplayDivergedError(
                    f"the REPL worker could not start again to replay the session: {exc}"
                ) from None
            saved_stderr = _without_fresh_worker_note(cell["stderr"]) if number == 1 else cell["stderr"]
            for stream, saved, now in (
                ("exit code", str(cell["exit_code"]), str(result.exit_code)),
                ("stdout", cell["stdout"], result.stdout),
                ("stderr", saved_stderr, result.stderr),
            ):
                if _addressless(saved) != _addressless(now):
                    self._repl.reset()
                    self._cells = []
                    raise ReplayDivergedError(
                        f"replaying the REPL session, {what} of {len(cells)} gave another {stream} than it did "
                        f"({_first_difference(_addressless(saved), _addressless(now))}). The session's code is not "
                        "deterministic (the clock, unseeded randomness, process ids, ...), so this snapshot cannot "
                        "be restored exactly; nothing was approximated"
                    )
            if cell["code"] == _INSPECT:  # the variables as this worker shows them (their addresses)
                found = _listing(result.stdout)
                if found is not None:
                    self._vars = found[0]

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
