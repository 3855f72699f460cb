"""Client of the git environment."""

from __future__ import annotations

from shell_env.client import ShellEnv

from .models import GitObservation, GitState


class GitEnv(ShellEnv):
    """Talks to a git environment server.

    ``reset(task_id=...)`` or ``reset(seed=...)`` returns a :class:`GitObservation` (the task's
    instruction and the repository's files); ``step(CallToolAction(tool_name=..., arguments=...))``
    calls a tool (``run_command``, ``read_file``, ``write_file``, ``list_dir``, ``git_status``,
    ``git_log``, ``git_diff``, ``execute_git_command``, ``submit``) and returns its value in
    ``observation.result``; ``submit`` ends the episode with reward 1.0 or 0.0.
    """

    OBSERVATION_CLS = GitObservation
    STATE_CLS = GitState
