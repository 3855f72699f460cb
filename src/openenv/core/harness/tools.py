"""Tool names: the ones an environment may not use, and environment tools renamed around a harness's own.

An agent harness (Codex CLI, Claude Code, our own loop) often brings tools of its own (``bash``,
``read_file``); the environment's tools are offered beside them, so a name both use must change on
one side. :func:`resolve_tool_conflicts` renames the environment's copy (``env_`` + name) and says
so when even that cannot work. ``reset``, ``step``, ``state`` and ``close`` drive the episode from
outside; an agent never gets a tool by those names (:data:`RESERVED_TOOL_NAMES`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterable, List, Set, Union

if TYPE_CHECKING:  # pragma: no cover
    from openenv.core.env_server.mcp_types import Tool

__all__ = ["RESERVED_TOOL_NAMES", "resolve_tool_conflicts", "tool_name"]

RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})
"""Orchestration calls of an episode: never a tool an agent can call."""


def tool_name(tool: Any) -> str:
    """The name of a tool given as an MCP ``Tool``, a mapping with ``"name"``, or a plain string."""
    if isinstance(tool, str):
        return tool
    if isinstance(tool, dict):
        return str(tool["name"])
    return str(tool.name)


def _renamed(tool: Any, name: str) -> Any:
    """A copy of ``tool`` under ``name``; the original is left as it was."""
    if isinstance(tool, dict):
        return {**tool, "name": name}
    model_copy = getattr(tool, "model_copy", None)
    if callable(model_copy):  # pydantic (the MCP Tool of openenv.core)
        return model_copy(update={"name": name}, deep=True)
    if dataclasses.is_dataclass(tool) and not isinstance(tool, type):
        return dataclasses.replace(tool, name=name)
    raise TypeError(f"cannot rename a tool of type {type(tool).__name__}: give Tool objects or dicts")


def resolve_tool_conflicts(
    env_tools: Iterable[Tool],
    harness_builtin_tools: Iterable[Union[Tool, str]],
    prefix: str = "env_",
) -> List[Tool]:
    """The environment's tools, those whose name a harness built-in already uses renamed ``prefix + name``.

    Order is kept and the inputs are not changed (renamed tools are copies). ``ValueError`` when an
    environment tool has a reserved name (:data:`RESERVED_TOOL_NAMES`), when two environment tools
    share a name, or when the prefixed name is itself taken (by a built-in or another environment
    tool), since no rename would then leave every tool callable.
    """
    env_list = list(env_tools)
    builtin_names = {tool_name(t) for t in harness_builtin_tools}
    env_names = [tool_name(t) for t in env_list]
    reserved = sorted(set(env_names) & RESERVED_TOOL_NAMES)
    if reserved:
        raise ValueError(
            f"environment tool name(s) {', '.join(reserved)} are reserved for orchestration "
            f"({', '.join(sorted(RESERVED_TOOL_NAMES))}); rename the tool in the environment"
        )
    seen: Set[str] = set()
    for name in env_names:
        if name in seen:
            raise ValueError(f"Duplicate environment tool name: {name!r}")
        seen.add(name)
    taken = builtin_names | seen
    resolved: List[Tool] = []
    for tool, name in zip(env_list, env_names, strict=True):
        if name not in builtin_names:
            resolved.append(tool)
            continue
        new_name = prefix + name
        if new_name in taken or new_name in RESERVED_TOOL_NAMES:
            raise ValueError(
                f"environment tool {name!r} collides with a harness built-in, and {new_name!r} is taken too; "
                "choose another prefix"
            )
        taken.add(new_name)
        resolved.append(_renamed(tool, new_name))
    return resolved
