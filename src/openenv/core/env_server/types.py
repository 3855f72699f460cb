"""Wire models of the OpenEnv protocol: actions, observations, state, requests and frames.

Field names, defaults and ``extra`` settings match OpenEnv 0.10 exactly, so payloads produced by
either implementation validate in the other.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Dict, Literal, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_serializer,
    model_validator,
)
from typing_extensions import Annotated

Scalar = Union[int, float, bool]


class Action(BaseModel):
    """Base class of everything an agent can send to an environment's ``step``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)

    metadata: Dict[str, Any] = Field(default_factory=dict)


class Observation(BaseModel):
    """Base class of what ``reset`` and ``step`` return.

    ``done`` says the episode ended; ``reward`` is the reward of the step that produced the
    observation (``None`` when the environment gives none).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)

    done: bool = False
    reward: Union[bool, int, float, None] = None
    metadata: Dict[str, Any] = Field(default_factory=dict)


class State(BaseModel):
    """Episode bookkeeping of an environment. Extra fields are allowed and sent as they are."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, arbitrary_types_allowed=True)

    episode_id: Optional[str] = None
    step_count: int = Field(default=0, ge=0)


class ResetRequest(BaseModel):
    """Body of ``POST /reset``; unknown keys are kept and forwarded to ``reset`` when it accepts them."""

    model_config = ConfigDict(extra="allow")

    seed: Optional[int] = Field(default=None, ge=0)
    episode_id: Optional[str] = Field(default=None, max_length=255)


class ResetResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observation: Dict[str, Any]
    reward: Optional[float] = None
    done: bool = False
    metadata: Optional[Dict[str, Any]] = None


class StepRequest(BaseModel):
    """Body of ``POST /step``; keys other than ``action`` reach ``step`` when it accepts them."""

    model_config = ConfigDict(extra="allow")

    action: Dict[str, Any]
    timeout_s: Optional[float] = Field(default=None, gt=0)
    request_id: Optional[str] = Field(default=None, max_length=255)


class StepResponse(ResetResponse):
    """The same fields as :class:`ResetResponse`."""


class BaseMessage(BaseModel):
    """Base of WebSocket frames and info models: unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class CodeExecResult(BaseMessage):
    """Outcome of running a piece of code: its output streams and exit status."""

    stdout: str
    stderr: str
    exit_code: int


class EnvironmentMetadata(BaseMessage):
    name: str
    description: str
    readme_content: Optional[str] = None
    version: Optional[str] = None
    author: Optional[str] = None
    documentation_url: Optional[str] = None


class SchemaResponse(BaseMessage):
    action: Dict[str, Any]
    observation: Dict[str, Any]
    state: Dict[str, Any]
    reset_observation: Optional[Dict[str, Any]] = None

    @model_serializer(mode="wrap")
    def _drop_empty_reset_observation(self, handler: Any) -> Dict[str, Any]:
        data = handler(self)
        if data.get("reset_observation") is None:
            data.pop("reset_observation", None)
        return data


class HealthStatus(str, Enum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    DEGRADED = "degraded"


class ServerMode(str, Enum):
    """``simulation`` exposes HTTP reset/step/state; ``production`` removes them."""

    SIMULATION = "simulation"
    PRODUCTION = "production"


class HealthResponse(BaseMessage):
    status: HealthStatus = HealthStatus.HEALTHY


class ListTasksRequest(BaseMessage):
    split: str


class NumTasksRequest(BaseMessage):
    split: str


class GetTaskRequest(BaseMessage):
    split: str
    index: int


class GetTaskRangeRequest(BaseMessage):
    split: str
    start: Optional[int] = None
    stop: Optional[int] = None


class WSErrorCode(str, Enum):
    """Codes of ``{"type": "error"}`` frames.

    The first seven are OpenEnv 0.10's. ``TIMEOUT`` (a step ran past the server's step timeout),
    ``MESSAGE_TOO_LARGE`` (a frame over the server's size limit), ``UNSUPPORTED_FRAME`` (a
    binary frame) and ``SERVER_BUSY`` (the server's budget of bytes in flight is spent; the
    connection is closed with 1013, retry later), ``SNAPSHOT_REFUSED`` (a snapshot this server
    will not load) and ``NOT_SUPPORTED`` (the environment cannot do what was asked: save a
    snapshot, say) and ``FORBIDDEN`` (the caller's role may not do this; see :mod:`.roles`) are ours; a client that does not know them still sees an error frame.
    """

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"
    TIMEOUT = "TIMEOUT"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    UNSUPPORTED_FRAME = "UNSUPPORTED_FRAME"
    SERVER_BUSY = "SERVER_BUSY"
    SNAPSHOT_REFUSED = "SNAPSHOT_REFUSED"
    NOT_SUPPORTED = "NOT_SUPPORTED"
    FORBIDDEN = "FORBIDDEN"


class ConcurrencyConfig(BaseMessage):
    """How many sessions a server holds at once, and how long a detached one may sit idle."""

    max_concurrent_envs: int = Field(default=1, ge=1)
    session_timeout: Optional[float] = Field(default=None, gt=0)


class ServerCapacityStatus(BaseMessage):
    active_sessions: int = Field(ge=0)
    max_sessions: int = Field(ge=1)

    @model_validator(mode="after")
    def _active_within_max(self) -> ServerCapacityStatus:
        if self.active_sessions > self.max_sessions:
            raise ValueError(
                f"active_sessions ({self.active_sessions}) cannot exceed max_sessions ({self.max_sessions})"
            )
        return self

    @property
    def available_slots(self) -> int:
        return self.max_sessions - self.active_sessions

    @property
    def is_at_capacity(self) -> bool:
        return self.active_sessions >= self.max_sessions

    @classmethod
    def from_counts(cls, active: int, max_sessions: int) -> ServerCapacityStatus:
        return cls(active_sessions=active, max_sessions=max_sessions)


class SessionInfo(BaseMessage):
    session_id: str
    created_at: float
    last_activity_at: float
    step_count: int = Field(default=0, ge=0)
    environment_type: str


# --- WebSocket frames, client to server -----------------------------------------------------


class WSResetMessage(BaseMessage):
    type: Literal["reset"] = "reset"
    data: Dict[str, Any] = Field(default_factory=dict)


class WSStepMessage(BaseMessage):
    type: Literal["step"] = "step"
    data: Dict[str, Any]


class WSStateMessage(BaseMessage):
    type: Literal["state"] = "state"


class WSCloseMessage(BaseMessage):
    type: Literal["close"] = "close"


WSIncomingMessage = Annotated[
    Union[WSResetMessage, WSStepMessage, WSStateMessage, WSCloseMessage],
    Field(discriminator="type"),
]


# --- WebSocket frames, server to client -----------------------------------------------------


class WSObservationResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["observation"] = "observation"
    data: Dict[str, Any]


class WSStateResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["state"] = "state"
    data: Dict[str, Any]


class WSErrorResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["error"] = "error"
    data: Dict[str, Any]


WSOutgoingMessage = Union[WSObservationResponse, WSStateResponse, WSErrorResponse]
