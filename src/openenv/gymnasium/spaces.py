"""Gymnasium spaces and their values as JSON, both ways.

:func:`describe` turns a space into a JSON description (``{"type": "Box", "low": ..., ...}``)
and :func:`from_description` builds the same space back; :func:`to_json` and :func:`from_json`
do the same for one value of a space. Box, Discrete, MultiDiscrete, MultiBinary, Text, and Dict
and Tuple of these are supported. JSON has no infinity: non-finite bounds and values travel as
the strings ``"inf"``, ``"-inf"`` and ``"nan"``. A float32 value survives the trip bit for bit
(it is sent as the double it widens to and narrowed back).
"""

from __future__ import annotations

import math
from typing import Any, Dict

import numpy as np
from gymnasium import spaces

__all__ = ["describe", "from_description", "from_json", "to_json"]


def _numbers(array: np.ndarray) -> Any:
    """Nested lists of ``array``, non-finite floats as strings."""
    data = array.tolist()
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return _finite(data)
    return data


def _finite(data: Any) -> Any:
    if isinstance(data, list):
        return [_finite(item) for item in data]
    return data if math.isfinite(data) else str(data)  # "inf", "-inf", "nan": NumPy reads them back


def _array(data: Any, dtype: Any, shape: Any = None, what: str = "value") -> np.ndarray:
    try:
        array = np.asarray(data, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} {data!r} is not an array of {np.dtype(dtype).name}: {exc}") from None
    if shape is not None and array.shape != tuple(shape):
        raise ValueError(f"{what} has shape {list(array.shape)}, expected {list(shape)}")
    return array


def describe(space: spaces.Space) -> Dict[str, Any]:
    """The JSON description of ``space`` (raises ``ValueError`` for a kind it cannot describe)."""
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "low": _numbers(space.low),
            "high": _numbers(space.high),
            "shape": list(space.shape),
            "dtype": space.dtype.name,
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": space.dtype.name,
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Text):
        return {
            "type": "Text",
            "min_length": space.min_length,
            "max_length": space.max_length,
            "charset": "".join(sorted(space.character_set)),
        }
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {key: describe(sub) for key, sub in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [describe(sub) for sub in space.spaces]}
    raise ValueError(
        f"{type(space).__name__} spaces cannot be described as JSON (supported: Box, Discrete, MultiDiscrete, "
        "MultiBinary, Text, and Dict and Tuple of them)"
    )


def from_description(description: Dict[str, Any]) -> spaces.Space:
    """The space that :func:`describe` described."""
    kind = description.get("type")
    if kind == "Box":
        dtype = np.dtype(description["dtype"])
        low = _array(description["low"], dtype, what="Box low")
        high = _array(description["high"], dtype, what="Box high")
        return spaces.Box(low=low, high=high, shape=tuple(description["shape"]), dtype=dtype)
    if kind == "Discrete":
        return spaces.Discrete(description["n"], start=description.get("start", 0))
    if kind == "MultiDiscrete":
        dtype = np.dtype(description.get("dtype", "int64"))
        return spaces.MultiDiscrete(
            np.asarray(description["nvec"], dtype=dtype),
            dtype=dtype,
            start=np.asarray(description["start"], dtype=dtype),
        )
    if kind == "MultiBinary":
        return spaces.MultiBinary(description["n"])
    if kind == "Text":
        return spaces.Text(
            description["max_length"], min_length=description["min_length"], charset=description["charset"]
        )
    if kind == "Dict":
        return spaces.Dict({key: from_description(sub) for key, sub in description["spaces"].items()})
    if kind == "Tuple":
        return spaces.Tuple([from_description(sub) for sub in description["spaces"]])
    raise ValueError(f"unknown space type {kind!r} in {description!r}")


def to_json(space: spaces.Space, value: Any) -> Any:
    """``value`` (an element of ``space``) as JSON data."""
    if isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
        return _numbers(np.asarray(value))
    if isinstance(space, spaces.Discrete):
        return int(value)
    if isinstance(space, spaces.Text):
        return str(value)
    if isinstance(space, spaces.Dict):
        return {key: to_json(sub, value[key]) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return [to_json(sub, item) for sub, item in zip(space.spaces, value, strict=True)]
    raise ValueError(f"values of {type(space).__name__} spaces cannot be sent as JSON")


def from_json(space: spaces.Space, data: Any, what: str = "value") -> Any:
    """The element of ``space`` that :func:`to_json` gave ``data`` for, typed as the space's own
    samples are (a NumPy array of its dtype, a dict, a tuple; a Python int for Discrete). Raises ``ValueError``
    naming ``what`` when ``data`` does not fit the space's shape (membership is the caller's
    check: ``value in space``)."""
    if isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
        return _array(data, space.dtype, space.shape, what)
    if isinstance(space, spaces.Discrete):
        if isinstance(data, bool) or not isinstance(data, (int, np.integer)):
            raise ValueError(f"{what} {data!r} is not an integer (the space is {space})")
        return int(data)  # as Gymnasium's own environments give them (FrozenLake, Taxi, Blackjack)
    if isinstance(space, spaces.Text):
        if not isinstance(data, str):
            raise ValueError(f"{what} {data!r} is not a string (the space is {space})")
        return data
    if isinstance(space, spaces.Dict):
        if not isinstance(data, dict) or set(data) != set(space.spaces):
            raise ValueError(f"{what} must be an object with the keys {sorted(space.spaces)}, got {data!r}")
        return {key: from_json(sub, data[key], f"{what}[{key!r}]") for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(data, (list, tuple)) or len(data) != len(space.spaces):
            raise ValueError(f"{what} must be a list of {len(space.spaces)} items, got {data!r}")
        return tuple(
            from_json(sub, item, f"{what}[{i}]") for i, (sub, item) in enumerate(zip(space.spaces, data, strict=True))
        )
    raise ValueError(f"values of {type(space).__name__} spaces cannot be read from JSON")
