"""A rollout as a graph of model calls linked by exact token prefix.

Each call the proxy answers becomes a :class:`TurnNode` holding the engine's own prompt ids, the
ids it sampled and their logprobs. A turn's parent is the turn whose prompt + sampled ids
(``end_ids``) is the longest exact prefix of its prompt: the harness sent the earlier answer back
and added tool results or a user message after it. Harnesses that fork (retries, sub-agents,
summaries) make trees; each root-to-leaf path is one :class:`TrainingSequence` in which only the
sampled tokens carry loss. Without token ids (levels ``logprobs``/``text``) the same rule runs on
message lists. Turns may arrive in any order: a late ancestor adopts the turns it prefixes.

Linking is fast for long rollouts: every node's ``end_ids`` is indexed by ``(length, hash)``,
the hash chained over fixed-size blocks, so finding a parent or children hashes one block per
candidate length instead of comparing whole token lists; a hash hit is confirmed exactly.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["RolloutGraph", "TrainingSequence", "TurnNode", "system_digest"]


@dataclass
class TurnNode:
    """One model call: what the engine saw and sampled, and the chat request it came from.

    ``parent_id`` is derived by :meth:`RolloutGraph.add_turn`; ``index`` is the call's position
    in its session (set by the caller). ``sampled_logprobs`` is ``None`` when the engine gave
    none or they were rejected at ingest: the turn is then context, not trained on.
    """

    node_id: str
    prompt_ids: List[int]
    sampled_ids: List[int]
    sampled_logprobs: Optional[List[float]] = None
    parent_id: Optional[str] = None
    index: int = 0
    model: Optional[str] = None
    finish_reason: Optional[str] = None
    harness_session_id: Optional[str] = None
    system_digest: Optional[str] = None
    n_tools: int = 0
    request_messages: List[Dict[str, Any]] = field(default_factory=list)
    request_tools: Optional[List[Dict[str, Any]]] = None
    sampling_params: Dict[str, Any] = field(default_factory=dict)
    requested_sampling_params: Dict[str, Any] = field(default_factory=dict)
    response_message: Dict[str, Any] = field(default_factory=dict)

    @property
    def end_ids(self) -> List[int]:
        """Prompt + sampled ids: the token prefix a continuation of this turn starts with."""
        return self.prompt_ids + self.sampled_ids

    def context_ids(self, parent: Optional[TurnNode]) -> List[int]:
        """The prompt ids beyond ``parent.end_ids`` (tool results, user text, template tokens)."""
        if parent is None:
            return list(self.prompt_ids)
        return self.prompt_ids[len(parent.prompt_ids) + len(parent.sampled_ids) :]

    @property
    def logprobs_usable(self) -> bool:
        """Whether every sampled id has its logprob (the turn can be trained on)."""
        return self.sampled_logprobs is not None and len(self.sampled_logprobs) == len(self.sampled_ids)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-safe dict of every field (id lists copied; messages shared, not copied)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["prompt_ids"] = list(self.prompt_ids)
        data["sampled_ids"] = list(self.sampled_ids)
        if self.sampled_logprobs is not None:
            data["sampled_logprobs"] = list(self.sampled_logprobs)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnNode:
        """The node :meth:`to_dict` wrote; ``ValueError`` on missing or unknown keys."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TurnNode fields: {', '.join(unknown)}")
        missing = [name for name in ("node_id", "prompt_ids", "sampled_ids") if name not in data]
        if missing:
            raise ValueError(f"a TurnNode needs {', '.join(missing)}")
        return cls(**dict(data))


@dataclass
class TrainingSequence:
    """One root-to-leaf path as a training row.

    ``input_ids`` is the leaf's ``end_ids``; ``loss_mask`` is 1 exactly on sampled tokens whose
    turn has one logprob per id, 0 on context; ``logprobs`` is 0.0 wherever the mask is 0.
    ``prompt_len`` is the root's prompt length; ``turn_lengths`` the sampled count per turn.
    """

    input_ids: List[int]
    loss_mask: List[int]
    logprobs: List[float]
    node_ids: List[str]
    prompt_len: int
    root_id: str
    n_turns: int
    turn_lengths: List[int] = field(default_factory=list)

    @property
    def n_trainable(self) -> int:
        return sum(self.loss_mask)


# --- the prefix index ----------------------------------------------------------------------------

_BLOCK = 256


def _window(prompt: Sequence[Any], sampled: Sequence[Any], start: int, stop: int) -> Sequence[Any]:
    """``(prompt + sampled)[start:stop]`` without building the concatenation."""
    n = len(prompt)
    if stop <= n:
        return prompt[start:stop]
    if start >= n:
        return sampled[start - n : stop - n]
    return list(prompt[start:]) + list(sampled[: stop - n])


@dataclass
class _Entry:
    """A node as one index sees it: its prompt and sampled sequences and their block hashes."""

    node_id: str
    order: int
    prompt: Sequence[Any]
    sampled: Sequence[Any]
    chain: List[int]  # chain[i] identifies (prompt + sampled)[: i * _BLOCK]
    end_len: int
    end_key: int

    def key(self, length: int) -> int:
        """A hash identifying ``(prompt + sampled)[:length]``."""
        full = length // _BLOCK
        return hash((self.chain[full], tuple(_window(self.prompt, self.sampled, full * _BLOCK, length))))

    def extends(self, other: _Entry) -> bool:
        """Whether ``other``'s prompt + sampled is exactly a prefix of this prompt."""
        if other.end_len > len(self.prompt) or len(other.prompt) >= len(self.prompt):
            return False  # a parent's prompt is strictly shorter: identical prompts are siblings
        return _Entry.extends_to(self.prompt, other)

    @staticmethod
    def extends_to(prompt: Sequence[Any], other: _Entry) -> bool:
        """Whether ``prompt`` starts with ``other``'s prompt + sampled (cheap where it holds the
        same id objects: list comparison tries identity first)."""
        n = len(other.prompt)
        return prompt[:n] == other.prompt and prompt[n : other.end_len] == other.sampled


def _entry(
    node_id: str, order: int, prompt: Sequence[Any], sampled: Sequence[Any], base: Optional[_Entry] = None
) -> _Entry:
    """``base``: an entry whose end may prefix this prompt; if it does, its block hashes are reused."""
    total = len(prompt) + len(sampled)
    chain = [0]
    if base is not None and base.end_len <= len(prompt) and _Entry.extends_to(prompt, base):
        chain = list(base.chain)
    for start in range((len(chain) - 1) * _BLOCK, total - _BLOCK + 1, _BLOCK):
        chain.append(hash((chain[-1], tuple(_window(prompt, sampled, start, start + _BLOCK)))))
    entry = _Entry(node_id, order, prompt, sampled, chain, total, 0)
    entry.end_key = entry.key(total)
    return entry


class _PrefixIndex:
    """Finds, among indexed entries, the longest ``end`` that prefixes a prompt, and the reverse."""

    def __init__(self) -> None:
        self.entries: Dict[str, _Entry] = {}
        self._by_end: Dict[Tuple[int, int], List[str]] = {}
        self._lengths: List[int] = []  # distinct end lengths, ascending
        self._by_prompt_len: List[Tuple[int, int, str]] = []  # (prompt length, order, id), ascending

    def add(self, entry: _Entry) -> None:
        self.entries[entry.node_id] = entry
        self._by_end.setdefault((entry.end_len, entry.end_key), []).append(entry.node_id)
        i = bisect.bisect_left(self._lengths, entry.end_len)
        if i == len(self._lengths) or self._lengths[i] != entry.end_len:
            self._lengths.insert(i, entry.end_len)
        bisect.insort(self._by_prompt_len, (len(entry.prompt), entry.order, entry.node_id))

    def parent_of(self, child: _Entry) -> Optional[str]:
        """The entry whose end is the longest exact prefix of ``child``'s prompt (earliest on ties)."""
        limit = bisect.bisect_right(self._lengths, len(child.prompt))
        for length in reversed(self._lengths[:limit]):
            for node_id in self._by_end.get((length, child.key(length)), ()):
                if node_id != child.node_id and child.extends(self.entries[node_id]):
                    return node_id
        return None

    def adoptees(self, parent: _Entry, current_end_len: Callable[[str], float]) -> Iterator[str]:
        """Entries that ``parent`` prefixes better than their current parent does."""
        start = bisect.bisect_left(self._by_prompt_len, (parent.end_len, -1, ""))
        for _, _, node_id in self._by_prompt_len[start:]:
            if node_id == parent.node_id or current_end_len(node_id) >= parent.end_len:
                continue
            child = self.entries[node_id]
            if child.key(parent.end_len) == parent.end_key and child.extends(parent):
                yield node_id

    def prompt_key(self, node_id: str) -> Tuple[int, int]:
        entry = self.entries[node_id]
        return len(entry.prompt), entry.key(len(entry.prompt))


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return json.dumps(content, sort_keys=True, default=str)


def _message_key(message: Any) -> bytes:
    """A message's identity for linking without token ids: role, text, tool-call names and
    arguments as canonical JSON (ids, reasoning and formatting of arguments do not count)."""
    if not isinstance(message, dict):
        blob = json.dumps(message, sort_keys=True, default=str)
    else:
        calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            function = function if isinstance(function, dict) else {}
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    pass
            calls.append([function.get("name"), arguments])
        blob = json.dumps(
            [message.get("role"), _text(message.get("content")), calls], sort_keys=True, default=str, ensure_ascii=False
        )
    return hashlib.blake2b(blob.encode(), digest_size=16).digest()


_SYSTEM = ("system", "developer")


def _conversation(messages: Sequence[Any]) -> List[Any]:
    """Messages without the leading system/developer block (harnesses rewrite it freely)."""
    start = 0
    while start < len(messages) and isinstance(messages[start], dict) and messages[start].get("role") in _SYSTEM:
        start += 1
    return list(messages[start:])


def system_digest(messages: Sequence[Any]) -> Optional[str]:
    """A short hash of the leading system/developer messages' text: which conversation a turn
    belongs to, cheaply (None without such messages)."""
    system = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in _SYSTEM:
            break
        system.append(_text(message.get("content")))
    if not system:
        return None
    return hashlib.sha256("\n\n".join(system).encode()).hexdigest()[:16]


# --- the graph -----------------------------------------------------------------------------------


class RolloutGraph:
    """The turns of one rollout, linked by exact prefix (see the module docstring)."""

    def __init__(self) -> None:
        self._nodes: Dict[str, TurnNode] = {}
        self._order: Dict[str, int] = {}
        self._children: Dict[str, List[str]] = {}
        self._tokens = _PrefixIndex()
        self._messages: Optional[_PrefixIndex] = None  # built when a turn without token ids arrives
        self._latest: Optional[_Entry] = None  # the latest turn with token ids

    # -- building

    def add_turn(self, node: TurnNode) -> TurnNode:
        """Add ``node``, set its ``parent_id``, and re-parent earlier turns it prefixes better.

        Turns with prompt ids link by token prefix; turns without link by message lists. The
        result does not depend on arrival order (ties between identical ends go to the earliest).
        Raises ``ValueError`` for a node id already in the graph.
        """
        if node.node_id in self._nodes:
            raise ValueError(f"turn {node.node_id!r} is already in the rollout")
        order = len(self._nodes)
        self._nodes[node.node_id] = node
        self._order[node.node_id] = order
        self._children[node.node_id] = []
        node.parent_id = None
        indexes: List[Tuple[_PrefixIndex, bool]] = []
        if node.prompt_ids:
            self._latest = _entry(node.node_id, order, node.prompt_ids, node.sampled_ids, self._latest)
            self._tokens.add(self._latest)
            indexes.append((self._tokens, True))
        if self._messages is None and not node.prompt_ids:
            self._messages = _PrefixIndex()
            for other in self._nodes.values():
                self._messages.add(self._message_entry(other))
        elif self._messages is not None:
            self._messages.add(self._message_entry(node))
        if self._messages is not None:
            indexes.append((self._messages, False))
        own = self._tokens if node.prompt_ids else self._messages
        assert own is not None
        parent_id = own.parent_of(own.entries[node.node_id])
        if parent_id is not None:
            self._link(node.node_id, parent_id)
        for index, token_mode in indexes:
            adoptees = list(
                index.adoptees(index.entries[node.node_id], lambda c, i=index, t=token_mode: self._held(i, t, c))
            )
            for child_id in adoptees:
                self._link(child_id, node.node_id)
        return node

    def take_prefix(self, prompt_ids: Any) -> int:
        """Where ``prompt_ids`` starts with the latest token turn's prompt and sampled ids, make
        those positions hold that turn's own id objects and return how many they are (else 0).

        An agent's next call repeats everything before it, so the leading ids are already here,
        checked: they need no second check, and the rollout holds each id object once instead of
        once per later turn (a kept 20-turn rollout of 2,000-token prompts: 0.9 MiB instead of 2.2). The copies
        the engine's JSON made are freed at once, and decoding the next answer reuses their
        memory; in fresh memory it took three times as long (``bench/bench_capture.py``).
        """
        latest = self._latest
        if latest is None or not isinstance(prompt_ids, list) or len(prompt_ids) < latest.end_len:
            return 0
        n = len(latest.prompt)
        if prompt_ids[:n] != latest.prompt or prompt_ids[n : latest.end_len] != latest.sampled:
            return 0
        prompt_ids[:n] = latest.prompt
        prompt_ids[n : latest.end_len] = latest.sampled
        return latest.end_len

    def _message_entry(self, node: TurnNode) -> _Entry:
        prompt = [_message_key(m) for m in _conversation(node.request_messages)]
        return _entry(node.node_id, self._order[node.node_id], prompt, [_message_key(node.response_message)])

    def _held(self, index: _PrefixIndex, token_mode: bool, node_id: str) -> float:
        """How long a prefix ``node_id``'s current parent gives it in ``index`` (-1: a root; infinite:
        the node links in the other index, so this one may not re-parent it)."""
        node = self._nodes[node_id]
        if bool(node.prompt_ids) != token_mode:
            return math.inf
        return -1 if node.parent_id is None else index.entries[node.parent_id].end_len

    def _link(self, child_id: str, parent_id: str) -> None:
        child = self._nodes[child_id]
        if child.parent_id is not None:
            self._children[child.parent_id].remove(child_id)
        child.parent_id = parent_id
        siblings = self._children[parent_id]
        siblings.insert(bisect.bisect(siblings, self._order[child_id], key=self._order.__getitem__), child_id)

    # -- reading

    @property
    def nodes(self) -> Mapping[str, TurnNode]:
        """Every turn by id, in arrival order (read-only)."""
        return MappingProxyType(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def get(self, node_id: str) -> Optional[TurnNode]:
        return self._nodes.get(node_id)

    def _id(self, node: Union[str, TurnNode]) -> str:
        node_id = node.node_id if isinstance(node, TurnNode) else node
        if node_id not in self._nodes:
            raise KeyError(f"no turn {node_id!r} in this rollout")
        return node_id

    def children(self, node: Union[str, TurnNode]) -> List[TurnNode]:
        return [self._nodes[c] for c in self._children[self._id(node)]]

    def roots(self) -> List[TurnNode]:
        return [n for n in self._nodes.values() if n.parent_id is None]

    def leaves(self) -> List[TurnNode]:
        return [n for n in self._nodes.values() if not self._children[n.node_id]]

    def path_to(self, node: Union[str, TurnNode]) -> List[TurnNode]:
        """The turns from the root down to ``node``."""
        current: Optional[TurnNode] = self._nodes[self._id(node)]
        path: List[TurnNode] = []
        while current is not None:
            path.append(current)
            current = self._nodes[current.parent_id] if current.parent_id is not None else None
        path.reverse()
        return path

    def root_of(self, node: Union[str, TurnNode]) -> TurnNode:
        return self.path_to(node)[0]

    def paths(self) -> List[List[TurnNode]]:
        """One root-to-leaf path per leaf, leaves in arrival order."""
        return [self.path_to(leaf) for leaf in self.leaves()]

    def forks(self) -> List[TurnNode]:
        """Turns continued more than once."""
        return [n for n in self._nodes.values() if len(self._children[n.node_id]) > 1]

    def _prompt_identity(self, node: TurnNode) -> Tuple[Any, ...]:
        if node.prompt_ids:
            return ("tokens", *self._tokens.prompt_key(node.node_id))
        assert self._messages is not None
        return ("messages", *self._messages.prompt_key(node.node_id))

    def _same_prompt(self, a: TurnNode, b: TurnNode) -> bool:
        if a.prompt_ids or b.prompt_ids:
            return a.prompt_ids == b.prompt_ids
        assert self._messages is not None
        return self._messages.entries[a.node_id].prompt == self._messages.entries[b.node_id].prompt

    def discarded_nodes(self) -> List[TurnNode]:
        """Childless turns with a sibling that was continued: a retry's abandoned answer, a branch
        the harness left. Roots with identical prompts count as siblings."""
        groups: List[List[str]] = [c for c in self._children.values() if len(c) > 1]
        by_prompt: Dict[Tuple[Any, ...], List[List[str]]] = {}
        for root in self.roots():
            candidates = by_prompt.setdefault(self._prompt_identity(root), [])
            for group in candidates:  # confirm the hash: identical prompts, exactly
                if self._same_prompt(self._nodes[group[0]], root):
                    group.append(root.node_id)
                    break
            else:
                candidates.append([root.node_id])
        groups.extend(g for gs in by_prompt.values() for g in gs if len(g) > 1)
        discarded = set()
        for group in groups:
            if any(self._children[member] for member in group):
                discarded.update(member for member in group if not self._children[member])
        return [n for n in self._nodes.values() if n.node_id in discarded]

    def sequence_for(self, leaf: Union[str, TurnNode]) -> TrainingSequence:
        """The training row of the path ending at ``leaf`` (any turn, not only a leaf)."""
        path = self.path_to(leaf)
        input_ids: List[int] = []
        mask: List[int] = []
        logprobs: List[float] = []
        lengths: List[int] = []
        for node in path:
            if node.prompt_ids:
                context = node.prompt_ids[len(input_ids) :] if node.parent_id is not None else node.prompt_ids
                input_ids.extend(context)
                mask.extend([0] * len(context))
                logprobs.extend([0.0] * len(context))
            n = len(node.sampled_ids)
            input_ids.extend(node.sampled_ids)
            if node.logprobs_usable:
                mask.extend([1] * n)
                logprobs.extend(float(v) for v in node.sampled_logprobs or ())
            else:
                mask.extend([0] * n)
                logprobs.extend([0.0] * n)
            lengths.append(n)
        return TrainingSequence(
            input_ids=input_ids,
            loss_mask=mask,
            logprobs=logprobs,
            node_ids=[n.node_id for n in path],
            prompt_len=len(path[0].prompt_ids),
            root_id=path[0].node_id,
            n_turns=len(path),
            turn_lengths=lengths,
        )

    def sequences(self) -> List[TrainingSequence]:
        return [self.sequence_for(leaf) for leaf in self.leaves()]

    def stats(self) -> Dict[str, int]:
        return {
            "n_turns": len(self._nodes),
            "n_roots": len(self.roots()),
            "n_leaves": len(self.leaves()),
            "n_forks": len(self.forks()),
            "n_discarded": len(self.discarded_nodes()),
        }
