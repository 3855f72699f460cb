"""The git environment: git tasks on a throwaway local repository, through MCP tools.

Each episode builds a fresh repository in the session's work directory from the task's files and
setup commands (no server, no network). Besides the shell environment's tools (``run_command``,
``read_file``, ``write_file``, ``list_dir``, ``submit``) there are ``git_status``, ``git_log``,
``git_diff`` and ``execute_git_command`` (one git command, its arguments split like a shell would,
never run by a shell). ``submit`` runs the task's check: reward 1.0 if it passes, else 0.0.

Every git command runs in the same sandbox as ``run_command``. Author and committer are fixed
(``Agent <agent@example.com>``, set in the repository's own ``.git/config`` and in the
environment) and so are the dates, so the same actions give the same commit ids.

Snapshots are shell_env's (:class:`~shell_env.server.shell_environment.ShellEnvironment`): the
work directory, ``.git`` included (objects, refs, the index, a merge in progress: all plain files
and directories, which the packed tree carries with their modes and times), and the episode's
state. A restored repository gives the same ``git log``, ``git status`` and commit ids.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from fastmcp import FastMCP
from shell_env.server.shell_environment import ShellEnvironment
from shell_env.server.tasks import Task, load_tasks
from shell_env.server.workspace import MAX_TIMEOUT_S

try:
    from ..models import GitObservation, GitState
except ImportError:  # served from the package directory as `server.app:app`
    from models import GitObservation, GitState  # type: ignore[no-redef]

TASKS_FILE = Path(__file__).resolve().parent / "tasks.json"
FIXED_DATE = "2024-01-01T12:00:00+00:00"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Agent",
    "GIT_AUTHOR_EMAIL": "agent@example.com",
    "GIT_COMMITTER_NAME": "Agent",
    "GIT_COMMITTER_EMAIL": "agent@example.com",
    "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_DATE": FIXED_DATE,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_EDITOR": "true",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
}
"""What every command sees: a fixed identity and fixed dates, no system config, no editor or pager."""


class GitEnvironment(ShellEnvironment):
    """Git tasks on a local repository, scored by each task's check command."""

    SERVER_NAME = "git_env"
    OBSERVATION_CLS = GitObservation
    STATE_CLS = GitState

    def __init__(self, tasks: Optional[Sequence[Task]] = None, isolation: Optional[str] = None) -> None:
        isolation = isolation or _isolation_from_env()
        super().__init__(tasks if tasks is not None else load_tasks(TASKS_FILE), isolation=isolation, env_vars=GIT_ENV)

    def _register_tools(self, mcp: FastMCP) -> None:
        super()._register_tools(mcp)
        git = self._git

        @mcp.tool
        def git_status() -> dict:
            """``git status --short --branch`` of the repository."""
            return git(["status", "--short", "--branch"])

        @mcp.tool
        def git_log(max_count: int = 10, all_branches: bool = False) -> dict:
            """``git log --oneline --decorate --graph`` (``max_count`` commits; every branch if asked)."""
            if not 1 <= max_count <= 1000:
                raise ValueError(f"max_count must be between 1 and 1000, not {max_count}")
            return git(
                ["log", "--oneline", "--decorate", "--graph", f"-n{max_count}"] + (["--all"] if all_branches else [])
            )

        @mcp.tool
        def git_diff(staged: bool = False, path: str = "") -> dict:
            """``git diff`` of the work tree (``staged``: of the index against HEAD), optionally of one path."""
            return git(["diff"] + (["--cached"] if staged else []) + (["--", path] if path else []))

        @mcp.tool
        def execute_git_command(command: str, working_dir: str = "", timeout_s: float = 10.0) -> dict:
            """Run one git command, e.g. ``commit -m "a message"`` or ``git branch -a``: its words are
            split as a shell would, but no shell runs it (no pipes, redirections or ``;``)."""
            try:
                args = shlex.split(command)
            except ValueError as exc:
                raise ValueError(f"cannot split {command!r}: {exc}") from None
            if args[:1] == ["git"]:
                args = args[1:]
            if not args:
                raise ValueError("give a git command, e.g. 'status' or 'log --oneline'")
            return git(args, working_dir=working_dir, timeout_s=timeout_s)

    def _git(self, args: Sequence[str], working_dir: str = "", timeout_s: float = 10.0) -> Dict[str, Any]:
        self._require_episode()
        command = "git " + " ".join(shlex.quote(a) for a in args)
        if working_dir:
            directory = self.workspace.resolve(working_dir)
            if not directory.is_dir():
                raise ValueError(f"working_dir {working_dir!r} is not a directory of the work directory")
            relative = directory.relative_to(self.workspace.path.resolve())
            command = f"cd {shlex.quote(str(relative))} && {command}"
        return self.workspace.run(command, timeout_s=min(float(timeout_s), MAX_TIMEOUT_S)).as_dict()


def _isolation_from_env() -> str:
    return os.environ.get("GIT_ENV_ISOLATION") or os.environ.get("SHELL_ENV_ISOLATION") or "sandbox"
