"""Types of the clients: what they hand back to trainer code (:class:`StepResult`) and how one is
driven (:class:`Usage`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, Generic, Optional, TypeVar

ObsT = TypeVar("ObsT")


@dataclass
class StepResult(Generic[ObsT]):
    """What ``reset`` and ``step`` return: the observation, its reward and whether the episode ended."""

    observation: ObsT
    reward: Optional[float] = None
    done: bool = False
    metadata: Optional[Dict[str, Any]] = None


class Usage(str, Enum):
    """How a client is driven: decided by its first use (or ``async with`` / ``.sync()``), then
    fixed; ``EnvClient._claim`` is the one move, from UNDECIDED."""

    UNDECIDED = "undecided"
    ASYNC = "async"
    SYNC = "sync"


__all__ = ["StepResult", "Usage"]


_SNAPSHOT_MAGIC = b"OPENENV-SNAPSHOT/1\n"


@dataclass(frozen=True)
class Snapshot:
    """A session's state as a server sealed it (``EnvClient.snapshot()``): opaque, signed bytes.

    Keep it, save it (:meth:`save`, :meth:`load`), hand it to ``restore`` on a client of a server
    that holds the same key (the one that made it, the other workers of one ``--workers`` URL or
    Ray pool, or any server given the same ``OPENENV_SNAPSHOT_KEY``). A server refuses one that
    was changed, one from another key, environment or ``SNAPSHOT_VERSION``, before it loads
    anything. :attr:`info` reads what the snapshot says it is, unverified."""

    data: bytes

    def __len__(self) -> int:
        return len(self.data)

    @property
    def info(self) -> Dict[str, Any]:
        """The header: ``env`` (the environment's name), ``class``, ``version``, ``made`` (a Unix
        time), ``size`` (of its state, uncompressed). Not verified: only a server can."""
        import json
        import struct

        start = len(_SNAPSHOT_MAGIC) + 32
        if not self.data.startswith(_SNAPSHOT_MAGIC) or len(self.data) < start + 4:
            raise ValueError("not an OpenEnv snapshot")
        (length,) = struct.unpack_from(">I", self.data, start)
        header = json.loads(self.data[start + 4 : start + 4 + length])
        if not isinstance(header, dict):
            raise ValueError("not an OpenEnv snapshot")
        return header

    def save(self, path: Any) -> None:
        """Write the snapshot to the file ``path``."""
        with open(path, "wb") as file:
            file.write(self.data)

    @classmethod
    def load(cls, path: Any) -> Snapshot:
        """The snapshot :meth:`save` wrote to ``path``."""
        with open(path, "rb") as file:
            return cls(file.read())

    def __repr__(self) -> str:
        try:
            env = self.info.get("env") or self.info.get("class")
        except ValueError:
            env = "?"
        return f"Snapshot(env={env!r}, bytes={len(self.data)})"
