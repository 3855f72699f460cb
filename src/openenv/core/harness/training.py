"""The token-level training contract between a rollout and a trainer.

A :class:`TrainingTrace` is what a trainer learns from: one :class:`TrainingTurn` per model call,
each holding the exact prompt ids the engine saw, the ids it sampled, one logprob per sampled id
and a loss mask over prompt + completion. Both models are strict pydantic (no tuples, no bools
for numbers, no unknown fields) and every turn passes :func:`validate_training_turn`, so a trace
that constructs is one a trainer can use without re-checking. :class:`TraceEntry` is the looser
dict form the same data travels in (upstream's ``fetch_proxy_trace`` shape, read with ``.get``).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Literal, Optional, Sequence, Tuple

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import TypedDict

__all__ = [
    "TraceEntry",
    "TrainingTrace",
    "TrainingTurn",
    "training_turn_problems",
    "validate_training_turn",
]


class TraceEntry(TypedDict, total=False):
    """One model call as plain data; every key is optional, so read it with ``.get``.

    ``prompt_token_ids`` is the engine's own tokenisation of the prompt (never re-derived);
    ``per_token_logps`` is aligned with ``completion_token_ids``; ``loss_mask`` covers prompt +
    completion (0/1); ``reward`` mirrors ``verify()`` (``None``: unscored; capture never sets it);
    ``completion_tokens`` is upstream's string fallback (``"token_id:<n>"``), never produced here.
    """

    request: Dict[str, Any]
    response: Dict[str, Any]
    prompt_token_ids: List[int]
    completion_token_ids: List[int]
    completion_tokens: List[str]
    per_token_logps: List[float]
    loss_mask: List[int]
    reward: Optional[float]
    metadata: Dict[str, Any]


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is an int subclass; a token id or mask value is never a bool


def _bad_index(values: Sequence[Any], ok: Any) -> int:
    """The first position whose value fails ``ok``, or -1 (only run once a whole-list check failed)."""
    for i, value in enumerate(values):
        if not ok(value):
            return i
    return -1


# Whole-list checks at C speed (``map`` with builtins), so that a 40k-token turn costs
# milliseconds; the per-item scan above only runs to name the first bad position.
# ``typed``: pydantic has already checked the element types (the strict model's validator).
def _all_ids(values: List[Any], typed: bool) -> bool:
    return not values or ((typed or set(map(type, values)) == {int}) and min(values) >= 0)


def _all_finite(values: List[Any], typed: bool) -> bool:
    return (typed or set(map(type, values)) <= {int, float}) and all(map(math.isfinite, values))


def _all_bits(values: List[Any], typed: bool) -> bool:
    # list.count compares small ints by identity first: far faster than building a set
    return (typed or set(map(type, values)) <= {int}) and values.count(0) + values.count(1) == len(values)


def training_turn_problems(
    prompt_ids: Any,
    completion_ids: Any,
    logprobs: Any,
    loss_mask: Any = None,
    *,
    typed: bool = False,
    checked_prefix: int = 0,
) -> List[Tuple[str, str]]:
    """Everything that makes one turn unusable for training, as ``(code, detail)`` pairs.

    The single implementation behind :func:`validate_training_turn` (which raises) and
    ``capture.validate.check_turn`` (which reports findings). ``logprobs=None`` means the engine
    gave none; ``loss_mask=None`` skips the mask checks (ingest has no mask yet). ``typed=True``
    skips the element type checks where a strict pydantic model already made them;
    ``checked_prefix`` is how many leading prompt ids are known good (the capture proxy's turn that
    took them over from the turn before, already checked).
    """
    problems: List[Tuple[str, str]] = []
    for name, ids in (("prompt", prompt_ids), ("completion", completion_ids)):
        if not isinstance(ids, list):
            problems.append(("invalid_token_id", f"{name} ids must be a list, not {type(ids).__name__}"))
            continue
        skip = checked_prefix if name == "prompt" else 0
        rest = ids[skip:] if skip else ids
        bad = -1 if _all_ids(rest, typed) else _bad_index(rest, lambda t: _is_int(t) and t >= 0)
        if bad >= 0:
            problems.append(("invalid_token_id", f"{name} id at {skip + bad} is {rest[bad]!r}, not an integer >= 0"))
    if isinstance(prompt_ids, list) and not prompt_ids:
        problems.append(("no_prompt_ids", "the prompt has no token ids"))
    n_completion = len(completion_ids) if isinstance(completion_ids, list) else None
    if logprobs is None:
        if n_completion:
            problems.append(("no_logprobs", f"{n_completion} sampled ids but no logprobs"))
    elif not isinstance(logprobs, list):
        problems.append(("invalid_logprob", f"logprobs must be a list, not {type(logprobs).__name__}"))
    else:
        bad = (
            -1
            if _all_finite(logprobs, typed)
            else _bad_index(logprobs, lambda v: type(v) in (int, float) and math.isfinite(v))
        )
        if bad >= 0:
            problems.append(("invalid_logprob", f"logprob at {bad} is {logprobs[bad]!r}, not a finite number"))
        elif logprobs and max(logprobs) > 0:
            bad = _bad_index(logprobs, lambda v: v <= 0)
            if bad >= 0:
                problems.append(("positive_logprob", f"logprob at {bad} is {logprobs[bad]!r} > 0"))
        if n_completion is not None and len(logprobs) != n_completion:
            problems.append(
                ("logprob_misalign", f"{len(logprobs)} logprobs for {n_completion} sampled ids (one per id needed)")
            )
    if loss_mask is not None and isinstance(prompt_ids, list) and n_completion is not None:
        expected = len(prompt_ids) + n_completion
        if not isinstance(loss_mask, list):
            problems.append(("invalid_loss_mask", f"the loss mask must be a list, not {type(loss_mask).__name__}"))
        elif len(loss_mask) != expected:
            problems.append(
                ("invalid_loss_mask", f"the loss mask has {len(loss_mask)} entries; prompt + completion is {expected}")
            )
        else:
            bad = -1 if _all_bits(loss_mask, typed) else _bad_index(loss_mask, lambda m: _is_int(m) and m in (0, 1))
            if bad >= 0:
                problems.append(("invalid_loss_mask", f"loss mask at {bad} is {loss_mask[bad]!r}, not 0 or 1"))
            elif any(loss_mask[: len(prompt_ids)]):
                problems.append(("mask_over_prompt", "the loss mask has ones over the prompt (only sampled ids train)"))
    return problems


def validate_training_turn(prompt_ids: Any, completion_ids: Any, logprobs: Any, loss_mask: Any) -> None:
    """Raise ``ValueError("invalid training turn: ...")`` unless the turn is trainable as given.

    Ids are ints >= 0, the prompt is non-empty, there is one finite logprob <= 0 per completion id,
    and the mask covers prompt + completion with int 0/1, zeros over the prompt. A partial mask
    over the completion and an empty completion are allowed.
    """
    _refuse(training_turn_problems(prompt_ids, completion_ids, logprobs, [] if loss_mask is None else loss_mask))


def _refuse(problems: List[Tuple[str, str]]) -> None:
    if problems:
        raise ValueError("invalid training turn: " + "; ".join(f"{code}: {detail}" for code, detail in problems))


class TrainingTurn(BaseModel):
    """One model call, ready to train on (see :func:`validate_training_turn` for the rules)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    node_id: str = Field(min_length=1)
    prompt_token_ids: List[int]
    completion_token_ids: List[int]
    per_token_logps: List[float]
    loss_mask: List[int]
    request: Dict[str, Any] = Field(default_factory=dict)
    response: Dict[str, Any] = Field(default_factory=dict)
    metadata: Dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _trainable(self) -> TrainingTurn:
        problems = training_turn_problems(
            self.prompt_token_ids, self.completion_token_ids, self.per_token_logps, self.loss_mask, typed=True
        )
        _refuse(problems)
        return self


_ENTRY_FIELDS = ("request", "response", "prompt_token_ids", "completion_token_ids", "per_token_logps", "loss_mask")


class TrainingTrace(BaseModel):
    """A rollout's trainable turns, node ids unique; ``schema_version`` is 1."""

    model_config = ConfigDict(strict=True, extra="forbid")

    schema_version: Literal[1] = 1
    turns: List[TrainingTurn] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_nodes(self) -> TrainingTrace:
        seen: set = set()
        for turn in self.turns:
            if turn.node_id in seen:
                raise ValueError(f"duplicate node_id {turn.node_id!r}: each turn of a trace is one model call")
            seen.add(turn.node_id)
        return self

    @classmethod
    def from_entries(cls, entries: Iterable[TraceEntry]) -> TrainingTrace:
        """Build a trace from :class:`TraceEntry` dicts, taking each ``node_id`` from its metadata.

        A non-``None`` ``reward`` is kept as ``metadata["reward"]`` (turns have no reward field)
        and put back by :meth:`to_trace_entries`; ``completion_tokens`` is not carried.
        """
        turns: List[Dict[str, Any]] = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ValueError(f"trace entry {i} is a {type(entry).__name__}, not a dict")
            metadata = dict(entry.get("metadata") or {})
            node_id = metadata.pop("node_id", None)
            if not isinstance(node_id, str) or not node_id:
                raise ValueError(f"trace entry {i} has no metadata['node_id'] naming its model call")
            if entry.get("reward") is not None:
                metadata["reward"] = entry["reward"]
            turn: Dict[str, Any] = {"node_id": node_id, "metadata": metadata}
            for name in _ENTRY_FIELDS:
                if name in entry:
                    turn[name] = entry[name]
            turns.append(turn)
        return cls.model_validate({"turns": turns})

    def to_trace_entries(self) -> List[TraceEntry]:
        """The turns as :class:`TraceEntry` dicts, ``node_id`` moved into ``metadata``."""
        entries: List[TraceEntry] = []
        for turn in self.turns:
            metadata = {"node_id": turn.node_id, **turn.metadata}
            entry = TraceEntry(
                request=turn.request,
                response=turn.response,
                prompt_token_ids=list(turn.prompt_token_ids),
                completion_token_ids=list(turn.completion_token_ids),
                per_token_logps=list(turn.per_token_logps),
                loss_mask=list(turn.loss_mask),
                metadata=metadata,
            )
            if "reward" in metadata:
                entry["reward"] = metadata.pop("reward")
            entries.append(entry)
        return entries
