"""How an external agent harness is started and talked to (upstream's RFC 005 ``HarnessConfig``).

A :class:`HarnessConfig` is data only: an adapter (:class:`~.adapter.AgenticHarnessAdapter`) reads
it to start the harness's process and bound each turn. It forbids unknown fields so that a typo in
a config file is an error rather than a setting silently ignored.
"""

from __future__ import annotations

from enum import Enum
from typing import Dict, List, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator


class HarnessTransport(str, Enum):
    """How the harness receives its turns: on stdin/stdout, over streamable HTTP, or as MCP."""

    STDIO = "stdio"
    STREAMABLE_HTTP = "http"
    MCP = "mcp"


class HarnessConfig(BaseModel):
    """One harness: its command line, where it runs and how long it may take.

    ``working_directory`` is where the harness works (inside a sandbox, the path it sees);
    ``env_vars`` are added to its environment; ``startup_timeout_s`` bounds its start and
    ``session_timeout_s`` each turn (one ``step`` of a :class:`~.environment.HarnessEnvironment`).
    ``model`` and ``api_key_env_var`` are for adapters whose harness needs a model name and the
    name of the variable that carries its key; ``mcp_config_path`` for harnesses that read their
    MCP servers from a file.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    command: List[str] = Field(min_length=1)
    working_directory: str = "/workspace"
    env_vars: Dict[str, str] = Field(default_factory=dict)
    transport: HarnessTransport = HarnessTransport.STDIO
    mcp_config_path: Optional[str] = None
    startup_timeout_s: float = Field(default=30.0, gt=0)
    session_timeout_s: float = Field(default=600.0, gt=0)
    model: Optional[str] = None
    api_key_env_var: Optional[str] = None

    @field_validator("command")
    @classmethod
    def _no_empty_parts(cls, command: List[str]) -> List[str]:
        if not command[0].strip():
            raise ValueError("the command's first element (the program) must not be empty")
        return command


__all__ = ["HarnessConfig", "HarnessTransport"]
