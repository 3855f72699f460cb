"""What the in-process and the server checks share: values made from JSON schemas, the seed
check's verdict, and short renderings of values for the reports."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple, Type

from .report import Status

SEED = 1234
OTHER_SEED = 4321

Progress = Callable[[str], None]
"""Called with a line saying what a long check is doing (``openenv validate`` prints it)."""


def quiet(_: str) -> None:
    """A :data:`Progress` that says nothing."""


def resolve(schema: Dict[str, Any], root: Dict[str, Any]) -> Dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return target if isinstance(target, dict) else {}
    return schema


def example(schema: Dict[str, Any], root: Dict[str, Any], depth: int = 0) -> Any:
    """The smallest value that validates against ``schema`` (required fields only)."""
    schema = resolve(schema, root)
    if depth > 8:
        return None
    if "const" in schema:
        return schema["const"]
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = [o for o in schema.get(key) or [] if resolve(o, root).get("type") != "null"]
        if options:
            return example(options[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        return {name: example(properties.get(name, {}), root, depth + 1) for name in schema.get("required") or []}
    if kind == "array":
        item = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [example(item, root, depth + 1) for _ in range(int(schema.get("minItems", 0)))]
    if kind == "string":
        return "a" * int(schema.get("minLength", 0))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        value = low + 1 if "exclusiveMinimum" in schema and "minimum" not in schema else low
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    return None


def invalid_variant(action: Dict[str, Any], schema: Dict[str, Any]) -> Tuple[Any, str]:
    """An action the server must refuse, and a description of what is wrong with it."""
    if schema.get("additionalProperties") is False:
        return {**action, "openenv_validate_unknown_field": 1}, "an action with an unknown field"
    properties = schema.get("properties") or {}
    for name in schema.get("required") or []:
        kind = (properties.get(name) or {}).get("type")
        if kind in ("string", "integer", "number", "boolean", "array"):
            return {**action, name: {"not": "valid"}}, f"an action whose {name!r} is an object, not {kind}"
    return [action], "an action that is a list, not an object"


def comparable(data: Optional[Dict[str, Any]]) -> Any:
    """What must repeat under the same seed: the observation (less its metadata), reward, done."""
    if data is None:
        return None
    observation = {k: v for k, v in (data.get("observation") or {}).items() if k != "metadata"}
    return {"observation": observation, "reward": data.get("reward"), "done": data.get("done")}


def first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if a.get(key) != b.get(key):
                return first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else str(key))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path or 'value'}: {short(a)} vs {short(b)}"


def fields(data: Dict[str, Any]) -> str:
    names = [k for k in data if k != "metadata"]
    return ", ".join(names) if names else "no fields"


def format_error(exc: BaseException) -> str:
    """The last lines of ``exc``'s traceback: where it was raised, and the exception."""
    import traceback

    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(lines).rstrip()
    return "\n".join(text.splitlines()[-12:])


def short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


Episode = Callable[[Optional[int]], Awaitable[Tuple[Any, Any]]]


async def seed_verdict(
    episode: Episode,
    failures: Tuple[Type[BaseException], ...],
    env_name: Optional[str],
    reset_accepts_seed: Optional[bool],
) -> Tuple[Status, str]:
    """Whether the same seed gives the same episode. ``episode(seed)`` resets (with ``seed``,
    None: none) and steps once, and returns the comparable parts of both answers; an exception of
    ``failures`` fails the check."""
    try:
        first = await episode(SEED)
        second = await episode(SEED)
        if first == second:
            other = await episode(OTHER_SEED)
            unseeded = [await episode(None), await episode(None)]
    except failures as exc:
        return Status.FAILED, f"a seeded reset failed: {exc}"
    if first != second:
        if first[0] != second[0]:
            which, difference = "reset", first_difference(first[0], second[0])
        else:
            which, difference = "first step after reset", first_difference(first[1], second[1])
        return Status.FAILED, _unseeded(which, difference, env_name, reset_accepts_seed)
    if other == first and all(u == first for u in unseeded):
        takes = " (its reset takes no seed)" if reset_accepts_seed is False else ""
        return Status.PASSED, (
            f"deterministic regardless of the seed{takes}: every reset and first step gave the same observations"
        )
    if other != first:
        return Status.PASSED, (
            f"seed={SEED} twice gave the same reset and first step; seed={OTHER_SEED} a different episode"
        )
    return Status.PASSED, f"seed={SEED} twice gave the same reset and first step (seed={OTHER_SEED} gave the same too)"


def _unseeded(which: str, difference: str, env_name: Optional[str], reset_accepts_seed: Optional[bool]) -> str:
    env = env_name or "the environment"
    text = (
        f"two episodes started with reset(seed={SEED}) differ at the {which} ({difference}): the environment "
        "is random but does not take its randomness from the seed, so episodes cannot be reproduced. "
    )
    if reset_accepts_seed is False:
        return text + (
            f"{env}.reset() has no `seed` parameter, so the server drops the seed before calling it: add "
            "`seed: Optional[int] = None` to reset() and draw every random choice from a generator made "
            "from it (random.Random(seed), numpy.random.default_rng(seed))"
        )
    if reset_accepts_seed:
        return text + (
            f"{env}.reset() receives the seed but does not use it for all its randomness: draw every random "
            "choice from a generator made from the seed (random.Random(seed), numpy.random.default_rng(seed)), "
            "not from the global `random` module, time or os.urandom"
        )
    return text + (
        "Make reset(seed=...) create the environment's random generator from the seed "
        "(random.Random(seed), numpy.random.default_rng(seed)) and draw every random choice from it"
    )
