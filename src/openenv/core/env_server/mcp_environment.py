"""Environments whose actions are MCP tool calls.

Subclass :class:`MCPEnvironment`, declare tools on a FastMCP server (``@mcp.tool``) and pass the
server to ``super().__init__(mcp)``. ``ListToolsAction`` and ``CallToolAction`` sent to ``step``
are answered from those tools; any other action goes to ``_step_impl``. Tool calls go straight to
the FastMCP server (no in-memory MCP client round trip) and are bounded by a timeout.

A tool that takes FastMCP's ``Context`` (or any parameter FastMCP injects) is called through an
MCP client connection the environment holds open for its life: FastMCP keys ``ctx.set_state`` /
``ctx.get_state`` by connection, so what such a tool keeps lasts across the calls of one OpenEnv
session and stays apart from other sessions'.

Snapshots: an MCP environment's session state is what its subclass keeps in its own attributes
(the tools' state included, when the tools keep it on the environment): the default
``snapshot_state`` saves those, and leaves out the base's machinery (the FastMCP server, the tool
tables, the MCP client connection), which the constructor rebuilds. What tools keep with
FastMCP's ``Context`` (``ctx.set_state``) lives in FastMCP's session store instead, where a
snapshot cannot reach it: once such a tool has been called (the environment holds its connection),
a snapshot is refused. So is one taken while an abandoned sync tool call still runs on the instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
from abc import abstractmethod
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple

import mcp.types
import pydantic

try:
    from fastmcp import FastMCP
    from fastmcp import exceptions as fastmcp_errors
    from fastmcp.tools import Tool as FastMCPTool
except ImportError as exc:  # the base install has no FastMCP: say which extra brings it
    raise ImportError(
        f"MCPEnvironment needs FastMCP, which is not installed ({exc}); install it with "
        "pip install 'openenv[core]' (or pip install 'fastmcp-slim[server]')"
    ) from exc

from ..utils import run_async_safely, timeout_after
from . import error_details
from ._compat.fastmcp import (
    CallToolResult,
    DirectTool,
    DirectTools,
    ToolBodyError,
    body_error_message,
    masks_error_details,
    registered_tool_names,
    tool_result_payload,
)
from .exceptions import EnvironmentCallError, SnapshotUnsupportedError
from .interfaces import Environment, Transform
from .mcp_types import (
    RESERVED_TOOL_NAMES,
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolCallFailed,
    ToolError,
    ToolErrorType,
    tool_result_value,
)
from .types import Action, Observation
from .workers import WorkerPool

logger = logging.getLogger("openenv.server")

MCP_TOOL_CALL_TIMEOUT = 30.0
"""Seconds a tool call may run when the caller gives no ``timeout_s``."""

_POOL: Optional[WorkerPool] = None


def _default_pool() -> WorkerPool:
    """Worker pool for sync tools of environments used outside a server."""
    global _POOL
    if _POOL is None:
        _POOL = WorkerPool(8, name="openenv-tools")
    return _POOL


_MODES = (None, "production", "simulation")
_CLOSING: set = set()  # closes of MCP client connections under way (a task needs a reference)


def _client_options() -> Dict[str, Any]:
    """FastMCP 4 connects in the 2026 protocol era by default, where every request is a connection
    of its own (so a Context's state would not outlive a call): ask for the handshake era."""
    from fastmcp import Client

    return {"mode": "legacy"} if "mode" in inspect.signature(Client).parameters else {}


def _injects_parameters(tool: Any) -> bool:
    """Whether FastMCP passes ``tool`` parameters of its own (a ``Context``, a dependency):
    parameters of its function that its input schema does not declare."""
    try:
        params = inspect.signature(tool.fn).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    declared = (tool.parameters or {}).get("properties", {})
    return any(n not in declared and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for n, p in params.items())


_ModeTool = Tuple[FastMCPTool, Optional[DirectTool]]


def _failure(exc: BaseException, name: str, mask: bool = False) -> ToolCallFailed:
    """The failure of tool ``name`` that raised ``exc``; ``mask``: the FastMCP server's
    ``mask_error_details`` (a directly called tool's failure reads as FastMCP would word it)."""
    if isinstance(exc, ToolCallFailed):
        return exc
    error_type = ToolErrorType.EXECUTION_ERROR
    if isinstance(exc, fastmcp_errors.NotFoundError):
        error_type, message = ToolErrorType.TOOL_NOT_FOUND, f"Unknown tool: '{name}'"
    elif isinstance(exc, (fastmcp_errors.ValidationError, pydantic.ValidationError)):
        error_type, message = ToolErrorType.INVALID_ARGS, f"Invalid arguments for tool '{name}': {exc}"
    elif isinstance(exc, ToolBodyError):
        message = body_error_message(exc, name, mask)
    elif mask and isinstance(exc, EnvironmentCallError):  # SystemExit, CancelledError... of the tool
        message = f"Error calling tool {name!r}"
    else:
        message = str(exc) or type(exc).__name__
    return ToolCallFailed(ToolError(error_type=error_type, message=message))


_HAS_CANCELLING = hasattr(asyncio.Task, "cancelling")  # Python 3.11+


class _ToolCancelled(Exception):
    """What :func:`_own_task` raises for a CancelledError the tool raised itself (``original``)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


async def _own_task(coro: Any) -> Any:
    """Python 3.10, which cannot tell a task's cancellation from a CancelledError raised inside
    it: run ``coro`` in a task of its own; a cancellation of the caller cancels it and propagates,
    while one the tool raised itself comes back as _ToolCancelled (with the tool's exception)."""
    cancelled_by_us: List[bool] = []
    inner = asyncio.ensure_future(_no_exit(coro, cancelled_by_us))
    try:
        await asyncio.wait([inner])
    except asyncio.CancelledError:
        cancelled_by_us.append(True)
        inner.cancel()
        with contextlib.suppress(BaseException):  # let it unwind (a sync call it ran is recorded)
            await asyncio.wait([inner])
        if inner.done() and not inner.cancelled():
            inner.exception()  # read: it failed while unwinding, and we answer the cancellation
        raise
    if inner.cancelled():  # (cancelled by something else than the tool's own raise)
        raise _ToolCancelled(asyncio.CancelledError())
    return inner.result()


async def _no_exit(coro: Any, cancelled_by_us: List[bool]) -> Any:
    try:
        return await coro
    except SystemExit as exc:  # raised in a task, it would stop the event loop
        raise EnvironmentCallError(exc) from exc
    except asyncio.CancelledError as exc:
        if cancelled_by_us:
            raise
        raise _ToolCancelled(exc) from None  # the tool's own: keep its words


def _refuse_reserved(name: str) -> None:
    if name in RESERVED_TOOL_NAMES:
        message = f"Tool '{name}' has a reserved name: use the environment's own {name} instead"
        raise ToolCallFailed(ToolError(error_type=ToolErrorType.TOOL_NOT_FOUND, message=message))


def _check_names(names: List[str]) -> None:
    reserved = sorted(set(names) & RESERVED_TOOL_NAMES)
    if reserved:
        raise ValueError(
            f"MCP tools may not be named {', '.join(reserved)}: the names {sorted(RESERVED_TOOL_NAMES)} "
            "are reserved for the environment's own operations"
        )


class MCPEnvironment(Environment):
    """An environment that exposes FastMCP tools as its actions.

    ``self.mcp_server`` is the FastMCP server. Tools declared with ``@self.tool(mode=...)`` are
    offered only when the server runs in that mode (``"production"`` or ``"simulation"``), which
    the server tells each instance it builds (``self.host.mode``, :class:`~.interfaces.EnvironmentHost`).

    A tool call's observation is a :class:`CallToolObservation`; when the environment has a
    ``rubric`` its score becomes the observation's reward, and its ``transform`` is applied
    (see :meth:`_after_mcp_action`).
    """

    ANSWERS_MCP = True

    SNAPSHOT_EXCLUDE = (
        "mcp_server",
        "_mode_tools",
        "_has_mode_tools",
        "_direct",
        "_mcp_client",
        "_connection",
        "_abandoned_tool_call",
    )
    """The base's machinery, rebuilt by the constructor (a subclass's own ``SNAPSHOT_EXCLUDE`` adds
    to these: see :attr:`Environment.SNAPSHOT_EXCLUDE`)."""

    def __init__(self, mcp_server: FastMCP, transform: Optional[Transform] = None) -> None:
        """``mcp_server`` holds the tools (none may have a reserved name: ``ValueError``);
        ``transform`` is applied to each MCP action's observation. As upstream's, the constructor
        takes no ``mode``: the server gives every instance it builds its own mode (``self.host``),
        and :meth:`tool` declares tools per mode."""
        super().__init__(transform=transform)
        _check_names(registered_tool_names(mcp_server))
        self.mcp_server = mcp_server
        # per mode, each tool by name with its DirectTool where it can be called directly
        self._mode_tools: Dict[str, Dict[str, _ModeTool]] = {"production": {}, "simulation": {}}
        self._has_mode_tools = False
        self._direct = DirectTools.of(mcp_server)
        self._mcp_client: Any = None
        self._connection: Optional[Tuple[Any, asyncio.AbstractEventLoop]] = None  # (client, its loop)

    # --- declaring tools ---------------------------------------------------------------------

    def tool(
        self,
        fn: Optional[Callable[..., Any]] = None,
        *,
        mode: Optional[str] = None,
        name: Optional[str] = None,
        description: Optional[str] = None,
    ) -> Any:
        """Decorator declaring a tool (``@env.tool`` or ``@env.tool(mode=..., name=..., description=...)``).

        ``mode`` says when it is offered: ``None`` (the default) always, as a tool of the FastMCP
        server; ``"production"`` or ``"simulation"`` only while the server runs in that mode
        (``self._mode``, set by the server), so one name may have one implementation per mode.
        Any other value, or a reserved name (``reset``, ``step``, ``state``, ``close``), is a
        ``ValueError``."""
        if mode not in _MODES:
            raise ValueError(f"mode must be one of None, 'production', 'simulation'; got {mode!r}")

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            tool_name = name or func.__name__
            _check_names([tool_name])
            if mode is None:
                self.mcp_server.tool(func, name=tool_name, description=description)
            else:
                tool = FastMCPTool.from_function(func, name=tool_name, description=description)
                self._mode_tools[mode][tool_name] = (tool, DirectTool(tool) if DirectTool.supports(tool) else None)
                self._has_mode_tools = True
            return func

        return register(fn) if fn is not None else register

    @property
    def mcp_client(self) -> Any:
        """A ``fastmcp.Client`` on this environment's server (made on first use)."""
        if self._mcp_client is None:
            from fastmcp import Client

            self._mcp_client = Client(self.mcp_server, **_client_options())
        return self._mcp_client

    @contextlib.asynccontextmanager
    async def mcp_session(self) -> AsyncIterator[Any]:
        """The in-memory MCP client, connected; for code that wants the full MCP client API."""
        if self.mcp_server is None:
            raise RuntimeError("MCPEnvironment is closed")
        async with self.mcp_client as client:
            yield client

    async def _connected_client(self) -> Any:
        """This environment's own MCP client connection, opened on first use and kept open on the
        running loop (see the module's docstring)."""
        loop = asyncio.get_running_loop()
        if self._connection is not None:
            client, its_loop = self._connection
            if its_loop is loop and client.is_connected():
                return client
            self._drop_connection()
        from fastmcp import Client

        client = Client(self.mcp_server, **_client_options())
        await client.__aenter__()
        self._connection = (client, loop)
        return client

    def _drop_connection(self) -> None:
        """Close the environment's MCP client connection, from any thread."""
        held, self._connection = self._connection, None
        if held is None or held[1].is_closed():
            return
        client, loop = held
        closing = client.__aexit__(None, None, None)
        try:
            on_its_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_its_loop = False
        if on_its_loop:
            task = loop.create_task(closing)
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)
        elif loop.is_running():
            asyncio.run_coroutine_threadsafe(closing, loop)
        else:
            closing.close()

    async def _call_with_context(self, name: str, arguments: Dict[str, Any]) -> Any:
        result = await (await self._connected_client()).call_tool(name, arguments, raise_on_error=False)
        if result.is_error:
            message = " ".join(getattr(c, "text", "") for c in result.content or ()) or f"Error calling tool {name!r}"
            raise ToolCallFailed(ToolError(error_type=ToolErrorType.EXECUTION_ERROR, message=message))
        return result

    # --- listing and calling ------------------------------------------------------------------

    @property
    def _mode(self) -> Optional[str]:
        """Upstream's name for the server's mode (``self.host.mode``); code written for it sets it."""
        return self.host.mode

    @_mode.setter
    def _mode(self, mode: Any) -> None:
        self.host = dataclasses.replace(self.host, mode=getattr(mode, "value", mode))

    def _visible_mode_tools(self) -> Dict[str, _ModeTool]:
        mode = self.host.mode
        return self._mode_tools.get(mode, {}) if isinstance(mode, str) else {}

    async def fastmcp_tools(self) -> List[FastMCPTool]:
        """Every tool offered right now, as FastMCP tool objects."""
        mode_tools = self._visible_mode_tools()
        tools = [t for t in await self.mcp_server.list_tools() if t.name not in mode_tools]
        reserved = [t.name for t in tools if t.name in RESERVED_TOOL_NAMES]
        if reserved:  # registered after __init__ checked the names: not offered (nor callable)
            logger.warning("not offering MCP tools with reserved names: %s", ", ".join(sorted(reserved)))
            tools = [t for t in tools if t.name not in RESERVED_TOOL_NAMES]
        return tools + [tool for tool, _ in mode_tools.values()]

    async def list_tools_async(self) -> List[Tool]:
        return [
            Tool(name=t.name, description=t.description or "", input_schema=t.parameters or {})
            for t in await self.fastmcp_tools()
        ]

    async def call_tool_async(
        self, name: str, arguments: Optional[Dict[str, Any]] = None, timeout_s: Optional[float] = None
    ) -> Any:
        """Call a tool and return FastMCP's ``ToolResult``; failures raise :class:`ToolCallFailed`."""
        _refuse_reserved(name)
        return await self._guarded_call(name, arguments or {}, timeout_s, as_payload=False)

    async def call_tool_payload(
        self, name: str, arguments: Optional[Dict[str, Any]] = None, timeout_s: Optional[float] = None
    ) -> Dict[str, Any]:
        """Call a tool and return its result as OpenEnv sends it (see :func:`tool_result_payload`);
        failures raise :class:`ToolCallFailed`."""
        arguments = arguments or {}
        _refuse_reserved(name)
        mode_tool = self._visible_mode_tools().get(name) if self._has_mode_tools else None
        # (the server's tools are indexed, and cached() finds them, from their first call on)
        direct = mode_tool[1] if mode_tool is not None else self._direct.cached(name)
        if direct is not None and direct.inline:  # a sync tool declared to run on the loop: no deadline could stop it
            try:
                return direct.payload(direct.validate_and_call(arguments))
            except Exception as exc:
                raise _failure(exc, name, masks_error_details(self.mcp_server)) from exc
        return await self._guarded_call(name, arguments, timeout_s, as_payload=True)

    async def _guarded_call(
        self, name: str, arguments: Dict[str, Any], timeout_s: Optional[float], as_payload: bool
    ) -> Any:
        timeout = timeout_s or MCP_TOOL_CALL_TIMEOUT
        try:
            async with timeout_after(timeout) as scope:
                if _HAS_CANCELLING:
                    return await self._call_tool(name, arguments, as_payload)
                return await _own_task(self._call_tool(name, arguments, as_payload))
        except asyncio.CancelledError as exc:
            if not _HAS_CANCELLING or asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # a real cancellation (on 3.10 _own_task turned the tool's own into ToolCancelled)
            # The tool raised CancelledError itself (a cancelled inner task it awaited, say).
            raise _failure(EnvironmentCallError(exc), name, masks_error_details(self.mcp_server)) from exc
        except (SystemExit, GeneratorExit, _ToolCancelled) as exc:  # the tool's (KeyboardInterrupt is the user's)
            raised = exc.original if isinstance(exc, _ToolCancelled) else exc
            raise _failure(EnvironmentCallError(raised), name, masks_error_details(self.mcp_server)) from exc
        except Exception as exc:
            # Only this deadline is a TIMEOUT: a TimeoutError the tool raised is its own failure, and a
            # cancellation from outside (the server's step timeout, a client gone) is not caught here.
            if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) and scope.expired():
                message = f"Tool '{name}' timed out after {timeout:g} seconds"
                raise ToolCallFailed(ToolError(error_type=ToolErrorType.TIMEOUT, message=message)) from None
            raise _failure(exc, name, masks_error_details(self.mcp_server)) from exc

    async def _call_tool(self, name: str, arguments: Dict[str, Any], as_payload: bool) -> Any:
        mode_tool, direct = self._visible_mode_tools().get(name, (None, None))
        if mode_tool is None:
            direct = await self._direct.get(name)
        if direct is not None:
            value = await direct.call(arguments, self._run_sync)
            return direct.payload(value) if as_payload else direct.tool.convert_result(value)
        if mode_tool is not None:
            try:
                result = await mode_tool.run(arguments)
            except (fastmcp_errors.FastMCPError, pydantic.ValidationError):
                raise  # FastMCP's own errors and bad arguments pass as they are, as in FastMCP.call_tool
            except Exception as exc:  # the tool's own failure: worded as FastMCP words it
                raise ToolBodyError(exc) from exc
        else:
            tool = await self.mcp_server.get_tool(name)
            if tool is not None and _injects_parameters(tool):
                result = await self._call_with_context(name, arguments)
            else:
                result = await self.mcp_server.call_tool(name, arguments)
        return tool_result_payload(result) if as_payload else result

    async def _run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a sync tool off the event loop: in the server's worker pool when served.

        A sync call given up on (its deadline passed, its client left) goes on running in its
        worker; the next sync tool call on this environment waits until it has returned (within
        its own deadline), so two never run on one instance."""
        pool = self.host.pool or _default_pool()
        previous = getattr(self, "_abandoned_tool_call", None)
        if previous is not None:
            # (A call from another loop, as a sync step's own loop is, cannot be waited for here.)
            if not previous.done and previous.future.get_loop() is asyncio.get_running_loop():
                await previous.when_done()
            self._abandoned_tool_call = None
        job = pool.submit(fn, *args)
        try:
            return await job.future
        except asyncio.CancelledError:
            if pool.abandon(job) and not job.done:  # started and still running on this instance
                self._abandoned_tool_call = job
            raise

    async def _after_mcp_action(self, action: Action, observation: Observation) -> Observation:
        """Runs after every ``ListToolsAction`` / ``CallToolAction``: the rubric's score becomes
        the reward and the transform is applied. Override it for bookkeeping (and call super)."""
        rubric = getattr(self, "rubric", None)
        if rubric is not None:
            score = rubric(action, observation)
            if type(score) is float:  # the common case, set without re-validating a float
                observation.__dict__["reward"] = score
                observation.__pydantic_fields_set__.add("reward")
            else:
                if inspect.isawaitable(score):
                    score = await score
                observation.reward = score
            self._report_reward_components(observation)
        return self._apply_transform(observation)

    # --- code mode ----------------------------------------------------------------------------

    @property
    def supports_code_mode(self) -> bool:
        """MCP environments run an agent's code that calls their tools (:meth:`execute_code`)."""
        return True

    def get_callables(self) -> Dict[str, Callable[..., Any]]:
        """Each tool offered right now (those of the server's mode included), by name → its function."""
        mode_tools = self._visible_mode_tools()
        callables = {
            t.name: t.fn
            for t in get_server_tools(self.mcp_server)
            if t.name not in mode_tools and t.name not in RESERVED_TOOL_NAMES and callable(getattr(t, "fn", None))
        }
        callables.update((name, tool.fn) for name, (tool, _) in mode_tools.items())
        return callables

    def execute_code(self, code: str, timeout_s: Optional[float] = None) -> Observation:
        """Run an agent's Python ``code``, which may call the tools by name, in a fresh sandbox.

        ``metadata={"result": <the code's result variable>}``, or ``{"error": <text>}`` when it
        raised (a syntax error, a failing tool, an unknown name) or ran past ``timeout_s``
        (default 30 s). The tools run here, in the environment; the code runs in the sandbox of
        :mod:`openenv.core.tools` and reaches nothing else. The environment's ``GRADER_TOOLS`` are
        not among them (see docs/roles.md). Blocks: call it from a sync ``step``.
        """
        from ..tools.code_mode import CODE_MODE_TIMEOUT_S, run_with_tools, schema_arguments_only

        described = {t.name: t for t in get_server_tools(self.mcp_server)}
        described.update((name, tool) for name, (tool, _) in self._visible_mode_tools().items())
        grader_only = frozenset(self.GRADER_TOOLS)  # the agent's code never reaches the grader's tools
        tools = {
            name: schema_arguments_only(fn, getattr(described.get(name), "parameters", None))
            for name, fn in self.get_callables().items()
            if name not in grader_only
        }
        outcome = run_with_tools(code, tools, timeout_s=timeout_s or CODE_MODE_TIMEOUT_S)
        if outcome.error is not None:
            return Observation(done=False, reward=0.0, metadata={"error": outcome.error})
        return Observation(done=False, reward=0.0, metadata={"result": outcome.result})

    # --- the Environment contract -------------------------------------------------------------

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        """Answer ``action``: a ``ListToolsAction`` with a :class:`ListToolsObservation`, a
        ``CallToolAction`` with a :class:`CallToolObservation` whose ``result`` is the tool's
        value; any other action goes to ``_step_impl``. Blocks (MCP actions run on an event loop
        of their own). It does not call :meth:`step_async`: a subclass that overrides both (to
        count steps, say) has each run once per step, as in OpenEnv 0.10."""
        if isinstance(action, (ListToolsAction, CallToolAction)) or inspect.iscoroutinefunction(self._step_impl):
            return run_async_safely(self._step_on_own_loop(action, timeout_s=timeout_s, **kwargs))
        return self._step_impl(action, timeout_s=timeout_s, **kwargs)

    async def _step_on_own_loop(self, action: Action, **kwargs: Any) -> Observation:
        # The loop ends with this call: so does any MCP client connection opened on it.
        try:
            return await self._mcp_step(action, **kwargs)
        finally:
            if self._connection is not None and self._connection[1] is asyncio.get_running_loop():
                client, self._connection = self._connection[0], None
                await client.__aexit__(None, None, None)

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        """The async :meth:`step` (what a server calls): MCP actions are answered on the running
        loop, other actions go to ``_step_impl`` (a sync one in a worker thread)."""
        return await self._mcp_step(action, timeout_s=timeout_s, **kwargs)

    async def _mcp_step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        # The one implementation behind step and step_async: neither calls the other's override.
        if isinstance(action, ListToolsAction):
            try:
                observation: Observation = ListToolsObservation(tools=await self.list_tools_async())
            except Exception as exc:
                error = error_details.describe(exc, logger, "listing MCP tools failed")
                observation = ListToolsObservation(
                    tools=[], metadata={"error": error, "error_type": "list_tools_failed"}
                )
            return await self._after_mcp_action(action, observation)
        if isinstance(action, CallToolAction):
            try:
                payload = await self.call_tool_payload(action.tool_name, action.arguments, timeout_s)
                # ``result`` is FastMCP's CallToolResult, as in OpenEnv 0.10; the wire carries the payload
                observation = CallToolObservation.of_tool_result(action.tool_name, payload, ToolCallResult(payload))
            except ToolCallFailed as failure:
                observation = CallToolObservation(tool_name=action.tool_name, error=failure.error)
            return await self._after_mcp_action(action, observation)
        impl = self._step_impl
        if inspect.iscoroutinefunction(impl):
            return await impl(action, timeout_s=timeout_s, **kwargs)
        return await asyncio.to_thread(impl, action, timeout_s=timeout_s, **kwargs)

    @abstractmethod
    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        """Handle an action that is not an MCP action."""

    def snapshot_state(self) -> Any:
        """The subclass's attributes (see the module docstring); refused while tool state lives
        in FastMCP's Context store or an abandoned tool call still runs."""
        if self._connection is not None:
            raise SnapshotUnsupportedError(
                f"Cannot snapshot {type(self).__name__}: a tool that takes FastMCP's Context has been called in "
                "this session, and what such tools keep (ctx.set_state) lives in FastMCP's session store, "
                "which a snapshot does not carry; keep the tools' state in the environment's attributes instead"
            )
        abandoned = getattr(self, "_abandoned_tool_call", None)
        if abandoned is not None and not abandoned.done:
            raise SnapshotUnsupportedError(
                f"Cannot snapshot {type(self).__name__} now: a tool call given up on (past its deadline) is still "
                "running on it and may yet change its state; try again once it has returned"
            )
        return super().snapshot_state()

    def restore_state(self, data: Any) -> None:
        """Load ``data`` (the default way); the MCP client connection this instance held, and
        with it any Context state of its tools, is dropped: the saved session had none."""
        self._drop_connection()
        super().restore_state(data)

    def close(self) -> None:
        self._drop_connection()
        self._mcp_client = None
        self.mcp_server = None  # type: ignore[assignment]


class ToolCallResult(CallToolResult):
    """FastMCP's ``CallToolResult`` of a tool call, read from the call's result (OpenEnv 0.10's
    wire shape) when asked: what ``MCPEnvironment.step(CallToolAction(...))`` puts in
    ``observation.result`` in process, as OpenEnv 0.10 does (``result.data`` is the tool's value;
    ``content``, ``structured_content``, ``meta``, ``is_error`` as FastMCP's). Nothing is built
    until read: a server only sends the result, never reads it."""

    def __init__(self, payload: Dict[str, Any]) -> None:  # (not the dataclass's: fields are read on demand)
        self._payload = payload

    @property  # type: ignore[override]
    def data(self) -> Any:
        return tool_result_value(self._payload)

    @property  # type: ignore[override]
    def structured_content(self) -> Optional[Dict[str, Any]]:
        return self._payload.get("structured_content", self._payload.get("structuredContent"))

    @property  # type: ignore[override]
    def meta(self) -> Optional[Dict[str, Any]]:
        return self._payload.get("meta", self._payload.get("_meta"))

    @property  # type: ignore[override]
    def is_error(self) -> bool:
        return bool(self._payload.get("is_error", self._payload.get("isError", False)))

    @functools.cached_property
    def content(self) -> List[Any]:  # type: ignore[override]
        return _CONTENT.validate_python(self._payload.get("content") or [])


_CONTENT: pydantic.TypeAdapter = pydantic.TypeAdapter(List[mcp.types.ContentBlock])


def get_server_tools(server: FastMCP) -> List[FastMCPTool]:
    """The tools of a FastMCP server, from sync code."""
    return list(run_async_safely(server.list_tools()))
