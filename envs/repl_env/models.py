"""Models of the REPL environment: the action, the observation and the state."""

from __future__ import annotations

from typing import Dict, List, Optional

from pydantic import BaseModel, Field

from openenv.core.env_server.types import Action, Observation, State


class REPLAction(Action):
    """Code to run in the session's persistent interpreter, and/or a final answer.

    The episode ends with an answer given in one of three ways: ``is_final=True`` with
    ``final_answer``; code that prints a line ``FINAL(answer)`` or ``FINAL_VAR(variable_name)``;
    or code that sets ``answer = {"content": ..., "ready": True}``.
    """

    code: str = Field(default="", description="Python code to execute")
    is_final: bool = Field(default=False, description="Whether this action gives the final answer")
    final_answer: Optional[str] = Field(default=None, description="The final answer, when is_final is set")


class CodeBlockResult(BaseModel):
    """What running one action's code did."""

    stdout: str = ""
    stderr: str = ""
    locals_snapshot: Dict[str, str] = Field(
        default_factory=dict, description="Short reprs of the variables this code created or changed"
    )
    execution_time: float = Field(default=0.0, ge=0, description="Seconds the code ran (0 when there was none)")
    success: bool = True
    exception: Optional[str] = Field(default=None, description="The error's last line, when the code failed")


class REPLObservation(Observation):
    """The result of the step's code, what the namespace holds, and where the episode stands."""

    result: CodeBlockResult = Field(default_factory=CodeBlockResult)
    context_preview: Optional[str] = Field(default=None, description="The start of `context`, if there is one")
    context_length: int = Field(default=0, ge=0)
    available_variables: List[str] = Field(default_factory=list)
    iteration: int = Field(default=0, ge=0)
    max_iterations: int = Field(default=30, ge=1)
    task_prompt: Optional[str] = Field(default=None, description="What the agent is asked to find")


class REPLState(State):
    """The episode: its task, its progress and, once given, its final answer."""

    task_id: Optional[str] = None
    context: Optional[str] = None
    task_prompt: Optional[str] = None
    iteration: int = Field(default=0, ge=0)
    max_iterations: int = Field(default=30, ge=1)
    namespace_keys: List[str] = Field(default_factory=list)
    final_answer: Optional[str] = None
    total_execution_time: float = Field(default=0.0, ge=0)


__all__ = ["CodeBlockResult", "REPLAction", "REPLObservation", "REPLState"]
