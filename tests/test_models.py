"""The public models, their serialization and the import surface, pinned to OpenEnv 0.10.

Each test states one rule of the reference specification
(``/work/shared/reference/openenv-0.10-spec.md``); the section it comes from is named in the
test's docstring or in the comment above a group of tests.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import types
import typing
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Dict, List, Literal, Optional, Union

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

import openenv
import openenv.core
import openenv.core.env_server
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.base_transforms import CompositeTransform, NullTransform
from openenv.core.env_server.exceptions import (
    ConcurrencyConfigurationError,
    EnvironmentFactoryError,
    OpenEnvError,
    SessionCapacityError,
    SessionCreationError,
    SessionNotFoundError,
)
from openenv.core.env_server.interfaces import Environment, Message, Transform
from openenv.core.env_server.mcp_types import (
    RESERVED_TOOL_NAMES,
    CallToolAction,
    CallToolObservation,
    JsonRpcError,
    JsonRpcErrorCode,
    JsonRpcRequest,
    JsonRpcResponse,
    ListToolsAction,
    ListToolsObservation,
    McpMethod,
    Tool,
    ToolError,
    ToolErrorType,
    WSMCPMessage,
    WSMCPResponse,
)
from openenv.core.env_server.serialization import (
    deserialize_action,
    deserialize_action_with_preprocessing,
    observation_payload_json,
    serialize_observation,
)
from openenv.core.env_server.types import (
    Action,
    BaseMessage,
    CodeExecResult,
    ConcurrencyConfig,
    EnvironmentMetadata,
    GetTaskRangeRequest,
    GetTaskRequest,
    HealthResponse,
    HealthStatus,
    ListTasksRequest,
    NumTasksRequest,
    Observation,
    ResetRequest,
    ResetResponse,
    Scalar,
    SchemaResponse,
    ServerCapacityStatus,
    ServerMode,
    SessionInfo,
    State,
    StepRequest,
    StepResponse,
    WSCloseMessage,
    WSErrorCode,
    WSErrorResponse,
    WSIncomingMessage,
    WSObservationResponse,
    WSResetMessage,
    WSStateMessage,
    WSStateResponse,
    WSStepMessage,
)
from openenv.core.generic_client import GenericAction, GenericEnvClient

REQUIRED = object()
"""Marks a field without a default in the field tables below."""


def _normalized(tp: Any) -> Any:
    """A comparable form of a type: ``Optional[X]``/``X | None`` and ``Dict``/``dict`` compare equal."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return ("union", frozenset(_normalized(arg) for arg in typing.get_args(tp)))
    if origin is not None:
        return (origin, tuple(_normalized(arg) for arg in typing.get_args(tp)))
    return tp


# --- §1.1-§1.3: field names, types, defaults and required-ness ---------------------------------

# (model, [(field, type, default or REQUIRED), ...]) in declaration order, which is also the key
# order of their JSON dumps.
FIELD_TABLE: List[tuple] = [
    (Action, [("metadata", Dict[str, Any], {})]),
    (
        Observation,
        [("done", bool, False), ("reward", Union[bool, int, float, None], None), ("metadata", Dict[str, Any], {})],
    ),
    (State, [("episode_id", Optional[str], None), ("step_count", int, 0)]),
    (ResetRequest, [("seed", Optional[int], None), ("episode_id", Optional[str], None)]),
    (
        ResetResponse,
        [
            ("observation", Dict[str, Any], REQUIRED),
            ("reward", Optional[float], None),
            ("done", bool, False),
            ("metadata", Optional[Dict[str, Any]], None),
        ],
    ),
    (
        StepRequest,
        [
            ("action", Dict[str, Any], REQUIRED),
            ("timeout_s", Optional[float], None),
            ("request_id", Optional[str], None),
        ],
    ),
    (
        StepResponse,
        [
            ("observation", Dict[str, Any], REQUIRED),
            ("reward", Optional[float], None),
            ("done", bool, False),
            ("metadata", Optional[Dict[str, Any]], None),
        ],
    ),
    (BaseMessage, []),
    (CodeExecResult, [("stdout", str, REQUIRED), ("stderr", str, REQUIRED), ("exit_code", int, REQUIRED)]),
    (
        EnvironmentMetadata,
        [
            ("name", str, REQUIRED),
            ("description", str, REQUIRED),
            ("readme_content", Optional[str], None),
            ("version", Optional[str], None),
            ("author", Optional[str], None),
            ("documentation_url", Optional[str], None),
        ],
    ),
    (
        SchemaResponse,
        [
            ("action", Dict[str, Any], REQUIRED),
            ("observation", Dict[str, Any], REQUIRED),
            ("state", Dict[str, Any], REQUIRED),
            ("reset_observation", Optional[Dict[str, Any]], None),
        ],
    ),
    (HealthResponse, [("status", HealthStatus, HealthStatus.HEALTHY)]),
    (ListTasksRequest, [("split", str, REQUIRED)]),
    (NumTasksRequest, [("split", str, REQUIRED)]),
    (GetTaskRequest, [("split", str, REQUIRED), ("index", int, REQUIRED)]),
    (
        GetTaskRangeRequest,
        [("split", str, REQUIRED), ("start", Optional[int], None), ("stop", Optional[int], None)],
    ),
    (ConcurrencyConfig, [("max_concurrent_envs", int, 1), ("session_timeout", Optional[float], None)]),
    (ServerCapacityStatus, [("active_sessions", int, REQUIRED), ("max_sessions", int, REQUIRED)]),
    (
        SessionInfo,
        [
            ("session_id", str, REQUIRED),
            ("created_at", float, REQUIRED),
            ("last_activity_at", float, REQUIRED),
            ("step_count", int, 0),
            ("environment_type", str, REQUIRED),
        ],
    ),
    # §1.2 client -> server frames
    (WSResetMessage, [("type", Literal["reset"], "reset"), ("data", Dict[str, Any], {})]),
    (WSStepMessage, [("type", Literal["step"], "step"), ("data", Dict[str, Any], REQUIRED)]),
    (WSStateMessage, [("type", Literal["state"], "state")]),
    (WSCloseMessage, [("type", Literal["close"], "close")]),
    (WSMCPMessage, [("type", Literal["mcp"], "mcp"), ("data", Dict[str, Any], REQUIRED)]),
    # §1.3 MCP / JSON-RPC
    (JsonRpcError, [("code", int, REQUIRED), ("message", str, REQUIRED), ("data", Any, None)]),
    (
        JsonRpcRequest,
        [
            ("jsonrpc", Literal["2.0"], REQUIRED),
            ("method", str, REQUIRED),
            ("params", Dict[str, Any], {}),
            ("id", Union[str, int, None], None),
        ],
    ),
    (Tool, [("name", str, REQUIRED), ("description", str, REQUIRED), ("input_schema", Dict[str, Any], REQUIRED)]),
    (ToolError, [("error_type", ToolErrorType, REQUIRED), ("message", str, REQUIRED)]),
    (ListToolsAction, [("metadata", Dict[str, Any], {}), ("type", Literal["list_tools"], "list_tools")]),
    (
        CallToolAction,
        [
            ("metadata", Dict[str, Any], {}),
            ("type", Literal["call_tool"], "call_tool"),
            ("tool_name", str, REQUIRED),
            ("arguments", Dict[str, Any], {}),
        ],
    ),
    (
        ListToolsObservation,
        [
            ("done", bool, False),
            ("reward", Union[bool, int, float, None], None),
            ("metadata", Dict[str, Any], {}),
            ("tools", List[Tool], REQUIRED),
        ],
    ),
    (
        CallToolObservation,
        [
            ("done", bool, False),
            ("reward", Union[bool, int, float, None], None),
            ("metadata", Dict[str, Any], {}),
            ("tool_name", str, REQUIRED),
            ("result", Any, None),
            ("error", Optional[ToolError], None),
        ],
    ),
]


def _table_id(entry: tuple) -> str:
    return entry[0].__name__


@pytest.mark.parametrize("model, fields", FIELD_TABLE, ids=[_table_id(e) for e in FIELD_TABLE])
def test_model_declares_exactly_the_spec_fields_in_order(model: type[BaseModel], fields: list) -> None:
    assert list(model.model_fields) == [name for name, _, _ in fields]


@pytest.mark.parametrize("model, fields", FIELD_TABLE, ids=[_table_id(e) for e in FIELD_TABLE])
def test_model_field_types_match_the_spec(model: type[BaseModel], fields: list) -> None:
    for name, expected_type, _ in fields:
        assert _normalized(model.model_fields[name].annotation) == _normalized(expected_type), name


@pytest.mark.parametrize("model, fields", FIELD_TABLE, ids=[_table_id(e) for e in FIELD_TABLE])
def test_model_required_fields_and_defaults_match_the_spec(model: type[BaseModel], fields: list) -> None:
    for name, _, default in fields:
        field = model.model_fields[name]
        if default is REQUIRED:
            assert field.is_required(), f"{name} should be required"
        else:
            assert not field.is_required(), f"{name} should be optional"
            assert field.get_default(call_default_factory=True) == default, name


def test_mutable_defaults_are_not_shared_between_instances() -> None:
    first, second = Action(), Action()
    first.metadata["k"] = 1
    assert second.metadata == {}


def test_server_to_client_frames_have_a_type_default_and_a_data_object() -> None:
    """§1.2: ``{"type": "observation"|"state"|"error"|"mcp", "data": {...}}``."""
    for model, frame_type in [
        (WSObservationResponse, "observation"),
        (WSStateResponse, "state"),
        (WSErrorResponse, "error"),
        (WSMCPResponse, "mcp"),
    ]:
        assert list(model.model_fields) == ["type", "data"]
        assert model(data={"k": 1}).model_dump() == {"type": frame_type, "data": {"k": 1}}


def test_json_rpc_response_fields_and_defaults() -> None:
    """§1.3: ``jsonrpc="2.0"``, ``result: Any=None``, ``error: JsonRpcError|None=None``, ``id``."""
    assert set(JsonRpcResponse.model_fields) == {"jsonrpc", "result", "error", "id"}
    response = JsonRpcResponse(id=1)
    assert (response.jsonrpc, response.result, response.error) == ("2.0", None, None)


# --- §1.1-§1.3: extra="forbid" vs extra="allow" -------------------------------------------------

# A minimal valid payload for every model, used to probe how it treats an unknown key.
MINIMAL_PAYLOADS: Dict[type, Dict[str, Any]] = {
    Action: {},
    Observation: {},
    State: {},
    ResetRequest: {},
    ResetResponse: {"observation": {}},
    StepRequest: {"action": {}},
    StepResponse: {"observation": {}},
    BaseMessage: {},
    CodeExecResult: {"stdout": "", "stderr": "", "exit_code": 0},
    EnvironmentMetadata: {"name": "n", "description": "d"},
    SchemaResponse: {"action": {}, "observation": {}, "state": {}},
    HealthResponse: {},
    ListTasksRequest: {"split": "train"},
    NumTasksRequest: {"split": "train"},
    GetTaskRequest: {"split": "train", "index": 0},
    GetTaskRangeRequest: {"split": "train"},
    ConcurrencyConfig: {},
    ServerCapacityStatus: {"active_sessions": 0, "max_sessions": 1},
    SessionInfo: {"session_id": "s", "created_at": 0.0, "last_activity_at": 0.0, "environment_type": "E"},
    WSResetMessage: {"type": "reset"},
    WSStepMessage: {"type": "step", "data": {}},
    WSStateMessage: {"type": "state"},
    WSCloseMessage: {"type": "close"},
    WSMCPMessage: {"type": "mcp", "data": {}},
    WSObservationResponse: {"type": "observation", "data": {}},
    WSStateResponse: {"type": "state", "data": {}},
    WSErrorResponse: {"type": "error", "data": {}},
    WSMCPResponse: {"type": "mcp", "data": {}},
    JsonRpcError: {"code": -32600, "message": "m"},
    JsonRpcRequest: {"jsonrpc": "2.0", "method": "tools/list"},
    JsonRpcResponse: {"id": 1},
    Tool: {"name": "t", "description": "", "input_schema": {}},
    ToolError: {"error_type": "timeout", "message": "m"},
    ListToolsAction: {},
    CallToolAction: {"tool_name": "t"},
    ListToolsObservation: {"tools": []},
    CallToolObservation: {"tool_name": "t"},
}
EXTRA_ALLOWED = {State, ResetRequest, StepRequest}


@pytest.mark.parametrize("model", sorted(MINIMAL_PAYLOADS, key=lambda m: m.__name__), ids=lambda m: m.__name__)
def test_minimal_payload_round_trips_through_json(model: type[BaseModel]) -> None:
    """What a model sends (``model_dump_json``) validates back into an equal model: no key is
    renamed, added or dropped on the way (an extra key would be refused by ``extra="forbid"``)."""
    instance = model.model_validate(MINIMAL_PAYLOADS[model])
    assert model.model_validate_json(instance.model_dump_json()) == instance


@pytest.mark.parametrize(
    "model",
    sorted(set(MINIMAL_PAYLOADS) - EXTRA_ALLOWED, key=lambda m: m.__name__),
    ids=lambda m: m.__name__,
)
def test_model_rejects_unknown_keys(model: type[BaseModel]) -> None:
    with pytest.raises(ValidationError) as info:
        model.model_validate({**MINIMAL_PAYLOADS[model], "unexpected_key": 1})
    assert info.value.errors()[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize("model", sorted(EXTRA_ALLOWED, key=lambda m: m.__name__), ids=lambda m: m.__name__)
def test_model_keeps_unknown_keys(model: type[BaseModel]) -> None:
    instance = model.model_validate({**MINIMAL_PAYLOADS[model], "unexpected_key": 1})
    assert instance.model_extra == {"unexpected_key": 1}
    assert instance.model_dump()["unexpected_key"] == 1


@pytest.mark.parametrize(
    "model",
    [
        CodeExecResult,
        EnvironmentMetadata,
        SchemaResponse,
        HealthResponse,
        ConcurrencyConfig,
        ServerCapacityStatus,
        SessionInfo,
        WSResetMessage,
        WSStepMessage,
        WSStateMessage,
        WSCloseMessage,
        WSMCPMessage,
    ],
    ids=lambda m: m.__name__,
)
def test_info_models_and_client_frames_are_base_messages(model: type) -> None:
    """§1.1/§1.2: these derive from ``BaseMessage`` (extra forbidden, assignment validated)."""
    assert issubclass(model, BaseMessage)


def test_core_types_allow_arbitrary_types() -> None:
    """§1.1: Action, Observation and State set ``arbitrary_types_allowed=True``."""
    for model in (Action, Observation, State):
        assert model.model_config.get("arbitrary_types_allowed") is True, model.__name__


@pytest.mark.parametrize(
    "instance, field, bad_value",
    [
        (Action(), "metadata", "not a dict"),
        (Observation(), "done", "not a bool"),
        (State(), "step_count", -1),
        (EnvironmentMetadata(name="n", description="d"), "name", 123),
    ],
    ids=["Action", "Observation", "State", "BaseMessage"],
)
def test_assignment_is_validated(instance: BaseModel, field: str, bad_value: Any) -> None:
    """§1.1: Action, Observation, State and BaseMessage set ``validate_assignment=True``."""
    with pytest.raises(ValidationError):
        setattr(instance, field, bad_value)


def test_json_schemas_advertise_forbid_and_allow() -> None:
    """§3.6: Action/Observation schemas carry ``additionalProperties: false``, State ``true``."""
    assert Action.model_json_schema()["additionalProperties"] is False
    assert Observation.model_json_schema()["additionalProperties"] is False
    assert State.model_json_schema()["additionalProperties"] is True


# --- §1.1: field constraints and behaviour of individual models -----------------------------------


@pytest.mark.parametrize("reward", [True, 1, 1.5, None], ids=["bool", "int", "float", "none"])
def test_observation_reward_keeps_its_python_type(reward: Any) -> None:
    """§1.1: ``reward: bool | int | float | None`` — a bool stays bool and an int stays int."""
    observation = Observation(reward=reward)
    assert observation.reward == reward
    assert type(observation.reward) is type(reward)


def test_state_step_count_must_not_be_negative() -> None:
    assert State(step_count=0).step_count == 0
    with pytest.raises(ValidationError):
        State(step_count=-1)


def test_state_extra_fields_are_attributes_and_dumped() -> None:
    state = State(episode_id="ep", step_count=2, score=0.5)
    assert state.score == 0.5
    assert state.model_dump() == {"episode_id": "ep", "step_count": 2, "score": 0.5}


def test_reset_request_seed_must_not_be_negative() -> None:
    assert ResetRequest(seed=0).seed == 0
    with pytest.raises(ValidationError):
        ResetRequest(seed=-1)


def test_reset_request_episode_id_is_at_most_255_characters() -> None:
    assert ResetRequest(episode_id="e" * 255).episode_id == "e" * 255
    with pytest.raises(ValidationError):
        ResetRequest(episode_id="e" * 256)


def test_reset_request_forwards_extra_keys() -> None:
    request = ResetRequest.model_validate({"seed": 3, "difficulty": "hard"})
    assert request.model_dump() == {"seed": 3, "episode_id": None, "difficulty": "hard"}


def test_step_request_action_must_be_an_object() -> None:
    with pytest.raises(ValidationError):
        StepRequest.model_validate({})
    with pytest.raises(ValidationError):
        StepRequest.model_validate({"action": [1, 2]})


def test_step_request_timeout_must_be_positive() -> None:
    assert StepRequest(action={}, timeout_s=0.5).timeout_s == 0.5
    for bad in (0, -1.0):
        with pytest.raises(ValidationError):
            StepRequest(action={}, timeout_s=bad)


def test_step_request_request_id_is_at_most_255_characters() -> None:
    assert StepRequest(action={}, request_id="r" * 255).request_id == "r" * 255
    with pytest.raises(ValidationError):
        StepRequest(action={}, request_id="r" * 256)


def test_step_request_forwards_extra_keys() -> None:
    request = StepRequest.model_validate({"action": {"x": 1}, "temperature": 0.2})
    assert request.model_extra == {"temperature": 0.2}


@pytest.mark.parametrize("response_model", [ResetResponse, StepResponse])
@pytest.mark.parametrize("reward", [True, 1, 2.5])
def test_http_responses_coerce_reward_to_float(response_model: type[BaseModel], reward: Any) -> None:
    """§2.1: HTTP responses coerce reward to float (bool/int → float)."""
    response = response_model(observation={}, reward=reward)
    assert type(response.reward) is float
    assert response.reward == float(reward)


@pytest.mark.parametrize("response_model", [ResetResponse, StepResponse])
def test_http_responses_always_dump_metadata(response_model: type[BaseModel]) -> None:
    """§2.1: ``{"observation":{...},"reward":1.5,"done":false,"metadata":null}``."""
    response = response_model(observation={"metadata": {}}, reward=1.5)
    assert response.model_dump_json() == '{"observation":{"metadata":{}},"reward":1.5,"done":false,"metadata":null}'


def test_code_exec_result_holds_output_streams_and_exit_code() -> None:
    result = CodeExecResult(stdout="out", stderr="err", exit_code=1)
    assert result.model_dump() == {"stdout": "out", "stderr": "err", "exit_code": 1}


def test_schema_response_drops_reset_observation_when_none() -> None:
    schema = SchemaResponse(action={"a": 1}, observation={"o": 1}, state={"s": 1})
    assert schema.model_dump() == {"action": {"a": 1}, "observation": {"o": 1}, "state": {"s": 1}}
    assert "reset_observation" not in json.loads(schema.model_dump_json())


def test_schema_response_keeps_reset_observation_when_set() -> None:
    schema = SchemaResponse(action={}, observation={}, state={}, reset_observation={"r": 1})
    assert schema.model_dump()["reset_observation"] == {"r": 1}
    assert json.loads(schema.model_dump_json())["reset_observation"] == {"r": 1}


def test_health_response_defaults_to_healthy() -> None:
    assert HealthResponse().model_dump_json() == '{"status":"healthy"}'


def test_concurrency_config_needs_at_least_one_env() -> None:
    assert ConcurrencyConfig(max_concurrent_envs=1).max_concurrent_envs == 1
    with pytest.raises(ValidationError):
        ConcurrencyConfig(max_concurrent_envs=0)


def test_concurrency_config_session_timeout_must_be_positive() -> None:
    assert ConcurrencyConfig(session_timeout=1.5).session_timeout == 1.5
    with pytest.raises(ValidationError):
        ConcurrencyConfig(session_timeout=0)


def test_server_capacity_counts_are_bounded() -> None:
    """§1.1: ``active_sessions`` ge=0, ``max_sessions`` ge=1."""
    with pytest.raises(ValidationError):
        ServerCapacityStatus(active_sessions=-1, max_sessions=1)
    with pytest.raises(ValidationError):
        ServerCapacityStatus(active_sessions=0, max_sessions=0)


def test_server_capacity_rejects_more_active_than_max() -> None:
    with pytest.raises(ValidationError):
        ServerCapacityStatus(active_sessions=3, max_sessions=2)


def test_server_capacity_properties() -> None:
    below = ServerCapacityStatus(active_sessions=1, max_sessions=3)
    assert (below.available_slots, below.is_at_capacity) == (2, False)
    full = ServerCapacityStatus(active_sessions=3, max_sessions=3)
    assert (full.available_slots, full.is_at_capacity) == (0, True)


def test_server_capacity_from_counts() -> None:
    status = ServerCapacityStatus.from_counts(2, 4)
    assert status == ServerCapacityStatus(active_sessions=2, max_sessions=4)
    with pytest.raises(ValidationError):
        ServerCapacityStatus.from_counts(5, 4)


def test_session_info_step_count_must_not_be_negative() -> None:
    with pytest.raises(ValidationError):
        SessionInfo(session_id="s", created_at=0.0, last_activity_at=0.0, step_count=-1, environment_type="E")


def test_scalar_alias_is_int_float_bool() -> None:
    assert _normalized(Scalar) == _normalized(Union[int, float, bool])


# --- §1.1: enums ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "enum_cls, members",
    [
        (ServerMode, {"SIMULATION": "simulation", "PRODUCTION": "production"}),
        (HealthStatus, {"HEALTHY": "healthy", "UNHEALTHY": "unhealthy", "DEGRADED": "degraded"}),
        (
            WSErrorCode,
            {
                # OpenEnv 0.10's seven codes ...
                "INVALID_JSON": "INVALID_JSON",
                "UNKNOWN_TYPE": "UNKNOWN_TYPE",
                "VALIDATION_ERROR": "VALIDATION_ERROR",
                "EXECUTION_ERROR": "EXECUTION_ERROR",
                "CAPACITY_REACHED": "CAPACITY_REACHED",
                "FACTORY_ERROR": "FACTORY_ERROR",
                "SESSION_ERROR": "SESSION_ERROR",
                # ... and ours.
                "TIMEOUT": "TIMEOUT",
                "MESSAGE_TOO_LARGE": "MESSAGE_TOO_LARGE",
                "UNSUPPORTED_FRAME": "UNSUPPORTED_FRAME",
                "SERVER_BUSY": "SERVER_BUSY",
                "SNAPSHOT_REFUSED": "SNAPSHOT_REFUSED",
                "NOT_SUPPORTED": "NOT_SUPPORTED",
                "FORBIDDEN": "FORBIDDEN",
            },
        ),
        (McpMethod, {"TOOLS_LIST": "tools/list", "TOOLS_CALL": "tools/call"}),
        (
            ToolErrorType,
            {
                "EXECUTION_ERROR": "execution_error",
                "INVALID_ARGS": "invalid_args",
                "TRANSPORT_ERROR": "transport_error",
                "TOOL_NOT_FOUND": "tool_not_found",
                "TIMEOUT": "timeout",
            },
        ),
    ],
    ids=["ServerMode", "HealthStatus", "WSErrorCode", "McpMethod", "ToolErrorType"],
)
def test_str_enum_members_and_values(enum_cls: type, members: Dict[str, str]) -> None:
    assert issubclass(enum_cls, str)
    assert {member.name: member.value for member in enum_cls} == members


def test_json_rpc_error_codes() -> None:
    assert issubclass(JsonRpcErrorCode, int)
    assert {member.name: member.value for member in JsonRpcErrorCode} == {
        "PARSE_ERROR": -32700,
        "INVALID_REQUEST": -32600,
        "METHOD_NOT_FOUND": -32601,
        "INVALID_PARAMS": -32602,
        "INTERNAL_ERROR": -32603,
        "SERVER_ERROR": -32000,
    }


# --- §1.2: WebSocket frames ----------------------------------------------------------------------


def test_ws_reset_message_data_defaults_to_empty_object() -> None:
    assert WSResetMessage.model_validate({"type": "reset"}).data == {}


def test_ws_frames_reject_a_mismatched_type() -> None:
    with pytest.raises(ValidationError):
        WSStepMessage.model_validate({"type": "reset", "data": {}})


@pytest.mark.parametrize(
    "frame, expected_cls",
    [
        ({"type": "reset", "data": {"seed": 1}}, WSResetMessage),
        ({"type": "step", "data": {"x": 1}}, WSStepMessage),
        ({"type": "state"}, WSStateMessage),
        ({"type": "close"}, WSCloseMessage),
    ],
)
def test_ws_incoming_message_discriminates_on_type(frame: Dict[str, Any], expected_cls: type) -> None:
    assert type(TypeAdapter(WSIncomingMessage).validate_python(frame)) is expected_cls


def test_ws_incoming_message_excludes_mcp_frames() -> None:
    """§1.2: the union covers reset/step/state/close; MCP frames are kept separate."""
    with pytest.raises(ValidationError):
        TypeAdapter(WSIncomingMessage).validate_python({"type": "mcp", "data": {}})


# --- §1.3: JSON-RPC --------------------------------------------------------------------------------


def test_json_rpc_request_requires_jsonrpc() -> None:
    with pytest.raises(ValidationError):
        JsonRpcRequest.model_validate({"method": "tools/list"})


def test_json_rpc_request_requires_version_2_0() -> None:
    with pytest.raises(ValidationError):
        JsonRpcRequest.model_validate({"jsonrpc": "1.0", "method": "tools/list"})


def test_json_rpc_request_rejects_array_params() -> None:
    with pytest.raises(ValidationError):
        JsonRpcRequest.model_validate({"jsonrpc": "2.0", "method": "tools/call", "params": [1, 2]})


@pytest.mark.parametrize("request_id", ["abc", 7, None])
def test_json_rpc_request_id_is_string_int_or_null(request_id: Any) -> None:
    request = JsonRpcRequest.model_validate({"jsonrpc": "2.0", "method": "tools/list", "id": request_id})
    assert request.id == request_id


def test_json_rpc_success_dump_has_jsonrpc_id_result_in_order() -> None:
    dumped = JsonRpcResponse.success({"tools": []}, request_id=1).model_dump()
    assert list(dumped) == ["jsonrpc", "id", "result"]
    assert dumped == {"jsonrpc": "2.0", "id": 1, "result": {"tools": []}}


def test_json_rpc_success_dump_keeps_a_null_result() -> None:
    assert JsonRpcResponse.success(None, request_id="r").model_dump() == {"jsonrpc": "2.0", "id": "r", "result": None}


def test_json_rpc_error_dump_has_jsonrpc_id_error_in_order() -> None:
    dumped = JsonRpcResponse.error_response(JsonRpcErrorCode.METHOD_NOT_FOUND, request_id=2).model_dump()
    assert list(dumped) == ["jsonrpc", "id", "error"]
    assert dumped["error"]["code"] == -32601
    assert dumped["error"]["message"] == "Method not found"


def test_json_rpc_dump_keeps_a_null_id() -> None:
    assert JsonRpcResponse.error_response(JsonRpcErrorCode.PARSE_ERROR).model_dump()["id"] is None


def test_json_rpc_response_json_has_the_same_keys_in_the_same_order() -> None:
    text = JsonRpcResponse.success([1], request_id=3).model_dump_json()
    assert list(json.loads(text)) == ["jsonrpc", "id", "result"]
    assert json.loads(text) == {"jsonrpc": "2.0", "id": 3, "result": [1]}


def test_json_rpc_error_response_passes_message_and_data() -> None:
    response = JsonRpcResponse.error_response(-32602, message="bad args", data={"field": "x"}, request_id=4)
    assert response.error == JsonRpcError(code=-32602, message="bad args", data={"field": "x"})


@pytest.mark.parametrize(
    "code, message",
    [
        (JsonRpcErrorCode.PARSE_ERROR, "Parse error"),
        (JsonRpcErrorCode.INVALID_REQUEST, "Invalid Request"),
        (JsonRpcErrorCode.METHOD_NOT_FOUND, "Method not found"),
        (JsonRpcErrorCode.INVALID_PARAMS, "Invalid params"),
        (JsonRpcErrorCode.INTERNAL_ERROR, "Internal error"),
        (JsonRpcErrorCode.SERVER_ERROR, "Server error"),
    ],
    ids=["PARSE_ERROR", "INVALID_REQUEST", "METHOD_NOT_FOUND", "INVALID_PARAMS", "INTERNAL_ERROR", "SERVER_ERROR"],
)
def test_json_rpc_error_from_code_default_message(code: JsonRpcErrorCode, message: str) -> None:
    error = JsonRpcError.from_code(code)
    assert (error.code, error.message, error.data) == (int(code), message, None)


def test_json_rpc_error_from_code_accepts_plain_ints_and_overrides() -> None:
    error = JsonRpcError.from_code(-32603, message="boom", data=[1])
    assert (error.code, error.message, error.data) == (-32603, "boom", [1])


# --- §1.3: MCP actions and observations -----------------------------------------------------------


def test_reserved_tool_names() -> None:
    assert RESERVED_TOOL_NAMES == frozenset({"reset", "step", "state", "close"})
    assert isinstance(RESERVED_TOOL_NAMES, frozenset)


@pytest.mark.parametrize(
    "action_cls, type_value",
    [(ListToolsAction, "list_tools"), (CallToolAction, "call_tool")],
    ids=["ListToolsAction", "CallToolAction"],
)
def test_mcp_actions_are_actions_with_a_fixed_type(action_cls: type[Action], type_value: str) -> None:
    assert issubclass(action_cls, Action)
    payload = {"tool_name": "t"} if action_cls is CallToolAction else {}
    assert action_cls.model_validate(payload).type == type_value
    with pytest.raises(ValidationError):
        action_cls.model_validate({**payload, "type": "something_else"})


def test_call_tool_action_dump() -> None:
    action = CallToolAction(tool_name="echo", arguments={"text": "hi"})
    assert action.model_dump() == {
        "metadata": {},
        "type": "call_tool",
        "tool_name": "echo",
        "arguments": {"text": "hi"},
    }


@pytest.mark.parametrize("observation_cls", [ListToolsObservation, CallToolObservation], ids=lambda c: c.__name__)
def test_mcp_observations_are_observations(observation_cls: type) -> None:
    assert issubclass(observation_cls, Observation)


def test_tool_uses_snake_case_input_schema() -> None:
    """§1.3: ``input_schema`` (not the MCP spec's ``inputSchema``)."""
    with pytest.raises(ValidationError):
        Tool.model_validate({"name": "t", "description": "", "inputSchema": {}})


def test_list_tools_observation_validates_tools() -> None:
    observation = ListToolsObservation(tools=[{"name": "t", "description": "d", "input_schema": {"type": "object"}}])
    assert observation.tools == [Tool(name="t", description="d", input_schema={"type": "object"})]


def test_call_tool_observation_error_is_a_tool_error() -> None:
    observation = CallToolObservation(tool_name="t", error={"error_type": "tool_not_found", "message": "no"})
    assert observation.error == ToolError(error_type=ToolErrorType.TOOL_NOT_FOUND, message="no")
    with pytest.raises(ValidationError):
        CallToolObservation(tool_name="t", error={"error_type": "not_a_type", "message": "no"})


def test_ws_mcp_response_defaults_to_type_mcp() -> None:
    # Upstream types ``WSMCPResponse.type`` as a plain ``str`` (§1.2, listed as a flaw in §14.24); ours
    # narrows it to ``Literal["mcp"]``. Only the wire shape is pinned here.
    assert WSMCPResponse(data={"jsonrpc": "2.0"}).model_dump_json() == '{"type":"mcp","data":{"jsonrpc":"2.0"}}'


# --- §2.1: serialize_observation -------------------------------------------------------------------


class EchoObservation(Observation):
    echoed: str = ""
    items: List[int] = []


def test_serialized_observation_keeps_metadata_nested() -> None:
    payload = serialize_observation(EchoObservation(echoed="yo", reward=1.5))
    assert payload == {"observation": {"metadata": {}, "echoed": "yo", "items": []}, "reward": 1.5, "done": False}


def test_serialized_observation_excludes_reward_and_done_from_the_nested_object() -> None:
    nested = serialize_observation(EchoObservation(reward=1.0, done=True))["observation"]
    assert "reward" not in nested
    assert "done" not in nested


def test_serialized_observation_has_no_top_level_metadata_when_empty() -> None:
    assert list(serialize_observation(Observation())) == ["observation", "reward", "done"]


def test_serialized_observation_copies_non_empty_metadata_to_the_top_level() -> None:
    payload = serialize_observation(Observation(metadata={"info": {"a": [1]}}))
    assert list(payload) == ["observation", "reward", "done", "metadata"]
    assert payload["metadata"] == {"info": {"a": [1]}}
    assert payload["observation"]["metadata"] == {"info": {"a": [1]}}


@pytest.mark.parametrize("reward", [True, 1, 1.5, None], ids=["bool", "int", "float", "none"])
def test_serialized_observation_passes_reward_through_unchanged(reward: Any) -> None:
    serialized = serialize_observation(Observation(reward=reward))["reward"]
    assert serialized == reward
    assert type(serialized) is type(reward)


def test_serialized_observation_carries_done() -> None:
    assert serialize_observation(Observation(done=True))["done"] is True


PAYLOAD_CASES = {
    "int reward": EchoObservation(echoed="a", reward=1),
    "big int reward": EchoObservation(reward=2**70),
    "float reward": EchoObservation(reward=0.1, done=True),
    "negative zero": EchoObservation(reward=-0.0),
    "bool reward": Observation(reward=True),
    "no reward": Observation(),
    "nested metadata": EchoObservation(
        echoed="héllo ✓", items=[1, 2], reward=2.5, metadata={"a": {"b": [1, None, 2.0]}, "ü": "x"}
    ),
    "mcp observation": CallToolObservation(tool_name="t", result={"data": [1, "x"]}, reward=0),
}
NON_FINITE_CASES = {
    "nan reward": Observation(reward=float("nan")),
    "inf reward": Observation(reward=float("inf")),
    "-inf reward": Observation(reward=float("-inf"), metadata={"k": 1}),
}


@pytest.mark.parametrize("observation", PAYLOAD_CASES.values(), ids=PAYLOAD_CASES.keys())
def test_payload_json_equals_json_dumps_of_serialize_observation(observation: Observation) -> None:
    ours = observation_payload_json(observation)
    reference = json.dumps(serialize_observation(observation))
    assert json.loads(ours) == json.loads(reference)
    assert list(json.loads(ours)) == list(json.loads(reference))


@pytest.mark.parametrize(
    "observation",
    [*PAYLOAD_CASES.values(), *NON_FINITE_CASES.values()],
    ids=[*PAYLOAD_CASES.keys(), *NON_FINITE_CASES.keys()],
)
def test_payload_json_is_what_the_pydantic_frame_would_send(observation: Observation) -> None:
    """§4.2: frames are pydantic ``model_dump_json()`` output; ours must be byte-identical."""
    frame = WSObservationResponse(data=serialize_observation(observation)).model_dump_json()
    assert '{"type":"observation","data":' + observation_payload_json(observation) + "}" == frame


@pytest.mark.parametrize("observation", NON_FINITE_CASES.values(), ids=NON_FINITE_CASES.keys())
def test_payload_json_sends_non_finite_rewards_as_null(observation: Observation) -> None:
    assert math.isnan(observation.reward) or math.isinf(observation.reward)
    assert json.loads(observation_payload_json(observation))["reward"] is None


def test_payload_json_keeps_an_int_reward_an_int() -> None:
    assert json.loads(observation_payload_json(Observation(reward=3)))["reward"] == 3
    assert '"reward":3,' in observation_payload_json(Observation(reward=3))


# --- §2.2: deserialize_action -----------------------------------------------------------------------


class MoveAction(Action):
    direction: str


@pytest.mark.parametrize("action_cls", [Action, ListToolsAction, CallToolAction], ids=lambda c: c.__name__)
def test_deserialize_action_intercepts_mcp_payloads(action_cls: type[Action]) -> None:
    """§2.2: with Action/ListToolsAction/CallToolAction, MCP payloads become the matching class."""
    assert type(deserialize_action({"type": "list_tools"}, action_cls)) is ListToolsAction
    call = deserialize_action({"type": "call_tool", "tool_name": "echo", "arguments": {"x": 1}}, action_cls)
    assert call == CallToolAction(tool_name="echo", arguments={"x": 1})


def test_deserialize_action_does_not_intercept_for_custom_action_classes() -> None:
    with pytest.raises(ValidationError):
        deserialize_action({"type": "list_tools"}, MoveAction)


def test_deserialize_action_does_not_intercept_for_subclasses_of_mcp_actions() -> None:
    class TaggedCall(CallToolAction):
        tag: str = ""

    assert type(deserialize_action({"type": "call_tool", "tool_name": "t"}, TaggedCall)) is TaggedCall


def test_deserialize_action_validates_into_the_action_class() -> None:
    assert deserialize_action({"direction": "up"}, MoveAction) == MoveAction(direction="up")


def test_deserialize_action_raises_validation_error_for_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        deserialize_action({"direction": "up", "speed": 2}, MoveAction)


def test_deserialize_action_validates_non_mcp_payloads_into_bare_action() -> None:
    assert deserialize_action({"metadata": {"k": 1}}, Action) == Action(metadata={"k": 1})
    with pytest.raises(ValidationError):
        deserialize_action({"type": "other"}, Action)


# --- §2.3: deserialize_action_with_preprocessing ---------------------------------------------------


class FormAction(Action):
    action_id: Any = None
    tokens: Any = None


def test_preprocessing_parses_a_json_string_of_tool_arguments() -> None:
    action = deserialize_action_with_preprocessing(
        {"type": "call_tool", "tool_name": "echo", "arguments": '{"text": "hi"}'}, Action
    )
    assert action == CallToolAction(tool_name="echo", arguments={"text": "hi"})


def test_preprocessing_leaves_unparseable_tool_arguments_to_validation() -> None:
    with pytest.raises(ValidationError):
        deserialize_action_with_preprocessing({"type": "call_tool", "tool_name": "e", "arguments": "{oops"}, Action)


def test_preprocessing_turns_a_numeric_action_id_string_into_an_int() -> None:
    assert deserialize_action_with_preprocessing({"action_id": "42"}, FormAction).action_id == 42


def test_preprocessing_keeps_a_non_numeric_action_id_string() -> None:
    assert deserialize_action_with_preprocessing({"action_id": "left"}, FormAction).action_id == "left"


@pytest.mark.parametrize("tokens, expected", [("[1, 2]", [1, 2]), ([3, 4], [3, 4]), ("not json", [])])
def test_preprocessing_parses_tokens(tokens: Any, expected: List[int]) -> None:
    """§2.3: tokens given as a list or JSON string (a tensor when torch is installed; bad strings → [])."""
    value = deserialize_action_with_preprocessing({"tokens": tokens}, FormAction).tokens
    as_list = value.tolist() if hasattr(value, "tolist") else list(value)
    assert as_list == expected


def test_preprocessing_keeps_mcp_interception() -> None:
    assert type(deserialize_action_with_preprocessing({"type": "list_tools"}, Action)) is ListToolsAction
    with pytest.raises(ValidationError):
        deserialize_action_with_preprocessing({"type": "list_tools"}, MoveAction)


# --- §1.6: exceptions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc_cls",
    [
        ConcurrencyConfigurationError,
        SessionCapacityError,
        SessionNotFoundError,
        SessionCreationError,
        EnvironmentFactoryError,
    ],
    ids=lambda c: c.__name__,
)
def test_exceptions_derive_from_openenv_error(exc_cls: type) -> None:
    assert issubclass(exc_cls, OpenEnvError)
    assert issubclass(OpenEnvError, Exception)


def test_concurrency_configuration_error_stores_its_fields() -> None:
    error = ConcurrencyConfigurationError("EchoEnvironment", 4)
    assert (error.environment_name, error.max_concurrent_envs) == ("EchoEnvironment", 4)
    assert "EchoEnvironment" in str(error)
    assert str(ConcurrencyConfigurationError("E", 2, message="custom")) == "custom"


def test_session_capacity_error_default_message() -> None:
    error = SessionCapacityError(2, 2)
    assert (error.active_sessions, error.max_sessions) == (2, 2)
    assert str(error) == "Server at capacity: 2/2 sessions active. Cannot accept new connections."


def test_session_capacity_error_custom_message() -> None:
    assert str(SessionCapacityError(1, 1, message="full")) == "full"


def test_session_not_found_error_stores_the_session_id() -> None:
    error = SessionNotFoundError("abc")
    assert error.session_id == "abc"
    assert "abc" in str(error)


def test_session_creation_error_stores_the_reason() -> None:
    error = SessionCreationError("no more file descriptors")
    assert error.reason == "no more file descriptors"
    assert "no more file descriptors" in str(error)


def test_environment_factory_error_default_message() -> None:
    error = EnvironmentFactoryError("make_env")
    assert error.factory_name == "make_env"
    assert str(error) == "Environment factory 'make_env' failed to create instance."


# --- §1.4 and §6.1-§6.3: client-side types -----------------------------------------------------------


def test_step_result_is_a_dataclass_with_spec_defaults() -> None:
    assert dataclasses.is_dataclass(StepResult)
    assert not issubclass(StepResult, BaseModel)
    fields = {field.name: field for field in dataclasses.fields(StepResult)}
    assert list(fields) == ["observation", "reward", "done", "metadata"]
    assert fields["observation"].default is dataclasses.MISSING
    assert (fields["reward"].default, fields["done"].default, fields["metadata"].default) == (None, False, None)


def test_generic_action_is_a_dict_with_a_readable_repr() -> None:
    action = GenericAction(message="hi", count=2)
    assert isinstance(action, dict)
    assert action == {"message": "hi", "count": 2}
    assert repr(action) == "GenericAction(message='hi', count=2)"


def test_env_client_constructor_defaults() -> None:
    """§6.1 / §12.16: connect 10 s, message 60 s, 100 MiB, ping 20 s / 20 s; and our resume's 30 s."""
    import inspect

    parameters = inspect.signature(EnvClient.__init__).parameters
    defaults = {name: p.default for name, p in parameters.items() if name != "self"}
    assert defaults == {
        "base_url": None,
        "connect_timeout_s": 10.0,
        "message_timeout_s": 60.0,
        "max_message_size_mb": 100.0,
        "websocket_ping_interval_s": 20.0,
        "websocket_ping_timeout_s": 20.0,
        "provider": None,
        "mode": None,
        "headers": None,
        "reconnect_timeout_s": 30.0,  # ours (docs/resume.md): how long a dropped connection is retried
    }


def test_env_client_needs_a_base_url_or_a_provider() -> None:
    with pytest.raises(ValueError):
        GenericEnvClient()


def test_env_client_base_url_drops_the_trailing_slash() -> None:
    assert GenericEnvClient(base_url="http://localhost:8000/").base_url == "http://localhost:8000"


def test_env_client_mode_is_case_insensitive_and_validated() -> None:
    assert GenericEnvClient(base_url="http://x", mode="PRODUCTION").mode == "production"
    with pytest.raises(ValueError):
        GenericEnvClient(base_url="http://x", mode="staging")


def test_env_client_mode_defaults_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENENV_CLIENT_MODE", raising=False)
    assert GenericEnvClient(base_url="http://x").mode == "simulation"
    monkeypatch.setenv("OPENENV_CLIENT_MODE", "production")
    assert GenericEnvClient(base_url="http://x").mode == "production"
    monkeypatch.setenv("OPENENV_CLIENT_MODE", "prod")
    with pytest.raises(ValueError, match="OPENENV_CLIENT_MODE must be 'simulation' or 'production', got 'prod'"):
        GenericEnvClient(base_url="http://x")
    with pytest.raises(ValueError, match=r"^mode must be .* got 'staging'"):
        GenericEnvClient(base_url="http://x", mode="staging")


def test_env_client_mode_is_immutable() -> None:
    client = GenericEnvClient(base_url="http://x")
    with pytest.raises(AttributeError):
        client.mode = "production"


def test_generic_client_step_payload_accepts_dicts_models_and_objects() -> None:
    client = GenericEnvClient(base_url="http://x")

    class Plain:
        def __init__(self) -> None:
            self.message = "obj"

    assert client._step_payload({"message": "d"}) == {"message": "d"}
    assert client._step_payload(GenericAction(message="g")) == {"message": "g"}
    assert client._step_payload(MoveAction(direction="up")) == {"metadata": {}, "direction": "up"}
    assert client._step_payload(Plain()) == {"message": "obj"}
    assert client._step_payload([("message", "pairs")]) == {"message": "pairs"}


def test_generic_client_parse_result_reads_the_observation_payload() -> None:
    client = GenericEnvClient(base_url="http://x")
    payload = {"observation": {"echoed": "yo"}, "reward": 1.5, "done": True, "metadata": {"k": 1}}
    assert client._parse_result(payload) == StepResult(
        observation={"echoed": "yo"}, reward=1.5, done=True, metadata={"k": 1}
    )


def test_generic_client_parse_result_defaults() -> None:
    client = GenericEnvClient(base_url="http://x")
    assert client._parse_result({}) == StepResult(observation={}, reward=None, done=False, metadata=None)


def test_generic_client_parse_state_returns_the_dict() -> None:
    client = GenericEnvClient(base_url="http://x")
    assert client._parse_state({"episode_id": "e", "step_count": 1}) == {"episode_id": "e", "step_count": 1}


# --- §5.1: the Environment base class -----------------------------------------------------------------


class CountingEnv(Environment[Action, Observation, State]):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._state = State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id)
        return Observation(metadata={"seed": seed, **kwargs})

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return Observation(reward=1.0, metadata={"timeout_s": timeout_s})

    @property
    def state(self) -> State:
        return self._state


class RecordingRubric:
    def __init__(self, score: float = 0.75) -> None:
        self.score = score
        self.calls: List[tuple] = []
        self.resets = 0

    def __call__(self, action: Any, observation: Any) -> float:
        self.calls.append((action, observation))
        return self.score

    def reset(self) -> None:
        self.resets += 1


class AsyncRubric(RecordingRubric):
    async def __call__(self, action: Any, observation: Any) -> float:  # type: ignore[override]
        self.calls.append((action, observation))
        return self.score

    async def reset_async(self) -> None:
        self.resets += 10


def test_environment_class_flags_default_to_false() -> None:
    assert Environment.SUPPORTS_CONCURRENT_SESSIONS is False
    assert Environment.REQUIRES_SINGLE_THREAD_EXECUTOR is False


def test_environment_is_abstract() -> None:
    """§5.1: reset, step and state are abstract; close, the async variants and the rest have defaults."""
    assert Environment.__abstractmethods__ == {"reset", "step", "state"}
    with pytest.raises(TypeError):
        Environment()  # type: ignore[abstract]


def test_environment_method_signatures() -> None:
    """§5.1: the server filters reset/step kwargs by these signatures."""
    import inspect

    def shape(method: Any) -> List[tuple]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]

    empty, keyword, var_kw = (
        inspect.Parameter.empty,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_KEYWORD,
    )
    assert shape(Environment.__init__) == [
        ("self", keyword, empty),
        ("transform", keyword, None),
        ("rubric", keyword, None),
    ]
    for method in (Environment.reset, Environment.reset_async):
        assert shape(method) == [
            ("self", keyword, empty),
            ("seed", keyword, None),
            ("episode_id", keyword, None),
            ("kwargs", var_kw, empty),
        ]
    for method in (Environment.step, Environment.step_async):
        assert shape(method) == [
            ("self", keyword, empty),
            ("action", keyword, empty),
            ("timeout_s", keyword, None),
            ("kwargs", var_kw, empty),
        ]


def test_environment_init_stores_transform_and_rubric() -> None:
    rubric, transform = RecordingRubric(), NullTransform()
    env = CountingEnv(transform=transform, rubric=rubric)
    assert (env.transform, env.rubric) == (transform, rubric)
    assert (CountingEnv().transform, CountingEnv().rubric) == (None, None)


def test_default_metadata_is_named_after_the_class() -> None:
    """§3.6: ``name=<ClassName>``, ``description="<ClassName> environment"``, ``version="1.0.0"``."""
    assert CountingEnv().get_metadata() == EnvironmentMetadata(
        name="CountingEnv", description="CountingEnv environment", version="1.0.0"
    )


async def test_async_methods_delegate_to_the_sync_ones() -> None:
    env = CountingEnv()
    observation = await env.reset_async(seed=7, episode_id="ep", level=2)
    assert observation.metadata == {"seed": 7, "level": 2}
    assert env.state.episode_id == "ep"
    stepped = await env.step_async(Action(), timeout_s=3.0)
    assert stepped.metadata == {"timeout_s": 3.0}
    assert env.state.step_count == 1


def test_apply_rubric_returns_zero_without_a_rubric() -> None:
    assert CountingEnv()._apply_rubric(Action(), Observation()) == 0.0


def test_apply_rubric_calls_the_rubric() -> None:
    rubric = RecordingRubric(score=0.25)
    action, observation = Action(), Observation()
    assert CountingEnv(rubric=rubric)._apply_rubric(action, observation) == 0.25
    assert rubric.calls == [(action, observation)]


async def test_apply_rubric_async_returns_zero_without_a_rubric() -> None:
    assert await CountingEnv()._apply_rubric_async(Action(), Observation()) == 0.0


async def test_apply_rubric_async_awaits_an_async_rubric() -> None:
    assert await CountingEnv(rubric=AsyncRubric(score=0.5))._apply_rubric_async(Action(), Observation()) == 0.5


async def test_apply_rubric_async_accepts_a_sync_rubric() -> None:
    assert await CountingEnv(rubric=RecordingRubric(score=0.5))._apply_rubric_async(Action(), Observation()) == 0.5


def test_reset_rubric_calls_rubric_reset() -> None:
    rubric = RecordingRubric()
    CountingEnv(rubric=rubric)._reset_rubric()
    assert rubric.resets == 1
    CountingEnv()._reset_rubric()  # no rubric: nothing to do


async def test_reset_rubric_async_prefers_reset_async() -> None:
    rubric, plain = AsyncRubric(), RecordingRubric()
    await CountingEnv(rubric=rubric)._reset_rubric_async()
    await CountingEnv(rubric=plain)._reset_rubric_async()
    assert (rubric.resets, plain.resets) == (10, 1)


def test_web_hooks_default_to_nothing() -> None:
    env = CountingEnv()
    assert env.render_web({}) is None
    assert env.web_actions({}) == []


# --- §1.5: transforms and misc interface types -----------------------------------------------------


class AppendTransform(Transform):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self, observation: Observation) -> Observation:
        return observation.model_copy(
            update={"metadata": {"trail": [*observation.metadata.get("trail", []), self.tag]}}
        )


def test_transform_is_abstract() -> None:
    assert Transform.__abstractmethods__ == {"__call__"}
    with pytest.raises(TypeError):
        Transform()  # type: ignore[abstract]


def test_composite_transform_applies_in_order() -> None:
    composite = CompositeTransform([AppendTransform("a"), AppendTransform("b"), AppendTransform("c")])
    assert composite(Observation()).metadata == {"trail": ["a", "b", "c"]}


def test_null_transform_is_the_identity() -> None:
    observation = Observation(reward=1.0)
    assert NullTransform()(observation) is observation


def test_apply_transform_uses_the_environment_transform() -> None:
    assert CountingEnv(transform=AppendTransform("t"))._apply_transform(Observation()).metadata == {"trail": ["t"]}
    observation = Observation()
    assert CountingEnv()._apply_transform(observation) is observation


def test_message_is_a_role_content_typed_dict() -> None:
    assert typing.get_type_hints(Message) == {"role": str, "content": str}


# --- §0: public import surface ----------------------------------------------------------------------

ENV_SERVER_NAMES = [
    "Environment",
    "Transform",
    "TaskProvider",
    "Message",
    "ModelTokenizer",
    "Action",
    "Observation",
    "State",
    "ResetRequest",
    "ResetResponse",
    "StepRequest",
    "StepResponse",
    "BaseMessage",
    "CodeExecResult",
    "EnvironmentMetadata",
    "SchemaResponse",
    "HealthResponse",
    "ListTasksRequest",
    "NumTasksRequest",
    "GetTaskRequest",
    "GetTaskRangeRequest",
    "HealthStatus",
    "ServerMode",
    "WSErrorCode",
    "WSResetMessage",
    "WSStepMessage",
    "WSStateMessage",
    "WSCloseMessage",
    "WSIncomingMessage",
    "WSObservationResponse",
    "WSStateResponse",
    "WSErrorResponse",
    "ConcurrencyConfig",
    "ServerCapacityStatus",
    "SessionInfo",
    "OpenEnvError",
    "ConcurrencyConfigurationError",
    "SessionCapacityError",
    "SessionNotFoundError",
    "SessionCreationError",
    "EnvironmentFactoryError",
    "CompositeTransform",
    "NullTransform",
    "HTTPEnvServer",
    "create_app",
    "create_fastapi_app",
    "create_web_interface_app",
    "WebInterfaceManager",
    "deserialize_action",
    "deserialize_action_with_preprocessing",
    "serialize_observation",
    "GetEndpointConfig",
    "Tool",
    "ToolError",
    "ToolErrorType",
    "ListToolsAction",
    "CallToolAction",
    "ListToolsObservation",
    "CallToolObservation",
    "WSMCPMessage",
    "WSMCPResponse",
    "RESERVED_TOOL_NAMES",
    "MCPEnvironment",
    "JsonRpcErrorCode",
    "JsonRpcError",
    "JsonRpcRequest",
    "JsonRpcResponse",
    "McpMethod",
]
# Exports that are not a class or function named after themselves.
UNNAMED_VALUES = {"WSIncomingMessage": WSIncomingMessage, "RESERVED_TOOL_NAMES": RESERVED_TOOL_NAMES}
CORE_CLIENT_NAMES = [
    "EnvClient",
    "SyncEnvClient",
    "GenericEnvClient",
    "GenericAction",
    "MCPClientBase",
    "MCPToolClient",
]


@pytest.mark.parametrize("name", ENV_SERVER_NAMES)
def test_env_server_exports(name: str) -> None:
    """Each name is in ``__all__`` and resolves to the env_server object of that name."""
    module = openenv.core.env_server
    assert name in module.__all__
    value = getattr(module, name)
    if name in UNNAMED_VALUES:
        assert value is UNNAMED_VALUES[name]
    else:  # upstream gives None for web interface names it cannot import; here every name resolves
        assert value.__name__ == name
        assert value.__module__.startswith("openenv.core.env_server.")


@pytest.mark.parametrize("name", ENV_SERVER_NAMES)
def test_core_reexports_the_env_server_objects(name: str) -> None:
    assert getattr(openenv.core, name) is getattr(openenv.core.env_server, name)


@pytest.mark.parametrize("name", CORE_CLIENT_NAMES)
def test_core_client_exports(name: str) -> None:
    value = getattr(openenv.core, name)
    assert value.__name__ == name
    assert value.__module__.startswith("openenv.core.")


def test_core_reexports_everything_env_server_exports() -> None:
    assert set(openenv.core.env_server.__all__) <= set(openenv.core.__all__)


def test_from_import_of_core_names() -> None:
    from openenv.core import Action as CoreAction
    from openenv.core import StepResult as CoreStepResult
    from openenv.core.env_server import Observation as ServerObservation

    assert (CoreAction, ServerObservation, CoreStepResult) == (Action, Observation, StepResult)


def test_top_level_core_and_cli_are_the_subpackages() -> None:
    assert openenv.core is sys.modules["openenv.core"]
    assert isinstance(openenv.cli, types.ModuleType) and openenv.cli.__name__ == "openenv.cli"


@pytest.mark.parametrize("name", ["GenericEnvClient", "GenericAction", "SyncEnvClient", "EnvClient"])
def test_top_level_client_exports_are_the_core_ones(name: str) -> None:
    assert getattr(openenv, name) is getattr(openenv.core, name)


@pytest.mark.parametrize("name", ["AutoEnv", "AutoAction"])
def test_top_level_auto_exports(name: str) -> None:
    assert isinstance(getattr(openenv, name), type)


def test_upstreams_auto_module_paths_import_the_same_classes() -> None:
    from openenv.auto.auto_action import AutoAction
    from openenv.auto.auto_env import AutoEnv

    assert AutoEnv is openenv.AutoEnv and AutoAction is openenv.AutoAction
    assert AutoAction.from_env("anything", skip_install=True) is openenv.GenericAction


def test_top_level_version_comes_from_distribution_metadata() -> None:
    for dist in ("openenv", "openenv-core"):
        try:
            expected = version(dist)
            break
        except PackageNotFoundError:
            continue
    else:
        expected = "0.0.0"
    assert openenv.__version__ == expected


def test_importing_core_does_not_import_the_server_stack() -> None:
    """``import openenv.core`` alone must stay light: no fastapi, fastmcp or uvicorn."""
    code = (
        "import json, sys\n"
        "import openenv.core\n"
        "print(json.dumps(sorted(m for m in ('fastapi', 'fastmcp', 'uvicorn') if m in sys.modules)))\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(completed.stdout) == []
