"""Everything that relies on FastMCP's internals: calling its function tools directly, and reading
the names of its registered tools without an event loop.

``FastMCP.call_tool`` runs every call through provider lookup, middleware and context set-up, and
runs sync tools through AnyIO's thread pool: about 200 µs a call. For a plain function tool the
same result comes from validating the arguments against the function's signature, calling it
(sync ones in OpenEnv's worker pool, so the event loop never blocks, unless declared
``run_in_thread=False``), and letting the tool convert the return value (``tool.convert_result``).

That is done only where it is equivalent: the server has no transforms, no other providers, no
middleware but FastMCP's built-in schema dereferencing, and lax input validation; the tool is a
``FunctionTool`` without injected parameters (``Context`` and the like), per-tool timeout or
background-task support. Anything else goes through ``FastMCP.call_tool``.

What it relies on, besides FastMCP's public API: the server's ``local_provider`` (or
``_local_provider``) and its ``_components`` dict, ``_transforms``, ``providers``,
``strict_input_validation``, ``middleware`` and ``_mask_error_details``, and the wording and
``x-fastmcp-wrap-result`` shape of its results and errors (checked against ``convert_result`` for
the first value of each type). Used only on the FastMCP majors in :data:`TESTED_MAJORS` with
``OPENENV_LIBRARY_INTERNALS`` not ``0`` (:func:`tested`). Tools declared for one server mode
(``MCPEnvironment.tool(mode=...)``) are called directly either way: that needs only public
attributes of ``FunctionTool``. :func:`registered_tool_names` (for MCPEnvironment's check of
reserved names) reads ``_components`` whatever the version, and finds no names where it is not a dict.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Awaitable, Callable, Dict, List, Optional

import fastmcp as _fastmcp
import pydantic
import pydantic_core
from fastmcp.exceptions import FastMCPError
from fastmcp.tools.function_tool import FunctionTool

from ..settings import library_internals_enabled

try:  # what OpenEnv 0.10's in-process step gives; FastMCP's client may be left out of an install
    from fastmcp.client.client import CallToolResult
except ImportError:  # the same fields, for code that reads them (``result.data``)

    @dataclasses.dataclass
    class CallToolResult:  # type: ignore[no-redef]
        """FastMCP's ``CallToolResult`` (its fields), where FastMCP's client cannot be imported."""

        content: list
        structured_content: Optional[Dict[str, Any]]
        meta: Optional[Dict[str, Any]]
        data: Any = None
        is_error: bool = False


try:  # FastMCP's tests for an upstream API's 429 and timeouts (FastMCP 4: httpx and httpx2)
    from fastmcp.utilities.exceptions import get_http_status_code as _http_status_code
    from fastmcp.utilities.exceptions import is_timeout_error as _is_timeout_error
except ImportError:  # pragma: no cover - FastMCP 3 tests httpx's own exception types
    import httpx

    def _http_status_code(exc: BaseException) -> Optional[int]:
        return exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None

    def _is_timeout_error(exc: BaseException) -> bool:
        return isinstance(exc, httpx.TimeoutException)


_BENIGN_MIDDLEWARE = frozenset({"DereferenceRefsMiddleware"})

TESTED_MAJORS = (3, 4)


def tested() -> bool:
    """Whether FastMCP's internals may be read: a tested major, and ``OPENENV_LIBRARY_INTERNALS``
    not ``0``."""
    try:
        major = int(str(_fastmcp.__version__).split(".")[0])
    except ValueError:
        return False
    return major in TESTED_MAJORS and library_internals_enabled()


_TESTED = tested()


def _local_provider(server: Any) -> Any:
    return getattr(server, "local_provider", None) or getattr(server, "_local_provider", None)


def registered_tool_names(server: Any) -> List[str]:
    """The names of the tools registered on ``server``, read without an event loop (none where
    they cannot be read)."""
    components = getattr(_local_provider(server), "_components", None)
    if not isinstance(components, dict):
        return []
    return [
        key[len("tool:") :].split("@", 1)[0] for key in components if isinstance(key, str) and key.startswith("tool:")
    ]


def masks_error_details(server: Any) -> bool:
    """The server's ``mask_error_details`` (True, the safer guess, where it cannot be read)."""
    return not _TESTED or getattr(server, "_mask_error_details", False) is True


class ToolBodyError(Exception):
    """Raised by a tool's own code (as opposed to its arguments failing validation); ``original``
    is what the tool raised. FastMCP's own errors (``ToolError`` and the rest of ``FastMCPError``)
    are not wrapped: FastMCP passes them on as they are, and so do we."""

    def __init__(self, original: Exception) -> None:
        super().__init__(str(original))
        self.original = original


def body_error_message(exc: ToolBodyError, name: str, mask: bool) -> str:
    """What FastMCP says of a tool that raised ``exc.original``: its words for an upstream API's
    429 or timeout, then ``Error calling tool 'name'`` (``mask``: its ``mask_error_details``)
    with the exception's text after a colon unless masked."""
    original = exc.original
    if _http_status_code(original) == 429:
        return "Rate limited by upstream API, please retry later"
    if _is_timeout_error(original):
        return "Upstream request timed out, please retry"
    return f"Error calling tool {name!r}" if mask else f"Error calling tool {name!r}: {original}"


def _tag_body_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except FastMCPError:
                raise
            except Exception as exc:
                raise ToolBodyError(exc) from exc

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FastMCPError:
            raise
        except Exception as exc:
            raise ToolBodyError(exc) from exc

    return run


_PLAIN_TYPES = frozenset({str, int, float, bool, dict, list, type(None)})


def tool_result_payload(result: Any) -> Dict[str, Any]:
    """A FastMCP ``ToolResult`` as OpenEnv 0.10 sends it: ``content``, ``structured_content``,
    ``meta``, ``data`` (the tool's return value when it is known) and ``is_error``."""
    content = [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in result.content or ()]
    structured = getattr(result, "structured_content", None)
    meta = getattr(result, "meta", None)
    wrapped = isinstance(structured, dict) and isinstance(meta, dict) and (meta.get("fastmcp") or {}).get("wrap_result")
    return {
        "content": content,
        "structured_content": structured,
        "meta": meta,
        "data": structured.get("result") if wrapped else structured,
        "is_error": bool(getattr(result, "is_error", False)),
    }


def _plain_payload(tool: FunctionTool, value: Any) -> Optional[Dict[str, Any]]:
    """The payload of a plain JSON value, or None when only FastMCP's conversion will do."""
    if type(value) is str:
        structured: Any = value
        content = [{"type": "text", "text": value}]
    else:
        try:
            encoded = pydantic_core.to_json(value)
        except Exception:
            return None
        if b"NaN" in encoded or b"Infinity" in encoded:
            return None  # FastMCP refuses non-finite numbers: let it say so
        structured = (
            value if isinstance(value, (int, float, bool)) or value is None else pydantic_core.from_json(encoded)
        )
        content = [] if value is None else [{"type": "text", "text": encoded.decode()}]
    schema = tool.output_schema
    meta = None
    if schema is None:
        structured_content = structured if isinstance(structured, dict) else None
    elif schema.get("x-fastmcp-wrap-result"):
        structured_content = {"result": structured}
        meta = {"fastmcp": {"wrap_result": True}}
    else:
        structured_content = structured
    data = structured_content.get("result") if meta else structured_content
    return {"content": content, "structured_content": structured_content, "meta": meta, "data": data, "is_error": False}


class DirectTool:
    """One function tool, callable without FastMCP's per-call machinery."""

    __slots__ = ("inline", "is_async", "tool", "validate_and_call", "verified")

    def __init__(self, tool: FunctionTool) -> None:
        self.tool = tool
        self.is_async = inspect.iscoroutinefunction(tool.fn)
        # FastMCP's own switch: a sync tool declared run_in_thread=False is called on the loop.
        self.inline = not self.is_async and getattr(tool, "run_in_thread", True) is False
        self.verified: Dict[type, bool] = {}
        # A TypeAdapter of a function validates a dict of arguments, then calls the function.
        self.validate_and_call: Callable[[Dict[str, Any]], Any] = pydantic.TypeAdapter(
            _tag_body_errors(tool.fn)
        ).validate_python

    @staticmethod
    def supports(tool: Any) -> bool:
        if type(tool) is not FunctionTool or getattr(tool, "timeout", None) is not None:
            return False
        task_config = getattr(tool, "task_config", None)
        if task_config is not None and getattr(task_config, "mode", "forbidden") not in ("forbidden", None):
            return False
        fn = tool.fn
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            return False
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values()):
            return False
        declared = set((tool.parameters or {}).get("properties", {}))
        return set(params) == declared  # anything else is injected by FastMCP

    async def call(self, arguments: Dict[str, Any], run_sync: Callable[..., Awaitable[Any]]) -> Any:
        """What the tool function returns; sync tools run through ``run_sync(fn, arg)``. Raises
        ``pydantic.ValidationError`` for bad arguments, :class:`ToolBodyError` when the tool fails."""
        if self.is_async:
            return await self.validate_and_call(arguments)
        if self.inline:
            return self.validate_and_call(arguments)
        return await run_sync(self.validate_and_call, arguments)

    def payload(self, value: Any) -> Dict[str, Any]:
        """The result payload of a returned value, as FastMCP's ``convert_result`` would make it.
        Plain JSON values are converted directly where the first value of their type, converted
        both ways, came out the same."""
        kind = type(value)
        agrees = self.verified.get(kind)
        if agrees:
            fast = _plain_payload(self.tool, value)
            if fast is not None:
                return fast
        converted = tool_result_payload(self.tool.convert_result(value))
        if agrees is None:
            fast = _plain_payload(self.tool, value) if kind in _PLAIN_TYPES else None
            self.verified[kind] = fast is not None and fast == converted
        return converted


class DirectTools:
    """Index of a FastMCP server's direct-callable tools, kept in step with its registry."""

    __slots__ = ("_index", "_key", "server")

    def __init__(self, server: Any) -> None:
        self.server = server
        self._index: Optional[Dict[str, Optional[DirectTool]]] = None
        self._key: Any = None

    @classmethod
    def of(cls, server: Any) -> DirectTools:
        """The index of ``server``, shared by every environment built on that same server (an
        environment whose tools keep no per-session state may build its FastMCP server once)."""
        index = getattr(server, "_openenv_direct_tools", None)
        if not isinstance(index, cls) or index.server is not server:
            index = cls(server)
            try:
                server._openenv_direct_tools = index
            except AttributeError:  # a server that takes no new attributes: one index per env
                pass
        return index

    def _eligible_key(self) -> Any:
        """A cheap fingerprint of the registry, or None when the server needs its full call path."""
        if not _TESTED:
            return None
        server = self.server
        provider = _local_provider(server)
        components = getattr(provider, "_components", None)
        if (
            not isinstance(components, dict)
            or getattr(server, "_transforms", True)
            or getattr(provider, "_transforms", True)
            or len(getattr(server, "providers", ())) != 1
            or getattr(server, "strict_input_validation", False)
            or any(type(m).__name__ not in _BENIGN_MIDDLEWARE for m in getattr(server, "middleware", ()) or ())
        ):
            return None
        return (id(components), len(components))

    def cached(self, name: str) -> Optional[DirectTool]:
        """The direct tool for ``name`` if it is already indexed and the index is current."""
        if self._index is None or self._eligible_key() != self._key:
            return None
        return self._index.get(name)

    async def get(self, name: str) -> Optional[DirectTool]:
        """The direct tool for ``name``, or None when the call must go through FastMCP."""
        key = self._eligible_key()
        if key is None:
            return None
        if self._index is None or key != self._key or name not in self._index:
            tools = await self.server.list_tools()
            self._index = {t.name: (DirectTool(t) if DirectTool.supports(t) else None) for t in tools}
            self._key = key
        return self._index.get(name)
