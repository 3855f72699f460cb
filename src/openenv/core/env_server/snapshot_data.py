"""Plain Python data to JSON and back, exactly: what a session snapshot holds.

:func:`encode` turns a value into a tree of JSON types; :func:`decode` builds an equal value back.
It carries what an environment's state is made of, with the types it had: ``None``, ``bool``,
``int``, ``float`` (NaN and infinities too), ``str``, ``bytes``, lists, tuples, sets, dicts with any
keys, enums, pydantic models, dataclasses and other plain objects of an importable class,
``random.Random`` (with its generator's state), NumPy arrays, scalars, dtypes and random generators, and
classes and module-level functions by name. An object reached twice is one object again after
:func:`decode` (cycles through lists, dicts and objects too).

What cannot be carried is refused with :class:`UnsavableError`, naming where it sits
(``self.proc.stdin``) and what it is: open files, sockets, locks, threads, processes, event
loops, lambdas and bound methods, generators, modules, and objects of classes that are not
importable by their name. Such a state needs its environment's own ``snapshot_state`` /
``restore_state`` (see :mod:`.interfaces`).

:func:`decode` imports the modules that the classes it names live in, and builds their objects
without calling their constructors. It is only ever given data the server itself sealed (see
:mod:`.snapshots`: the signature is checked before anything is decoded), never a client's bytes.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import importlib
import io
import logging
import math
import pathlib
import random
import re
import socket
import subprocess
import sys
import threading
import types
import uuid
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import pydantic

_SCALARS = (str, int, bool, type(None))
_REFUSED = (
    (io.IOBase, "an open file or stream"),
    (socket.socket, "a socket"),
    (subprocess.Popen, "a subprocess"),
    (threading.Thread, "a thread"),
    (types.ModuleType, "a module"),
    (types.GeneratorType, "a generator"),
    (types.CoroutineType, "a coroutine"),
    (types.AsyncGeneratorType, "an async generator"),
    (types.FrameType, "a frame"),
    (types.TracebackType, "a traceback"),
    (weakref.ref, "a weak reference"),
    (memoryview, "a memoryview"),
    (types.MethodType, "a bound method"),
)
_LOCK_TYPES = (
    type(threading.Lock()),
    type(threading.RLock()),
    threading.Condition,
    threading.Event,
    threading.Semaphore,
)


class UnsavableError(TypeError):
    """A value that a snapshot cannot carry; ``path`` says where it sits."""

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(f"{path} holds {what}, which a snapshot cannot carry")


class CorruptSnapshotError(ValueError):
    """Snapshot data that does not decode (made by another version of this module, say)."""


def class_name(cls: type) -> str:
    """``module:Qualified.Name``, by which :func:`decode` finds ``cls`` again."""
    return f"{cls.__module__}:{cls.__qualname__}"


def find_class(name: str) -> Any:
    """What :func:`class_name` (or a function's name) names."""
    module, _, qualname = name.partition(":")
    if not module or not qualname:
        raise CorruptSnapshotError(f"not a class name: {name!r}")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise CorruptSnapshotError(f"{name} is not importable here: {exc}") from None
    return found


def _importable(obj: Any) -> bool:
    qualname = getattr(obj, "__qualname__", "")
    if not qualname or "<" in qualname or getattr(obj, "__module__", None) is None:
        return False
    try:
        return find_class(f"{obj.__module__}:{qualname}") is obj
    except CorruptSnapshotError:
        return False


# --- encoding --------------------------------------------------------------------------------


class _Encoder:
    def __init__(self) -> None:
        self.seen: Dict[int, int] = {}  # id(obj) -> its reference number
        self.shared: Set[int] = set()  # ids reached more than once
        self.keep: List[Any] = []  # every object numbered stays alive (ids stay unique)
        self.building: Set[int] = set()  # tuples and frozensets being encoded (a cycle through one is refused)

    def count(self, value: Any) -> None:
        """First pass: find the objects reached more than once."""
        stack = [value]
        visited: Set[int] = set()
        while stack:
            item = stack.pop()
            if isinstance(item, _SCALARS) or isinstance(item, float):
                continue
            key = id(item)
            if key in visited:
                self.shared.add(key)
                continue
            visited.add(key)
            self.keep.append(item)
            stack.extend(_children(item))

    def encode(self, value: Any, path: str) -> Any:
        if isinstance(value, _SCALARS) and type(value) in (str, int, bool, type(None)):
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"$float": repr(value)}
        key = id(value)
        if key in self.seen:
            if key in self.building:
                raise UnsavableError(path, "a reference cycle through a tuple or frozenset")
            return {"$ref": self.seen[key]}
        number = None
        if key in self.shared:
            number = self.seen[key] = len(self.seen)
        out = self._encode_new(value, path)
        if number is not None:
            out["$id"] = number
        return out

    def encode_dict(self, value: Dict[Any, Any], path: str, attributes: bool = False) -> Dict[str, Any]:
        """A dict; ``attributes``: an object's attributes (the environment's, or those of an object
        in it), named ``path.name`` in a refusal rather than ``path['name']``."""
        return {
            "$dict": [
                [
                    self.encode(k, f"{path} (a key)"),
                    self.encode(v, f"{path}.{k}" if attributes and isinstance(k, str) else f"{path}[{k!r}]"),
                ]
                for k, v in value.items()
            ]
        }

    def _encode_new(self, value: Any, path: str) -> Dict[str, Any]:
        kind = type(value)
        if kind is list:
            return {"$list": [self.encode(item, f"{path}[{i}]") for i, item in enumerate(value)]}
        if kind is dict:
            return self.encode_dict(value, path, attributes=path == "self")
        if kind in (tuple, frozenset):
            self.building.add(id(value))
            try:
                items = [self.encode(item, f"{path}[{i}]") for i, item in enumerate(value)]
            finally:
                self.building.discard(id(value))
            return {"$tuple" if kind is tuple else "$frozenset": items}
        if kind is set:
            return {"$set": [self.encode(item, f"{path} (an element)") for item in value]}
        if kind in (bytes, bytearray):
            return {"$bytes": base64.b64encode(value).decode(), "mutable": kind is bytearray}
        if isinstance(value, type):
            if not _importable(value):
                raise UnsavableError(path, f"the class {value.__qualname__}, not importable by its name")
            return {"$class": class_name(value)}
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            if not _importable(value):
                owner = getattr(value, "__self__", None)
                if owner is not None and not isinstance(owner, types.ModuleType):
                    raise UnsavableError(path, f"the bound method {getattr(value, '__qualname__', value)!r}")
                raise UnsavableError(
                    path,
                    f"the function {getattr(value, '__qualname__', value)!r} (a lambda, a closure or a nested function)",
                )
            return {"$function": class_name(value)}  # type: ignore[arg-type]
        if isinstance(value, logging.Logger):
            return {"$logger": value.name}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            out = _encode_numpy(self, numpy, value, path)
            if out is not None:
                return out
        special = _encode_special(self, value, path)
        if special is not None:
            return special
        refused = _refusal(value)
        if refused is not None:
            raise UnsavableError(path, refused)
        cls = type(value)
        if not _importable(cls):
            raise UnsavableError(
                path, f"an object of {cls.__module__}.{cls.__qualname__}, a class not importable by its name"
            )
        if isinstance(value, enum.Enum):
            return {"$enum": class_name(cls), "name": value.name}
        if isinstance(value, pydantic.BaseModel):
            return {
                "$model": class_name(cls),
                "fields": self.encode_dict(dict(value.__dict__), path, attributes=True),
                "set": self.encode(set(value.__pydantic_fields_set__), f"{path} (fields set)"),
                "extra": self.encode(value.__pydantic_extra__, path),
                "private": self.encode(value.__pydantic_private__, path),
            }
        if isinstance(value, (list, dict, set, frozenset, tuple, bytes, str, int, float)):
            raise UnsavableError(path, f"an object of {cls.__qualname__}, a subclass of a built-in type")
        out: Dict[str, Any] = {"$object": class_name(cls)}
        if isinstance(value, random.Random):
            out["random"] = self.encode(value.getstate(), f"{path} (its generator's state)")
        elif (cls.__reduce_ex__ is not object.__reduce_ex__ or cls.__reduce__ is not object.__reduce__) and not (
            dataclasses.is_dataclass(value)
        ):
            raise UnsavableError(path, f"an object of {cls.__qualname__}, whose class saves itself its own way")
        if hasattr(value, "__dict__"):
            out["dict"] = self.encode_dict(dict(vars(value)), path, attributes=True)
        slots = _slot_values(value)
        if slots:
            out["slots"] = {name: self.encode(item, f"{path}.{name}") for name, item in slots.items()}
        return out


def _encode_special(encoder: _Encoder, value: Any, path: str) -> Optional[Dict[str, Any]]:
    """The standard library's types that keep their data their own way."""
    kind = type(value)
    if isinstance(value, tuple) and hasattr(kind, "_fields") and _importable(kind):  # a namedtuple
        return {
            "$namedtuple": class_name(kind),
            "items": [encoder.encode(v, f"{path}.{f}") for f, v in zip(kind._fields, value, strict=True)],
        }
    if kind in (collections.OrderedDict, collections.Counter, collections.defaultdict):
        out = {
            "$mapping": kind.__name__,
            "items": [
                [encoder.encode(k, f"{path} (a key)"), encoder.encode(v, f"{path}[{k!r}]")] for k, v in value.items()
            ],
        }
        if kind is collections.defaultdict:
            out["factory"] = encoder.encode(value.default_factory, f"{path}.default_factory")
        return out
    if kind is collections.deque:
        return {"$deque": [encoder.encode(v, f"{path}[{i}]") for i, v in enumerate(value)], "maxlen": value.maxlen}
    if kind in _BY_TEXT:
        return {"$text": class_name(kind), "v": _BY_TEXT[kind][0](value)}
    if isinstance(value, pathlib.PurePath) and _importable(kind):
        return {"$text": class_name(kind), "v": str(value)}
    if kind is re.Pattern:
        return {"$regex": encoder.encode(value.pattern, path), "flags": value.flags}
    return None


_BY_TEXT: Dict[type, Tuple[Callable[[Any], str], Callable[[str], Any]]] = {
    datetime.datetime: (datetime.datetime.isoformat, datetime.datetime.fromisoformat),
    datetime.date: (datetime.date.isoformat, datetime.date.fromisoformat),
    datetime.time: (datetime.time.isoformat, datetime.time.fromisoformat),
    datetime.timedelta: (
        lambda d: f"{d.days} {d.seconds} {d.microseconds}",
        lambda t: datetime.timedelta(*map(int, t.split())),
    ),
    uuid.UUID: (str, uuid.UUID),
    decimal.Decimal: (str, decimal.Decimal),
    fractions.Fraction: (str, fractions.Fraction),
    complex: (repr, complex),
}
"""Types carried as their text: how to write it, how to read it back."""


def _refusal(value: Any) -> Optional[str]:
    for kind, what in _REFUSED:
        if isinstance(value, kind):
            return what
    if isinstance(value, _LOCK_TYPES):
        return "a lock or another threading primitive"
    module = type(value).__module__ or ""
    if module.startswith(("asyncio", "concurrent.", "multiprocessing", "selectors", "_thread", "ssl", "sqlite3")):
        return f"an object of {module}.{type(value).__qualname__}"
    if not hasattr(value, "__dict__") and not _slot_names(type(value)):
        return f"a {type(value).__qualname__} (a built-in object with no data a snapshot can read)"
    return None


def _slot_names(cls: type) -> List[str]:
    names: List[str] = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        names.extend(name for name in slots if name not in ("__dict__", "__weakref__") and name not in names)
    return names


def _slot_values(value: Any) -> Dict[str, Any]:
    out = {}
    for name in _slot_names(type(value)):
        mangled = (
            f"_{type(value).__name__.lstrip('_')}{name}" if name.startswith("__") and not name.endswith("__") else name
        )
        if hasattr(value, mangled):
            out[mangled] = getattr(value, mangled)
    return out


def _children(value: Any) -> List[Any]:
    if isinstance(value, dict):
        out = [*value.keys(), *value.values()]
        if isinstance(value, collections.defaultdict):
            out.append(value.default_factory)
        return out
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        return list(value)
    if isinstance(value, pydantic.BaseModel):
        return [
            *value.__dict__.values(),
            *(value.__pydantic_extra__ or {}).values(),
            *(value.__pydantic_private__ or {}).values(),
        ]
    out: List[Any] = []
    if isinstance(value, (type, types.FunctionType, logging.Logger, bytes, bytearray, enum.Enum)):
        return out
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        return out
    if hasattr(value, "__dict__") and not isinstance(value, types.ModuleType):
        try:
            out.extend(vars(value).values())
        except TypeError:
            pass
    if not isinstance(value, type):
        out.extend(_slot_values(value).values())
    return out


def _encode_numpy(encoder: _Encoder, numpy: Any, value: Any, path: str) -> Optional[Dict[str, Any]]:
    if isinstance(value, numpy.ndarray):
        if value.dtype.hasobject:
            return {"$ndarray_objects": encoder.encode(list(value.ravel()), path), "shape": list(value.shape)}
        data = numpy.ascontiguousarray(value)
        return {
            "$ndarray": base64.b64encode(data.tobytes()).decode(),
            "dtype": value.dtype.str,
            "shape": list(value.shape),
        }
    if isinstance(value, numpy.generic):
        return {"$npscalar": base64.b64encode(numpy.asarray(value).tobytes()).decode(), "dtype": value.dtype.str}
    if isinstance(value, numpy.random.Generator):
        return {"$npgenerator": encoder.encode(value.bit_generator.state, f"{path} (its state)")}
    if isinstance(value, numpy.random.RandomState):
        return {"$nprandomstate": encoder.encode(value.get_state(legacy=False), f"{path} (its state)")}
    if isinstance(value, numpy.dtype):  # a space's dtype, say: by its description, as .npy files keep it
        return {"$npdtype": encoder.encode(numpy.lib.format.dtype_to_descr(value), f"{path} (its description)")}
    return None


def encode(value: Any, path: str = "self") -> Any:
    """``value`` as a tree of JSON types (:class:`UnsavableError` for what cannot be carried)."""
    encoder = _Encoder()
    encoder.count(value)
    return encoder.encode(value, path)


# --- decoding --------------------------------------------------------------------------------


class _Decoder:
    def __init__(self) -> None:
        self.refs: Dict[int, Any] = {}

    def decode(self, node: Any) -> Any:
        if not isinstance(node, dict):
            if isinstance(node, (str, int, float, bool)) or node is None:
                return node
            raise CorruptSnapshotError(f"unexpected {type(node).__name__} in snapshot data")
        if "$ref" in node:
            try:
                return self.refs[node["$ref"]]
            except KeyError:
                raise CorruptSnapshotError(f"reference {node['$ref']!r} to an object not yet built") from None
        number = node.get("$id")
        if "$list" in node:
            out: Any = self._keep(number, [])
            out.extend(self.decode(item) for item in node["$list"])
            return out
        if "$dict" in node:
            out = self._keep(number, {})
            for key, item in node["$dict"]:
                out[self.decode(key)] = self.decode(item)
            return out
        if "$set" in node:
            out = self._keep(number, set())
            out.update(self.decode(item) for item in node["$set"])
            return out
        if "$tuple" in node:
            return self._keep(number, tuple(self.decode(item) for item in node["$tuple"]))
        if "$frozenset" in node:
            return self._keep(number, frozenset(self.decode(item) for item in node["$frozenset"]))
        if "$float" in node:
            return float(node["$float"])
        if "$bytes" in node:
            data = base64.b64decode(node["$bytes"])
            return self._keep(number, bytearray(data) if node.get("mutable") else data)
        if "$class" in node:
            return self._keep(number, self._class(node["$class"], object))
        if "$function" in node:
            return self._keep(number, find_class(node["$function"]))
        if "$logger" in node:
            return self._keep(number, logging.getLogger(node["$logger"]))
        if "$enum" in node:
            return self._keep(number, self._class(node["$enum"], enum.Enum)[node["name"]])
        if "$model" in node:
            cls = self._class(node["$model"], pydantic.BaseModel)
            model = self._keep(number, cls.__new__(cls))
            object.__setattr__(model, "__dict__", self.decode(node["fields"]))
            object.__setattr__(model, "__pydantic_fields_set__", self.decode(node["set"]))
            object.__setattr__(model, "__pydantic_extra__", self.decode(node["extra"]))
            object.__setattr__(model, "__pydantic_private__", self.decode(node["private"]))
            return model
        if "$object" in node:
            cls = self._class(node["$object"], object)
            obj = self._keep(number, cls.__new__(cls))
            if "random" in node:
                obj.setstate(self.decode(node["random"]))
            if "dict" in node:
                vars(obj).update(self.decode(node["dict"]))
            for name, item in (node.get("slots") or {}).items():
                object.__setattr__(obj, name, self.decode(item))
            return obj
        if "$namedtuple" in node:
            cls = self._class(node["$namedtuple"], tuple)
            return self._keep(number, cls(*(self.decode(item) for item in node["items"])))
        if "$mapping" in node:
            kinds = {
                "OrderedDict": collections.OrderedDict,
                "Counter": collections.Counter,
                "defaultdict": collections.defaultdict,
            }
            out = self._keep(number, kinds[node["$mapping"]]())
            if "factory" in node:
                out.default_factory = self.decode(node["factory"])
            for key, item in node["items"]:
                out[self.decode(key)] = self.decode(item)
            return out
        if "$deque" in node:
            out = self._keep(number, collections.deque(maxlen=node["maxlen"]))
            out.extend(self.decode(item) for item in node["$deque"])
            return out
        if "$text" in node:
            cls = self._class(node["$text"], object)
            read = _BY_TEXT[cls][1] if cls in _BY_TEXT else cls
            if cls not in _BY_TEXT and not issubclass(cls, pathlib.PurePath):
                raise CorruptSnapshotError(f"{node['$text']} is not carried as text")
            return self._keep(number, read(node["v"]))
        if "$regex" in node:
            return self._keep(number, re.compile(self.decode(node["$regex"]), node["flags"]))
        for tag in ("$ndarray", "$ndarray_objects", "$npscalar", "$npgenerator", "$nprandomstate", "$npdtype"):
            if tag in node:
                return self._keep(number, self._numpy(tag, node))
        raise CorruptSnapshotError(f"unknown snapshot node with keys {sorted(node)[:5]}")

    def _keep(self, number: Optional[int], obj: Any) -> Any:
        if number is not None:
            self.refs[number] = obj
        return obj

    @staticmethod
    def _class(name: str, base: type) -> Any:
        cls = find_class(name)
        if not isinstance(cls, type) or not issubclass(cls, base):
            raise CorruptSnapshotError(f"{name} is not a {base.__name__} class")
        return cls

    def _numpy(self, tag: str, node: Dict[str, Any]) -> Any:
        import numpy

        if tag == "$ndarray":
            raw = base64.b64decode(node["$ndarray"])
            return numpy.frombuffer(raw, dtype=numpy.dtype(node["dtype"])).reshape(node["shape"]).copy()
        if tag == "$ndarray_objects":
            items = self.decode(node["$ndarray_objects"])
            out = numpy.empty(len(items), dtype=object)
            for i, item in enumerate(items):
                out[i] = item
            return out.reshape(node["shape"])
        if tag == "$npscalar":
            raw = base64.b64decode(node["$npscalar"])
            return numpy.frombuffer(raw, dtype=numpy.dtype(node["dtype"]))[0]
        if tag == "$npdtype":
            return numpy.lib.format.descr_to_dtype(self.decode(node[tag]))
        state = self.decode(node[tag])
        if tag == "$npgenerator":
            bits = getattr(numpy.random, state["bit_generator"])()
            bits.state = state
            return numpy.random.Generator(bits)
        generator = numpy.random.RandomState()
        generator.set_state(state)
        return generator


def decode(tree: Any) -> Any:
    """The value :func:`encode` made ``tree`` of (only for data the server sealed itself)."""
    try:
        return _Decoder().decode(tree)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, CorruptSnapshotError):
            raise
        raise CorruptSnapshotError(f"snapshot data does not decode: {type(exc).__name__}: {exc}") from None
