"""Models of the coding environment: the action, the observation and the state."""

from __future__ import annotations

from openenv.core.env_server.types import Action, Observation, State


class CodeAction(Action):
    """Python source to run as a script, in a fresh sandboxed process."""

    code: str


class CodeObservation(Observation):
    """What the code printed and how its process ended.

    ``exit_code`` is the process's: 0 on success, 1 for an uncaught exception, 124 when the step's
    time limit killed it, ``128 + N`` when signal N did (137: SIGKILL, e.g. out of memory).
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


class CodeState(State):
    """The episode's id and step count, and the exit code of the last step."""

    last_exit_code: int = 0


__all__ = ["CodeAction", "CodeObservation", "CodeState"]
