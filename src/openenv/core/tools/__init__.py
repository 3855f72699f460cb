"""Sandboxed execution of untrusted code, for environments that run an agent's code or commands.

* :func:`run_python` / :func:`run_shell` — one fresh sandbox per call, hard timeout that kills
  the whole process tree, memory/process limits, no network, bounded output.
* :func:`run_shell_in_directory` — a command on a copy of a host directory that persists
  between commands (the copy travels over a channel the command cannot reach);
  :func:`pack_directory` / :func:`unpack_directory` carry such a directory as one byte string
  (a session snapshot's work directory, say).
* :class:`PythonREPL` — one persistent sandboxed interpreter per session (globals kept between
  calls; killed and restarted fresh after a timeout or a crash).

Both return :class:`~openenv.core.env_server.types.CodeExecResult` and block; ``*_async``
variants run them on a worker thread.

* :class:`GitServerClient` (upstream's ``git_server_client``) — clones repositories from a Gitea
  server into a workspace and resets them between episodes.
"""

from __future__ import annotations

from openenv.core.containers.runtime.isolation import IsolationError, Limits
from openenv.core.env_server.types import CodeExecResult

from .executor import (
    CODE_LIMITS,
    DEFAULT_MAX_OUTPUT_BYTES,
    TIMEOUT_EXIT_CODE,
    WORKSPACE,
    FileContent,
    Isolation,
    run_python,
    run_python_async,
    run_shell,
    run_shell_async,
)
from .git_server_client import GitServerClient, RepoInfo
from .repl import REPL_LIMITS, PythonREPL
from .workdir import (
    DirectoryResult,
    TreeError,
    TreeTooLarge,
    pack_directory,
    run_shell_in_directory,
    unpack_directory,
)

__all__ = [
    "CODE_LIMITS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "REPL_LIMITS",
    "TIMEOUT_EXIT_CODE",
    "WORKSPACE",
    "CodeExecResult",
    "DirectoryResult",
    "FileContent",
    "GitServerClient",
    "Isolation",
    "IsolationError",
    "Limits",
    "PythonREPL",
    "RepoInfo",
    "TreeError",
    "TreeTooLarge",
    "pack_directory",
    "run_python",
    "run_python_async",
    "run_shell",
    "run_shell_async",
    "run_shell_in_directory",
    "unpack_directory",
]
