"""The environment server: FastAPI routes over one :class:`SessionManager`.

Routes (OpenEnv 0.10): ``GET /health``, ``GET /schema``, ``GET /metadata``, ``POST /reset``,
``POST /step``, ``GET /state`` (simulation mode only), ``WS /ws``, ``POST /mcp`` and ``WS /mcp``,
the Task API (``/list_environments``, ``/{env_name}/splits|tasks|num_tasks|task|task_range``) and
FastAPI's ``/docs``; extensions: ``GET /openenv/capacity`` (sessions open and the limit),
``GET /openenv/metrics`` (counts and each session's progress), and for a named session
``POST /openenv/snapshot|restore|grade|trajectory|diff|agent_token`` (docs/snapshots.md,
docs/roles.md). HTTP ``/reset``, ``/step`` and ``/state`` are stateless (a fresh environment per
call) unless the request names a session created with ``openenv/session/create``: a
``session_id`` key in the body, or ``?session_id=`` for ``/state``. A WebSocket's own session is
never reached this way (it is answered 404, as an unknown id).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import math
import operator
from typing import Any, AsyncIterator, Callable, Dict, Optional, Type, Union

import pydantic
from fastapi import Body, FastAPI, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.routing import Route
from typing_extensions import Unpack

from ..utils import tuned_gc
from . import resume
from ._compat.openenv import UpstreamServerNames
from .dispatch import Call, Dispatcher, Op
from .edges import auth
from .edges.middleware import BearerAuth, BodyLimits, ErrorDetailsScope, SameOrigin, TransportLimits, http_error
from .exceptions import EnvironmentCallError, EnvironmentResultError, TaskRefusedError
from .interfaces import Environment, EnvironmentHost
from .limits import InFlightBudget
from .roles import Role, principal_of
from .serialization import deserialize_action, serialize_observation, to_json_bytes, to_jsonable
from .sessions import Session, SessionManager
from .settings import ServerOptions, ServerSettings, check_argument
from .snapshots import SnapshotSeal, snapshot_bytes, snapshot_text
from .transports.mcp import MCPProtocol
from .transports.ws import WebSocketRoutes, WSContext
from .types import (
    Action,
    ConcurrencyConfig,
    EnvironmentMetadata,
    GetTaskRangeRequest,
    GetTaskRequest,
    HealthResponse,
    ListTasksRequest,
    NumTasksRequest,
    Observation,
    ResetRequest,
    ResetResponse,
    SchemaResponse,
    ServerCapacityStatus,
    ServerMode,
    SessionInfo,
    State,
    StepRequest,
    StepResponse,
)

logger = logging.getLogger("openenv.server")

ENV_FACTORY = Callable[[], Environment]


def _json_response(content: Any, status: int = 200) -> Response:
    """A JSON response of any value (NaN and infinities written as null, which Starlette's
    JSONResponse refuses with a 500)."""
    return Response(to_json_bytes(content), status_code=status, media_type="application/json")


async def _request_validation_error(request: Request, exc: RequestValidationError) -> Response:
    """FastAPI's 422 for an invalid request body, in the same shape, but able to echo NaN inputs."""
    return _json_response({"detail": jsonable_encoder(exc.errors())}, status=422)


def _observation_response(model: Type[pydantic.BaseModel], observation: Observation) -> Dict[str, Any]:
    payload = serialize_observation(observation)
    reward = payload["reward"]
    try:
        return model(
            observation=to_jsonable(payload["observation"]),
            reward=None if reward is None or not math.isfinite(reward) else float(reward),  # JSON has no NaN
            done=payload["done"],
            metadata=to_jsonable(payload.get("metadata")),
        ).model_dump()
    except pydantic.ValidationError as exc:  # an observation built without validation: not the client's fault
        raise EnvironmentCallError(exc) from exc


class HTTPEnvServer(UpstreamServerNames):
    """Serves an environment factory over HTTP and WebSocket.

    ``env`` is a factory (usually the environment class) called once per session. With
    ``max_concurrent_envs > 1`` the environment must declare ``SUPPORTS_CONCURRENT_SESSIONS``.
    ``settings`` (default: :meth:`ServerSettings.resolve` of ``options``, the keywords of
    :class:`~.settings.ServerOptions` that ``create_app`` takes too) says how it serves; every
    ``OPENENV_*`` variable that is set overrides the argument it stands for (see :mod:`.settings`).
    Subclasses written for upstream OpenEnv 0.10 find its private attributes (``_env_factory``,
    ``_executor``, ``_sessions``...: :mod:`._compat.openenv`).
    """

    def __init__(
        self,
        env: ENV_FACTORY,
        action_cls: Type[Action],
        observation_cls: Type[Observation],
        max_concurrent_envs: Optional[int] = None,
        concurrency_config: Optional[ConcurrencyConfig] = None,
        env_name: Optional[str] = None,
        state_cls: Type[State] = State,
        *,
        reset_observation_cls: Optional[Type[Observation]] = None,
        settings: Optional[ServerSettings] = None,
        **options: Unpack[ServerOptions],
    ) -> None:
        if isinstance(env, Environment) or not callable(env):
            name = type(env).__name__
            raise TypeError(  # upstream's words first: code written for it may match them
                f"env must be a callable (class or factory function), got {type(env)}. Pass the "
                f"environment class (e.g., {name}) not an instance (e.g., {name}()), so that each "
                "session gets its own instance"
            )
        self._env_factory = env
        if max_concurrent_envs is not None and concurrency_config is not None:
            raise ValueError("Pass either max_concurrent_envs or concurrency_config, not both")
        if settings is None:
            settings = ServerSettings.resolve(**options)
        elif options:
            raise TypeError("Pass either settings or the options it holds, not both")
        self.settings = settings
        if concurrency_config is None:
            concurrency_config = ConcurrencyConfig(max_concurrent_envs=max_concurrent_envs or 1)
        if settings.max_sessions is not None:  # the deployment decides (`openenv serve --max-sessions N`)
            concurrency_config = concurrency_config.model_copy(update={"max_concurrent_envs": settings.max_sessions})
        self.concurrency_config = concurrency_config
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.reset_observation_cls = reset_observation_cls or observation_cls
        self.state_cls = state_cls
        self.env_name = env_name or getattr(env, "__name__", None) or type(env).__name__
        self.mode = settings.mode
        limits = settings.limits
        self.budget = InFlightBudget(limits.max_inflight_bytes)
        """The bytes in flight of all clients together (large frames and request bodies)."""
        self.manager = SessionManager(env, settings, concurrency=concurrency_config)
        self.credentials = auth.credentials(settings.auth_token, settings.grader_token, settings.observer_token)
        """The tokens this server takes and their roles (None: it requires none; see :mod:`.roles`)."""
        self.auth_token = self.credentials.tokens[Role.ORCHESTRATOR] if self.credentials is not None else None
        self.manager.prepare = self.prepare_session
        max_chars = limits.max_message_bytes
        self.dispatcher = Dispatcher(
            self.manager,
            env_name=self.env_name,
            action_cls=action_cls,
            observation_cls=observation_cls,
            state_cls=state_cls,
            reset_observation_cls=self.reset_observation_cls,
            agents=self.credentials.agents if self.credentials is not None else None,
            snapshots=SnapshotSeal(
                settings.snapshot_key.encode() if settings.snapshot_key else None,
                limits.max_snapshot_bytes,
                self.env_name,
            ),
        )
        """Where every transport's calls go (:mod:`.dispatch`)."""
        self.mcp = MCPProtocol(self.dispatcher, self.env_name)
        self.ws_context = WSContext(self.dispatcher, max_chars, self.mcp)
        """What the WebSocket routes get of this server."""

    # --- introspection (OpenEnv 0.10 API) ---------------------------------------------------

    @property
    def max_concurrent_envs(self) -> int:
        return self.manager.max_sessions

    @property
    def active_sessions(self) -> int:
        return self.manager.active_sessions

    @property
    def is_concurrency_safe(self) -> bool:
        cls = self.manager.env_cls
        if cls is None:
            return self.max_concurrent_envs > 1
        return bool(getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False))

    def get_capacity_status(self) -> ServerCapacityStatus:
        return self.manager.capacity_status()

    def get_session_info(self, session_id: str) -> Optional[SessionInfo]:
        return self.manager.session_info(session_id)

    def prepare_session(self, session: Session) -> None:
        """Tell a new environment the server's mode and worker pool (:class:`~.interfaces.EnvironmentHost`)."""
        if isinstance(session.env, Environment):
            session.env.host = EnvironmentHost(mode=self.mode.value, pool=self.manager.pool)

    # --- the HTTP codec's one way to the dispatcher -----------------------------------------

    async def _serve(self, call: Call, request: Request, encode: Callable[[Any], Any]) -> Any:
        """``encode`` of the answer to ``call`` (made by the request's principal), its failures
        answered as JSON errors with a code.

        A call on a named session may carry its number (``X-OpenEnv-Seq``): sent again, it is
        answered from the record. A stateless call (no session named) is cancelled when its
        client disconnects meanwhile: its slot is freed at once, and a sync call still running
        goes on in its worker, the environment closed once it returns. Calls on a named session
        are left to finish, so its environment is never left halfway through one."""
        call.principal = principal_of(request.scope)
        if call.session_id:
            seq = request.headers.get(resume.SEQ_HEADER)
            if seq is not None:
                call.seq = int(seq) if seq.isascii() and seq.isdigit() and len(seq) <= 18 else seq
            return await self._answer(call, encode)
        task = asyncio.current_task()
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone = True
            if task is not None:
                task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            return await self._answer(call, encode)
        except asyncio.CancelledError:
            if not gone:
                raise
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:  # Python 3.11+
                uncancel()
            return Response(status_code=499)  # nobody reads it
        finally:
            watcher.cancel()

    async def _answer(self, call: Call, encode: Callable[[Any], Any]) -> Any:
        try:
            return encode(await self.dispatcher.run(call))
        except TaskRefusedError as exc:  # in upstream's words: {"detail"} alone
            return JSONResponse({"detail": exc.text}, status_code=exc.kind.http_status)
        except Exception as exc:
            return http_error(exc)

    async def _metadata_of_env(self) -> EnvironmentMetadata:
        return await self.dispatcher.metadata()

    def schema(self) -> Dict[str, Any]:
        return self.dispatcher.schema()

    async def _call_task_method(self, request: Request, env_name: str, method: str, *args: Any) -> Any:
        """``method`` of a fresh environment, its result checked and shaped into the reply (a
        method that fails, or returns what the reply cannot hold, is a JSON 500)."""
        call = Call(Op.TASK, (env_name, method, args), principal=principal_of(request.scope))
        return await self._answer(call, lambda result: _json_response(_task_reply(method, result, self.env_name)))

    # --- routes ------------------------------------------------------------------------------

    def register_routes(self, app: FastAPI, mode: Union[ServerMode, str] = ServerMode.SIMULATION) -> None:
        """Add every route to ``app`` (HTTP reset/step/state only in simulation mode)."""
        self.mode = check_argument("mode", mode or ServerMode.SIMULATION)
        self._install_lifespan(app)
        if self.mode is ServerMode.SIMULATION:
            self._register_simulation_routes(app)
        self._register_info_routes(app)
        mcp = self.mcp
        app.add_api_route(
            "/mcp", mcp.serve_http, methods=["POST"], tags=["Environment Info"], summary="MCP / JSON-RPC endpoint"
        )
        app.add_api_route("/mcp", mcp.refuse_http_get, methods=["GET"], include_in_schema=False)
        app.add_api_route("/mcp", mcp.close_http, methods=["DELETE"], include_in_schema=False)
        # (WS /mcp and /ws are served by WebSocketRoutes, ahead of the routes)
        self._register_task_routes(app)
        open_paths = auth.OPEN_PATHS
        if self.settings.web:
            from .web import PAGE_PATHS, Playground

            Playground(self).register(app)
            open_paths = open_paths | PAGE_PATHS
        app.add_exception_handler(RequestValidationError, _request_validation_error)  # type: ignore[arg-type]
        # The edges (see .edges.middleware), innermost first: Starlette wraps each added one around the previous.
        app.add_middleware(BodyLimits, limit=self.settings.limits.max_message_bytes, budget=self.budget)
        app.add_middleware(WebSocketRoutes, context=self.ws_context, routes=app.router.routes)
        if self.credentials is not None:
            _guard_docs(app, self.dispatcher)
            app.add_middleware(BearerAuth, credentials=self.credentials, open_paths=open_paths)
        app.add_middleware(SameOrigin, allowed=self.settings.allowed_origins, hosts=self.settings.allowed_hosts)
        app.add_middleware(ErrorDetailsScope, choice=self.settings.error_details)
        app.add_middleware(TransportLimits, limits=self.settings.limits, budget=self.budget)

    def _install_lifespan(self, app: FastAPI) -> None:
        previous = app.router.lifespan_context
        manager = self.manager
        ws_context = self.ws_context
        gc_tuning = self.settings.gc_tuning

        @contextlib.asynccontextmanager
        async def lifespan(application: Any) -> AsyncIterator[Any]:
            manager.reopen()  # served before (and shut down): take sessions again
            async with previous(application) as state:
                with tuned_gc(gc_tuning is True):
                    try:
                        yield state
                    finally:
                        await ws_context.stopping()  # clients told the server stops: none waits to resume
                        await manager.shutdown()

        app.router.lifespan_context = lifespan

    def _register_simulation_routes(self, app: FastAPI) -> None:
        server = self
        reset_response = functools.partial(_observation_response, ResetResponse)
        step_response = functools.partial(_observation_response, StepResponse)

        @app.post(
            "/reset",
            response_model=ResetResponse,
            tags=["Environment Control"],
            summary="Reset an environment",
            description=(
                "Starts an episode on a fresh environment and returns its first observation. "
                "Stateless unless the body names a `session_id` (from `openenv/session/create`); "
                "use the `/ws` WebSocket for stateful episodes."
            ),
        )
        async def reset(http_request: Request, request: Optional[ResetRequest] = Body(default=None)) -> Any:
            kwargs = request.model_dump(exclude_unset=True) if request is not None else {}
            call = Call(Op.RESET, kwargs, kwargs.pop("session_id", None))
            return await server._serve(call, http_request, reset_response)

        @app.post(
            "/step",
            response_model=StepResponse,
            tags=["Environment Control"],
            summary="Apply an action",
            description=(
                "Applies an action to a fresh environment (stateless) or to the session named by "
                "`session_id`. Action validation errors answer 422 with locations relative to the action."
            ),
        )
        async def step(http_request: Request, request: StepRequest) -> Any:
            kwargs = request.model_dump(exclude_unset=True)
            session_id = kwargs.pop("session_id", None)
            try:  # before a session is taken: an invalid action costs no environment
                action = deserialize_action(kwargs.pop("action"), server.action_cls)
            except Exception as exc:
                return http_error(exc)
            return await server._serve(Call(Op.STEP, (action, kwargs), session_id), http_request, step_response)

        @app.get(
            "/state",
            response_model=server.state_cls,
            tags=["State Management"],
            summary="Environment state",
            description="The state of a fresh environment, or of the session named by `session_id`.",
        )
        async def state(http_request: Request, session_id: Optional[str] = Query(default=None)) -> Any:
            return await server._serve(Call(Op.STATE, None, session_id), http_request, _json_response)

        @app.post("/openenv/snapshot", tags=["State Management"], summary="Snapshot a session")
        async def snapshot(http_request: Request, request: SnapshotRequest) -> Any:
            # (an extension: the session named by `session_id`, sealed; see docs/snapshots.md)
            return await server._serve(Call(Op.SNAPSHOT, None, request.session_id), http_request, _snapshot_response)

        @app.post("/openenv/grade", tags=["State Management"], summary="Grade a copy of a session")
        async def grade(http_request: Request, request: SnapshotRequest) -> Any:
            # (an extension: the environment's grade() run on a copy of the named session; docs/roles.md)
            call = Call(Op.GRADE, None, request.session_id)
            return await server._serve(call, http_request, lambda result: _json_response({"grade": result}))

        @app.post("/openenv/trajectory", tags=["State Management"], summary="A session's trajectory since its reset")
        async def trajectory(http_request: Request, request: SnapshotRequest) -> Any:
            # (an extension: each reset, step and tool call of the named session; docs/roles.md)
            return await server._serve(Call(Op.TRAJECTORY, None, request.session_id), http_request, _json_response)

        @app.post("/openenv/diff", tags=["State Management"], summary="A session's work directory, changed since reset")
        async def diff(http_request: Request, request: SnapshotRequest) -> Any:
            # (an extension: the files added, removed and modified since the reset; docs/roles.md)
            return await server._serve(Call(Op.DIFF, None, request.session_id), http_request, _json_response)

        @app.post("/openenv/agent_token", tags=["State Management"], summary="Mint an agent credential")
        async def agent_token(http_request: Request, request: SnapshotRequest) -> Any:
            # (an extension: a credential for the agent of the named session; see docs/roles.md)
            return await server._serve(Call(Op.MINT_AGENT, None, request.session_id), http_request, _json_response)

        @app.post("/openenv/restore", tags=["State Management"], summary="Restore a snapshot into a session")
        async def restore(http_request: Request, request: RestoreRequest) -> Any:
            try:
                blob = snapshot_bytes(request.snapshot)
            except Exception as exc:
                return http_error(exc)
            call = Call(Op.RESTORE, blob, request.session_id)
            return await server._serve(call, http_request, lambda state: _json_response({"state": state}))

    def _register_info_routes(self, app: FastAPI) -> None:
        server = self

        @app.get("/health", response_model=HealthResponse, tags=["Health"], summary="Health check")
        async def health() -> Any:
            return {"status": "healthy"}

        @app.get("/openenv/capacity", response_model=ServerCapacityStatus, include_in_schema=False)
        async def capacity(http_request: Request) -> Any:
            # How full this server is (an extension, behind the token when one is set): the front
            # of `openenv serve --workers N` sums these into its own /health; RayEnvPool reads it.
            return await server._answer(Call(Op.CAPACITY, principal=principal_of(http_request.scope)), _json_response)

        @app.get("/openenv/metrics", tags=["Health"], summary="Counts and each session's progress")
        async def metrics(http_request: Request) -> Any:
            # (an extension: for the observer, grader and orchestrator; never observations; docs/roles.md)
            return await server._answer(Call(Op.METRICS, principal=principal_of(http_request.scope)), _json_response)

        @app.get(
            "/schema",
            response_model=SchemaResponse,
            tags=["Schema"],
            summary="JSON schemas of action, observation and state",
        )
        async def schema(http_request: Request) -> Any:
            return await server._answer(Call(Op.SCHEMA, principal=principal_of(http_request.scope)), JSONResponse)

        @app.get(
            "/metadata", response_model=EnvironmentMetadata, tags=["Environment Info"], summary="Environment metadata"
        )
        async def metadata(http_request: Request) -> Any:
            try:
                return (
                    await server.dispatcher.run(Call(Op.METADATA, principal=principal_of(http_request.scope)))
                ).model_dump()
            except Exception as exc:
                return http_error(exc)

    def _register_task_routes(self, app: FastAPI) -> None:
        server = self

        @app.get("/list_environments", tags=["Environment Info"], summary="Environments served here")
        async def list_environments(http_request: Request) -> Any:
            call = Call(Op.SCHEMA, principal=principal_of(http_request.scope))  # (what is served: as the schemas)
            return await server._answer(call, lambda _: [server.env_name])

        @app.get("/{env_name}/splits", tags=["Tasks"], summary="Task splits")
        async def splits(env_name: str, http_request: Request) -> Any:
            return await server._call_task_method(http_request, env_name, "list_splits")

        @app.post("/{env_name}/tasks", tags=["Tasks"], summary="Tasks of a split")
        async def tasks(env_name: str, http_request: Request, request: ListTasksRequest) -> Any:
            return await server._call_task_method(http_request, env_name, "list_tasks", request.split)

        @app.post("/{env_name}/num_tasks", tags=["Tasks"], summary="Number of tasks in a split")
        async def num_tasks(env_name: str, http_request: Request, request: NumTasksRequest) -> Any:
            return await server._call_task_method(http_request, env_name, "num_tasks", request.split)

        @app.post("/{env_name}/task", tags=["Tasks"], summary="One task")
        async def task(env_name: str, http_request: Request, request: GetTaskRequest) -> Any:
            return await server._call_task_method(http_request, env_name, "get_task", request.split, request.index)

        @app.post("/{env_name}/task_range", tags=["Tasks"], summary="A slice of a split's tasks")
        async def task_range(env_name: str, http_request: Request, request: GetTaskRangeRequest) -> Any:
            return await server._call_task_method(
                http_request, env_name, "get_task_range", request.split, request.start, request.stop
            )


def _guard_docs(app: FastAPI, dispatcher: Dispatcher) -> None:
    """FastAPI's own pages (``/openapi.json``, ``/docs``, ``/redoc``) describe the API, schemas
    and all: for the roles that may read ``/schema``, asked of the dispatch like it."""
    paths = {app.openapi_url, app.docs_url, app.redoc_url} - {None}
    for route in app.router.routes:
        if isinstance(route, Route) and route.path in paths:
            route.app = functools.partial(_after_schema_check, dispatcher, route.app)


async def _after_schema_check(dispatcher: Dispatcher, page: Any, scope: Any, receive: Any, send: Any) -> None:
    try:
        await dispatcher.run(Call(Op.SCHEMA, principal=principal_of(scope)))
    except Exception as exc:
        await http_error(exc)(scope, receive, send)
        return
    await page(scope, receive, send)


def _task_reply(method: str, result: Any, env_name: str) -> Any:
    """The reply to a Task API call of ``method`` that returned ``result``; a result of the wrong kind
    is refused (:class:`EnvironmentResultError`, a 500). Numpy arrays and integers count as lists and ints."""
    if method == "get_task":
        return {"task": to_jsonable(result)}
    if method == "num_tasks":
        if isinstance(result, bool) or not hasattr(result, "__index__"):
            raise EnvironmentResultError(f"num_tasks() returned {type(result).__name__}, not an int")
        return {"num_tasks": operator.index(result)}
    to_list = getattr(result, "tolist", None)
    if callable(to_list) and not isinstance(result, (list, tuple)):
        result = to_list()
    if not isinstance(result, (list, tuple)):
        raise EnvironmentResultError(f"{method}() returned {type(result).__name__}, not a list")
    if method == "list_tasks":
        return {"tasks": to_jsonable(result), "env_name": env_name}
    if method == "get_task_range":
        return {"tasks": to_jsonable(result)}
    return [_split_entry(split) for split in result]  # list_splits


def _split_entry(split: Any) -> Any:
    if isinstance(split, str):
        return {"name": split, "type": split if split in ("train", "validation", "test") else "validation"}
    return to_jsonable(split)


def create_fastapi_app(
    env: ENV_FACTORY,
    action_cls: Type[Action],
    observation_cls: Type[Observation],
    max_concurrent_envs: Optional[int] = None,
    concurrency_config: Optional[ConcurrencyConfig] = None,
    env_name: Optional[str] = None,
    state_cls: Type[State] = State,
    *,
    mode: Union[ServerMode, str, None] = None,
    reset_observation_cls: Optional[Type[Observation]] = None,
    **options: Unpack[ServerOptions],
) -> FastAPI:
    """A FastAPI app serving ``env`` (see :class:`HTTPEnvServer` for ``options``); ``mode``
    defaults to simulation, and ``$OPENENV_MODE``, when set, decides instead."""
    app = FastAPI(
        title="OpenEnv Environment HTTP API",
        version="1.0.0",
        description="HTTP and WebSocket API of an OpenEnv environment. Use the `/ws` WebSocket for episodes.",
        license_info={"name": "BSD-3-Clause", "url": "https://opensource.org/licenses/BSD-3-Clause"},
        openapi_tags=[
            {"name": "Environment Control", "description": "Reset and step"},
            {"name": "State Management", "description": "Episode state"},
            {"name": "Environment Info", "description": "Metadata and MCP"},
            {"name": "Schema", "description": "JSON schemas"},
            {"name": "Health", "description": "Liveness"},
        ],
    )
    settings = ServerSettings.resolve(mode=mode, **options)
    server = HTTPEnvServer(
        env,
        action_cls,
        observation_cls,
        max_concurrent_envs,
        concurrency_config,
        env_name,
        state_cls,
        reset_observation_cls=reset_observation_cls,
        settings=settings,
    )
    server.register_routes(app, settings.mode)
    app.state.openenv_server = server
    return app


def create_app(
    env: ENV_FACTORY,
    action_cls: Type[Action],
    observation_cls: Type[Observation],
    env_name: Optional[str] = None,
    max_concurrent_envs: Optional[int] = None,
    concurrency_config: Optional[ConcurrencyConfig] = None,
    gradio_builder: Optional[Callable[..., Any]] = None,
    custom_tab_name: str = "Custom",
    custom_tab_primary: bool = False,
    show_default_tab: bool = True,
    title_override: Optional[str] = None,
    state_cls: Type[State] = State,
    *,
    mode: Union[ServerMode, str, None] = None,
    reset_observation_cls: Optional[Type[Observation]] = None,
    **options: Unpack[ServerOptions],
) -> FastAPI:
    """The app for an environment: what ``server/app.py`` of an environment package exports.

    Same signature as OpenEnv 0.10's ``create_app`` plus the keywords of
    :class:`~.settings.ServerOptions` (see :class:`HTTPEnvServer`). ``web=True`` (or
    ``ENABLE_WEB_INTERFACE=1``, which decides when set) adds the web playground at ``/web/``
    (:mod:`.web`). With the page on, a package's ``gradio_builder`` (called as upstream calls it)
    is mounted beside it at ``/web/custom/`` when Gradio is installed (``openenv[gradio]``;
    :mod:`.web.custom`, which also says what the tab options do); without Gradio the page is
    served alone and a log line says how to get it.
    """
    app = create_fastapi_app(
        env,
        action_cls,
        observation_cls,
        max_concurrent_envs,
        concurrency_config,
        env_name,
        state_cls,
        mode=mode,
        reset_observation_cls=reset_observation_cls,
        **options,
    )
    server = app.state.openenv_server
    if gradio_builder is not None and server.settings.web:
        from .web.custom import mount_custom_ui

        mount_custom_ui(
            app,
            app.state.openenv_playground,
            gradio_builder,
            env,
            action_cls,
            observation_cls,
            env_name=env_name,
            custom_tab_name=custom_tab_name,
            custom_tab_primary=custom_tab_primary,
            show_default_tab=show_default_tab,
            title_override=title_override,
            show_errors=server.settings.error_details is True,
        )
    return app


@functools.wraps(create_app, assigned=("__annotations__",))
def create_web_interface_app(*args: Any, **options: Any) -> FastAPI:
    """OpenEnv 0.10's name for :func:`create_app` with the web playground (same signature):
    ``create_app(..., web=True)`` (``ENABLE_WEB_INTERFACE=0``, when set, still turns it off)."""
    options.setdefault("web", True)
    return create_app(*args, **options)


create_web_interface_app.__signature__ = inspect.signature(create_app)  # type: ignore[attr-defined]


class SnapshotRequest(pydantic.BaseModel):
    """``POST /openenv/snapshot``: the session (from ``openenv/session/create``) to snapshot."""

    model_config = pydantic.ConfigDict(extra="forbid")
    session_id: str = pydantic.Field(min_length=1, max_length=256)


class RestoreRequest(SnapshotRequest):
    """``POST /openenv/restore``: a snapshot (base64, as ``/openenv/snapshot`` answered it) to
    load into the session."""

    snapshot: str


def _snapshot_response(blob: bytes) -> Response:
    return _json_response({"snapshot": snapshot_text(blob), "bytes": len(blob)})
