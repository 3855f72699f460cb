"""Capture sessions: one per rollout, its graph of turns, and the journal that makes it durable.

A session is what an agent's API key names. Everything the proxy learns about it — how it was
made, each answered turn, each budget stop and failed engine call — is appended to the session's
journal (``<journal_dir>/<session_id>.jsonl``, one JSON record per line) *before* the agent gets
the answer, so a proxy killed at any moment and restarted on the same directory serves the same
sessions and has every turn an agent ever received. A record cut short by the kill is the one
whose answer was never sent; loading drops it.

Appends go straight to the operating system (``os.write`` on an ``O_APPEND`` descriptor): that
survives the proxy being killed. ``fsync=True`` also survives the machine going down, for the
price of a disk flush per turn.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from openenv.core.harness.capture import _json
from openenv.core.harness.capture.graph import RolloutGraph, TurnNode
from openenv.core.harness.capture.validate import Finding

log = logging.getLogger("openenv.capture")

SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
RESERVED_METADATA = frozenset(
    {"session_id", "upstream", "capture_level", "max_model_calls", "sampling", "purpose", "eval_sampling"}
)
JOURNAL_VERSION = 1


class SessionError(ValueError):
    """A request to make a session that cannot be honoured (answered 400, or 409 for a clash)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class EngineRef:
    """Which engine serves a session: the server's own (``None`` url) or one named at creation."""

    llm_url: Optional[str] = None
    model: Optional[str] = None
    provider: str = "openai"
    auth_header: str = "Authorization"
    api_key: Optional[str] = field(default=None, repr=False)

    def public(self) -> Dict[str, Any]:
        """What may be written down or shown: never the key itself."""
        return {
            "llm_url": self.llm_url,
            "model": self.model,
            "provider": self.provider,
            "auth_header": self.auth_header,
            "has_api_key": self.api_key is not None,
        }


@dataclass
class CaptureSession:
    """One rollout's record: its settings, its turns (a :class:`RolloutGraph`) and its counters.

    ``export_session`` reads ``session_id``, ``metadata``, ``graph``, ``budget_stop_count``,
    ``capture_level``, ``rollout_type`` and ``findings``."""

    session_id: str
    capture_level: str
    rollout_type: str
    purpose: str = "auto"
    metadata: Dict[str, Any] = field(default_factory=dict)
    max_model_calls: int = 0
    sampling: Optional[Dict[str, Any]] = None
    eval_sampling: Optional[Dict[str, Any]] = None
    engine: EngineRef = field(default_factory=EngineRef)
    created: float = field(default_factory=time.time)
    graph: RolloutGraph = field(default_factory=RolloutGraph)
    findings: List[Finding] = field(default_factory=list)
    budget_stop_count: int = 0
    upstream_errors: int = 0
    model_calls: int = 0
    last_active: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    next_index: int = 0
    engine_key_lost: bool = False

    @property
    def idle_s(self) -> float:
        return round(time.monotonic() - self.last_active, 3)

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def budget_left(self) -> bool:
        return self.max_model_calls == 0 or self.model_calls < self.max_model_calls

    def config(self) -> Dict[str, Any]:
        """How the session was made, as journalled (no secrets)."""
        return {
            "session_id": self.session_id,
            "capture_level": self.capture_level,
            "rollout_type": self.rollout_type,
            "purpose": self.purpose,
            "metadata": self.metadata,
            "max_model_calls": self.max_model_calls,
            "sampling": self.sampling,
            "eval_sampling": self.eval_sampling,
            "engine": self.engine.public(),
            "created": self.created,
        }

    def summary(self) -> Dict[str, Any]:
        """One line of ``GET /sessions``."""
        return {
            **self.metadata,
            "session_id": self.session_id,
            "turns": len(self.graph.nodes),
            "roots": len(self.graph.roots()),
            "idle_s": self.idle_s,
            "upstream_errors": self.upstream_errors,
        }

    def details(self) -> Dict[str, Any]:
        """``GET /sessions/{id}``."""
        stats = self.graph.stats()
        return {
            "session_id": self.session_id,
            "idle_s": self.idle_s,
            "upstream_errors": self.upstream_errors,
            "model_calls": self.model_calls,
            "budget_stop_count": self.budget_stop_count,
            "capture_level": self.capture_level,
            "rollout_type": self.rollout_type,
            **stats,
        }


def _finding_record(finding: Finding) -> List[Any]:
    return [finding.level, finding.code, finding.detail]


def _finding_from(record: List[Any]) -> Finding:
    level, code, detail = record
    return Finding(level=level, code=code, detail=detail)


def _node_record(node: TurnNode, graph: RolloutGraph) -> Dict[str, Any]:
    """The node as journalled. A turn's prompt repeats its parent's tokens and its request the
    parent's messages; written out whole, a rollout's journal would grow with the square of its
    length, so only what is new is written, after a reference to the parent."""
    record = {name: value for name, value in vars(node).items() if name not in ("prompt_ids", "request_messages")}
    parent = graph.get(node.parent_id) if node.parent_id else None
    prompt, messages = node.prompt_ids, node.request_messages
    record["prompt_ids"] = prompt
    record["request_messages"] = messages
    if parent is not None:
        skip = len(parent.prompt_ids) + len(parent.sampled_ids)
        if (
            skip <= len(prompt)
            and prompt[: len(parent.prompt_ids)] == parent.prompt_ids
            and (prompt[len(parent.prompt_ids) : skip] == parent.sampled_ids)
        ):
            record["prompt_ids"] = {"after": parent.node_id, "ids": prompt[skip:]}
        n = len(parent.request_messages)
        if n and messages[:n] == parent.request_messages:
            record["request_messages"] = {"after": parent.node_id, "messages": messages[n:]}
    return record


def _node_from_record(record: Dict[str, Any], graph: RolloutGraph) -> TurnNode:
    data = dict(record)
    for name, key in (("prompt_ids", "ids"), ("request_messages", "messages")):
        value = data.get(name)
        if isinstance(value, dict):
            parent = graph.get(value["after"])
            if parent is None:
                raise ValueError(f"a turn refers to {value['after']!r}, which the journal does not hold")
            head = parent.end_ids if name == "prompt_ids" else parent.request_messages
            data[name] = list(head) + list(value[key])
    return TurnNode.from_dict(data)


class Journal:
    """The append-only files of a directory's sessions."""

    def __init__(self, directory: Path, *, fsync: bool = False) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.fsync = fsync

    def path(self, session_id: str) -> Path:
        return self.directory / f"{session_id}.jsonl"

    def append(self, session_id: str, record: Dict[str, Any]) -> None:
        line = _json.dumps(record) + b"\n"
        fd = os.open(self.path(session_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, session_id: str) -> None:
        try:
            self.path(session_id).unlink()
        except FileNotFoundError:
            pass

    def records(self, path: Path) -> Iterator[Dict[str, Any]]:
        """A journal's whole records; a last line cut short (the proxy was killed while writing
        it, so its answer never left) is dropped and cut off the file, so appends continue cleanly."""
        data = path.read_bytes()
        good = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                record = _json.loads(line)
            except ValueError:
                break
            good += len(line)
            yield record
        if good < len(data):
            log.warning("capture journal %s: dropped %d bytes of an unfinished record", path, len(data) - good)
            with open(path, "r+b") as handle:
                handle.truncate(good)

    def sessions(self) -> Iterator[Path]:
        return iter(sorted(self.directory.glob("*.jsonl")))


class SessionRegistry:
    """The live sessions, kept in step with their journals."""

    def __init__(self, journal: Journal, *, max_sessions: int = 10_000, ttl_s: float = 86_400.0) -> None:
        self.journal = journal
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._sessions: Dict[str, CaptureSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def get(self, session_id: str) -> Optional[CaptureSession]:
        return self._sessions.get(session_id)

    def all(self) -> List[CaptureSession]:
        return list(self._sessions.values())

    # --- making and ending -------------------------------------------------------------------

    @staticmethod
    def new_id() -> str:
        return "s" + secrets.token_hex(12)

    def add(self, session: CaptureSession) -> CaptureSession:
        """Register and journal a new session (``SessionError`` 429 past ``max_sessions``)."""
        self.expire()
        if len(self._sessions) >= self.max_sessions:
            raise SessionError(
                f"the proxy holds {len(self._sessions)} sessions, its limit (OPENENV_CAPTURE_MAX_SESSIONS);"
                " delete finished ones with DELETE /sessions/{id}",
                status=429,
            )
        self.journal.append(session.session_id, {"t": "session", "v": JOURNAL_VERSION, "config": session.config()})
        self._sessions[session.session_id] = session
        return session

    def delete(self, session_id: str) -> bool:
        session = self._sessions.pop(session_id, None)
        self.journal.remove(session_id)
        return session is not None

    def expire(self) -> int:
        """Delete sessions unused for ``ttl_s`` (none in flight); return how many."""
        if not self.ttl_s:
            return 0
        stale = [s.session_id for s in self._sessions.values() if s.in_flight == 0 and s.idle_s > self.ttl_s]
        for session_id in stale:
            self.delete(session_id)
        return len(stale)

    # --- what happens in a session, journalled first -----------------------------------------

    def record_turn(self, session: CaptureSession, node: TurnNode, findings: List[Finding]) -> None:
        """Link the turn into the session's graph and journal it (before its answer is sent)."""
        session.graph.add_turn(node)
        self.journal.append(
            session.session_id,
            {
                "t": "turn",
                "node": _node_record(node, session.graph),
                "findings": [_finding_record(f) for f in findings],
            },
        )
        session.findings.extend(findings)
        session.model_calls += 1

    def record_unrecorded_call(self, session: CaptureSession, kind: str, detail: str = "") -> None:
        """A call that reached the engine but left no turn (an error, an answer without choices)."""
        self.journal.append(session.session_id, {"t": "call", "kind": kind, "detail": detail[:500]})
        session.model_calls += 1
        session.upstream_errors += 1

    def record_budget_stop(self, session: CaptureSession, reason: str) -> None:
        self.journal.append(session.session_id, {"t": "budget_stop", "reason": reason})
        session.budget_stop_count += 1

    def record_metadata(self, session: CaptureSession, values: Dict[str, Any]) -> None:
        self.journal.append(session.session_id, {"t": "meta", "set": values})
        session.metadata.update(values)

    # --- loading after a restart -------------------------------------------------------------

    def load(self) -> int:
        """Rebuild every session journalled in the directory; return how many."""
        loaded = 0
        for path in self.journal.sessions():
            try:
                session = self._replay(path)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("capture journal %s cannot be read (%s); left as it is", path, exc)
                continue
            if session is None:
                continue
            self._sessions[session.session_id] = session
            loaded += 1
        return loaded

    def _replay(self, path: Path) -> Optional[CaptureSession]:
        session: Optional[CaptureSession] = None
        for record in self.journal.records(path):
            kind = record.get("t")
            if kind == "session":
                config = record["config"]
                engine = config.get("engine") or {}
                session = CaptureSession(
                    session_id=config["session_id"],
                    capture_level=config["capture_level"],
                    rollout_type=config["rollout_type"],
                    purpose=config.get("purpose", "auto"),
                    metadata=dict(config.get("metadata") or {}),
                    max_model_calls=int(config.get("max_model_calls") or 0),
                    sampling=config.get("sampling"),
                    eval_sampling=config.get("eval_sampling"),
                    engine=EngineRef(
                        llm_url=engine.get("llm_url"),
                        model=engine.get("model"),
                        provider=engine.get("provider", "openai"),
                        auth_header=engine.get("auth_header", "Authorization"),
                    ),
                    created=float(config.get("created") or time.time()),
                )
                # the engine's key is never journalled: its owner registers the session again
                session.engine_key_lost = bool(engine.get("has_api_key"))
            elif session is None:
                raise ValueError("the journal does not start with its session record")
            elif kind == "turn":
                node = _node_from_record(record["node"], session.graph)
                session.graph.add_turn(node)
                session.findings.extend(_finding_from(f) for f in record.get("findings", []))
                session.model_calls += 1
                session.next_index = max(session.next_index, node.index + 1)
            elif kind == "call":
                session.model_calls += 1
                session.upstream_errors += 1
            elif kind == "budget_stop":
                session.budget_stop_count += 1
            elif kind == "meta":
                session.metadata.update(record.get("set") or {})
        return session
