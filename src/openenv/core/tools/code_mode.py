"""Code mode: an agent's Python code that calls an environment's tools, run in a sandbox.

:func:`run_with_tools` runs the code in a fresh sandboxed interpreter (the sandbox of
:mod:`.executor`: no network, no host files, its own pid namespace, limits) whose globals are one
stub per tool. A stub's call travels over the worker's pipes to this process, which calls the
real tool and sends back its value (or the exception's type name and text). So the code gets the
tools and nothing else of the environment: the server's memory, files and sockets stay out of
its reach. Values cross as JSON (a tuple comes back as a list; what JSON cannot carry, as its
``repr``).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional

from openenv.core.containers.runtime.isolation import Limits
from openenv.core.env_server.types import CodeExecResult

from .executor import TIMEOUT_EXIT_CODE, Isolation
from .repl import REPL_LIMITS, PythonREPL

CODE_MODE_TIMEOUT_S = 30.0
"""Seconds a code-mode run may take when the caller gives no ``timeout_s`` (tool calls included)."""


@dataclass
class ToolCodeResult:
    """What a code-mode run gave: the code's ``result`` variable, or the ``error`` text of what
    it raised (a failing tool, an unknown name, a timeout; a syntax error's text begins
    ``"Syntax error: "``, as upstream's does), and its output."""

    result: Any
    error: Optional[str]
    output: CodeExecResult


def _answer(tools: Mapping[str, Callable[..., Any]], call: Dict[str, Any], run: Callable[[Any], Any]) -> Dict[str, Any]:
    name, args, kwargs = call.get("call"), call.get("args"), call.get("kwargs")
    fn = tools.get(name) if isinstance(name, str) else None
    if fn is None or not isinstance(args, list) or not isinstance(kwargs, dict):  # forged by the code itself
        return {"raise": "NameError", "message": f"name {name!r} is not a tool"}
    try:
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = run(value)
        return {"return": json.loads(json.dumps(value, default=repr))}
    except Exception as exc:
        return {"raise": type(exc).__name__, "message": str(exc)}


def schema_arguments_only(fn: Callable[..., Any], parameters: Optional[Mapping[str, Any]]) -> Callable[..., Any]:
    """``fn``, refusing the arguments its MCP input schema (``parameters``) does not name: the
    parameters the server fills in itself (a FastMCP ``Context``, a dependency) are not in the
    schema, and an agent's code must not set them, by keyword or by position, any more than an
    MCP call can. Every other call goes to ``fn`` as it is (Python's own errors, as upstream's)."""
    named = set((parameters or {}).get("properties") or {})
    try:
        signature = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn
    hidden = {p.name for p in signature if p.name not in named and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if not hidden:
        return fn
    positional = [p.name for p in signature if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    shown = getattr(fn, "__qualname__", "tool")

    def call(*args: Any, **kwargs: Any) -> Any:
        for key in kwargs:
            if key in hidden:
                raise TypeError(f"{shown}() got an unexpected keyword argument {key!r}")
        if any(name in hidden for name in positional[: len(args)]):
            takes = sum(name not in hidden for name in positional)
            raise TypeError(f"{shown}() takes {takes} positional arguments but {len(args)} were given")
        return fn(*args, **kwargs)

    return call


def run_with_tools(
    code: str,
    tools: Mapping[str, Callable[..., Any]],
    *,
    timeout_s: float = CODE_MODE_TIMEOUT_S,
    limits: Optional[Limits] = None,
    isolation: Isolation = "sandbox",
    run_awaitable: Optional[Callable[[Any], Any]] = None,
) -> ToolCodeResult:
    """Run ``code`` in a fresh sandbox where each of ``tools`` (name → function) is callable.

    Blocks (call it from a worker thread). A tool returning an awaitable is resolved with
    ``run_awaitable`` (default: :func:`~openenv.core.utils.run_async_safely`).
    """
    if run_awaitable is None:
        from openenv.core.utils import run_async_safely

        run_awaitable = run_async_safely
    request = {"code": code, "tools": sorted(tools)}
    with PythonREPL(limits=limits or REPL_LIMITS, isolation=isolation) as repl:
        reply, output = repl.exchange(request, timeout_s, lambda call: _answer(tools, call, run_awaitable))
    if reply is None:
        if output.exit_code == TIMEOUT_EXIT_CODE:
            error = f"the code timed out after {timeout_s:g} s and was killed"
        else:
            error = f"the code's interpreter ended without an answer (exit code {output.exit_code})"
        return ToolCodeResult(None, error, output)
    if reply.get("exit_code") == 0:
        return ToolCodeResult(reply.get("result"), None, output)
    return ToolCodeResult(None, str(reply.get("error")), output)


__all__ = ["CODE_MODE_TIMEOUT_S", "ToolCodeResult", "run_with_tools"]
