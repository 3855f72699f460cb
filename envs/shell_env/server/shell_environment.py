"""The shell environment: a task, a private work directory, and MCP tools to work in it.

Each episode picks a task (``reset(task_id=...)``, or ``reset(seed=n)`` for task ``n`` modulo the
number of tasks), fills a fresh work directory with its files and gives its instruction. The agent
calls tools: ``run_command`` (bash in a fresh sandbox on the work directory, see
:class:`~.workspace.Workspace`), ``read_file``, ``write_file``, ``list_dir``, and ``submit``, which
runs the task's check: reward 1.0 if it passes, else 0.0, and the episode ends. Every other call
earns 0.0. When the step budget (``max_steps`` tool calls) runs out, the check runs as if the agent
had submitted.

Snapshots (``EnvClient.fork`` / ``snapshot`` / ``restore``) save the work directory's files as a
packed tree (:meth:`~.workspace.Workspace.save`: contents, permission bits, modification times,
links inside it; a link leading out of it or a special file is refused, never followed) and the
episode's own state: the task, the :class:`ShellState` (step count, budget, submitted, passed),
whether the episode is over and the generator that picks tasks. Restoring rebuilds the work
directory in a fresh directory (the old one is removed). The tool set, the task list and the
isolation are the server's and stay the restoring server's.

The work directory is declared (:meth:`ShellEnvironment.workspace_dir`): the server walks it after
each reset and answers a grader's diff since then (``POST /openenv/diff``, docs/roles.md).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence
from uuid import uuid4

from fastmcp import FastMCP

from openenv.core.env_server.exceptions import SnapshotUnsupportedError
from openenv.core.env_server.mcp_environment import MCPEnvironment, get_server_tools
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation

try:
    from ..models import ShellObservation, ShellState
    from .tasks import Task, load_tasks, pick_task
    from .workspace import MAX_TIMEOUT_S, Workspace, WorkspaceError
except ImportError:  # served from the package directory as `server.app:app`
    from models import ShellObservation, ShellState  # type: ignore[no-redef]
    from server.tasks import Task, load_tasks, pick_task  # type: ignore[no-redef]
    from server.workspace import MAX_TIMEOUT_S, Workspace, WorkspaceError  # type: ignore[no-redef]

DEFAULT_MAX_STEPS = 50
CHECK_TIMEOUT_S = 20.0
_SETTLE_S = MAX_TIMEOUT_S + 30.0  # a command given up on ends within its timeout and carrying margin


class EpisodeError(RuntimeError):
    """A tool was called with no episode running (before ``reset`` or after it ended)."""


class ShellEnvironment(MCPEnvironment):
    """Shell tasks in a sandboxed work directory, scored by each task's check command.

    ``tasks`` default to the ones shipped in ``tasks.json``. ``isolation`` ("sandbox" or "none")
    defaults to ``$SHELL_ENV_ISOLATION`` or "sandbox"; use "none" only where the server is itself
    confined (a container without bubblewrap). Subclasses add tools in :meth:`_register_tools`.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True
    # (MCPEnvironment leaves its own machinery out already: exclusions add up along the classes)
    SNAPSHOT_EXCLUDE = (
        # the server's: its task list and the tools' names; the work directory is saved apart
        "_tasks",
        "_tool_names",
        "workspace",
    )
    SERVER_NAME = "shell_env"
    OBSERVATION_CLS = ShellObservation
    STATE_CLS = ShellState

    def __init__(
        self,
        tasks: Optional[Sequence[Task]] = None,
        isolation: Optional[str] = None,
        env_vars: Optional[Dict[str, str]] = None,
    ) -> None:
        mcp = FastMCP(self.SERVER_NAME)
        self._tasks: List[Task] = list(tasks) if tasks is not None else load_tasks()
        if not self._tasks:
            raise ValueError("a shell environment needs at least one task")
        isolation = isolation or os.environ.get("SHELL_ENV_ISOLATION", "sandbox")
        if isolation not in ("sandbox", "none"):
            raise ValueError(f"isolation must be 'sandbox' or 'none', not {isolation!r}")
        self.workspace = Workspace(env=env_vars, isolation=isolation)  # type: ignore[arg-type]
        self._register_tools(mcp)
        super().__init__(mcp)
        self._tool_names = sorted(tool.name for tool in get_server_tools(mcp))
        self._task: Optional[Task] = None
        self._state = self.STATE_CLS(episode_id=str(uuid4()), step_count=0)
        self._done = True
        self._rng = random.Random()

    # --- tools -----------------------------------------------------------------------------------

    def _register_tools(self, mcp: FastMCP) -> None:
        workspace = self.workspace

        @mcp.tool
        def run_command(command: str, timeout_s: float = 10.0) -> dict:
            """Run a bash command in the work directory (a fresh sandbox: no network, limited
            memory and processes; files persist between commands). Returns stdout, stderr,
            exit_code (124 after the timeout), timed_out and kept_changes."""
            self._require_episode()
            return workspace.run(command, timeout_s=min(float(timeout_s), MAX_TIMEOUT_S)).as_dict()

        @mcp.tool
        def read_file(path: str) -> str:
            """Read a text file of the work directory (relative path, or absolute under /workspace)."""
            self._require_episode()
            return workspace.read_file(path)

        @mcp.tool
        def write_file(path: str, content: str) -> dict:
            """Write a text file in the work directory (parent directories are made)."""
            self._require_episode()
            return {"path": path, "bytes_written": workspace.write_file(path, content)}

        @mcp.tool
        def list_dir(path: str = ".") -> dict:
            """List a directory of the work directory: its entries' name, type (file, dir, link,
            other) and size."""
            self._require_episode()
            return {"path": path, "entries": workspace.list_dir(path)}

        @mcp.tool
        def submit() -> dict:
            """Finish the episode: run the task's check. Reward 1.0 if it passes, else 0.0."""
            self._require_episode()
            return self._finish()

    def _require_episode(self) -> None:
        if self._task is None:
            raise EpisodeError("no episode: call reset() first")
        if self._done:
            raise EpisodeError("the episode is over: call reset() to start a new one")

    # --- episodes --------------------------------------------------------------------------------

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        task_id: Optional[str] = None,
        max_steps: Optional[int] = None,
        **kwargs: Any,
    ) -> ShellObservation:
        """Start task ``task_id``, or task ``seed % len(tasks)``, or a random one."""
        task = pick_task(self._tasks, seed, task_id, fallback=self._rng.randrange(len(self._tasks)))
        budget = DEFAULT_MAX_STEPS if max_steps is None else int(max_steps)
        if budget < 1:
            raise ValueError(f"max_steps must be at least 1, not {max_steps}")
        self.workspace.populate(task.files, executable=task.executable)
        if task.setup:  # shipped with the package, trusted: run without a sandbox of its own
            self.workspace.run_trusted(task.setup, timeout_s=CHECK_TIMEOUT_S)
        self._task, self._done = task, False
        self._state = self.STATE_CLS(
            episode_id=episode_id or str(uuid4()), step_count=0, task_id=task.id, max_steps=budget
        )
        self._reset_rubric()
        return self._reset_observation(task)

    def _reset_observation(self, task: Task) -> ShellObservation:
        return self.OBSERVATION_CLS(
            task_id=task.id,
            instruction=task.instruction,
            files=self._listing(),
            tools=self._tool_names,
            reward=0.0,
            metadata={"max_steps": self._state.max_steps},
        )

    def _listing(self) -> List[str]:
        root = self.workspace.path
        found = []
        for directory, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != ".git")
            for name in sorted(files):
                found.append(os.path.relpath(os.path.join(directory, name), root))
        return sorted(found)

    def _finish(self) -> Dict[str, Any]:
        """Run the check, end the episode; returns what ``submit`` answers."""
        assert self._task is not None
        result = self.workspace.run(self._task.check, timeout_s=CHECK_TIMEOUT_S, keep_changes=False)
        passed = result.exit_code == 0
        self._done = True
        self._state.submitted, self._state.passed = True, passed
        return {
            "passed": passed,
            "reward": 1.0 if passed else 0.0,
            "check_output": (result.stdout + result.stderr)[-2000:],
        }

    async def _after_mcp_action(self, action: Action, observation: Observation) -> Observation:
        observation.reward = 0.0
        if isinstance(action, CallToolAction) and self._task is not None:
            error = getattr(observation, "error", None)
            if action.tool_name == "submit" and error is None:
                observation.reward = 1.0 if self._state.passed else 0.0
                observation.done = True
            elif self._done:
                observation.done = True  # a call after the end: answered with an error, nothing counted
            else:
                self._state.step_count += 1
                if self._state.step_count >= self._state.max_steps:
                    verdict = await self._run_sync(self._finish)
                    observation.reward = verdict["reward"]
                    observation.done = True
                    observation.metadata = {**observation.metadata, "out_of_steps": True, "check": verdict}
        return self._apply_transform(observation)

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(
            metadata={
                "error": f"{self.SERVER_NAME} takes CallToolAction or ListToolsAction, not {type(action).__name__}"
            }
        )

    @property
    def state(self) -> ShellState:
        return self._state

    def workspace_dir(self) -> Path:
        """The work directory (for the grader's diff since the reset: ``POST /openenv/diff``)."""
        return self.workspace.path

    # --- snapshots -------------------------------------------------------------------------------

    def snapshot_state(self) -> Dict[str, Any]:
        """The work directory as a packed tree, and the episode's attributes (see the module
        docstring)."""
        self._settle()
        try:
            files = self.workspace.save()
        except WorkspaceError as exc:
            raise SnapshotUnsupportedError(f"Cannot snapshot this {self.SERVER_NAME} session: {exc}") from None
        return {"workspace": files, "attributes": super().snapshot_state()}

    def restore_state(self, data: Dict[str, Any]) -> None:
        self._settle()
        self.workspace.load(data["workspace"])
        super().restore_state(data["attributes"])

    def _settle(self) -> None:
        """Wait for a tool call given up on (its client left, its deadline passed) that still
        runs on the work directory: it would change the files while they are saved or replaced."""
        job = getattr(self, "_abandoned_tool_call", None)
        deadline = time.monotonic() + _SETTLE_S
        while job is not None and job.returned is None:
            if time.monotonic() > deadline:
                raise SnapshotUnsupportedError(
                    f"A command given up on still runs on this {self.SERVER_NAME} session's work directory "
                    "after its time limit: try again later"
                )
            time.sleep(0.02)

    def close(self) -> None:
        self.workspace.close()
        super().close()
